"""GPU registry: name -> total memory (what nvidia-smi reports) and torch's cuBLAS workspace size."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from vramscope.planner.errors import PlanInputError

MIB = 1024**2


@dataclass(frozen=True)
class Gpu:
    """A GPU model as the planner sees it."""

    name: str
    memory_bytes: int
    cublas_workspace_bytes: int


@lru_cache(maxsize=1)
def _load() -> dict[str, dict[str, Any]]:
    text = resources.files("vramscope.planner").joinpath("gpus.json").read_text(encoding="utf-8")
    gpus: dict[str, dict[str, Any]] = json.loads(text)["gpus"]
    return gpus


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "-").replace("_", "-")


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, entry in _load().items():
        index[_key(name)] = name
        for alias in entry.get("aliases", ()):
            index.setdefault(_key(str(alias)), name)
    return index


def names() -> list[str]:
    """GPU names the registry knows."""
    return list(_load())


def get_gpu(name: str) -> Gpu:
    """Look a GPU up by name (case-insensitive; aliases such as ``4090`` accepted).

    Raises:
        PlanInputError: unknown name; the message lists the closest names.
    """
    canonical = _index().get(_key(name))
    if canonical is None:
        near = [_index()[k] for k in difflib.get_close_matches(_key(name), list(_index()), n=8, cutoff=0.4)]
        near = list(dict.fromkeys(near))[:5] or names()
        raise PlanInputError(f"unknown GPU {name!r}; closest: {', '.join(near)} (or give --gpu-memory 24GiB)")
    entry = _load()[canonical]
    return Gpu(canonical, int(entry["memory_mib"] * MIB), int(float(entry["cublas_workspace_mib"]) * MIB))
