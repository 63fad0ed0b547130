"""GPU registry: name -> total memory (what nvidia-smi reports) and torch's cuBLAS workspace size."""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from vramscope.planner.errors import PlanInputError
from vramscope.units import GIB, MAX_BYTES, MIB, parse_bytes


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


# Words in nvidia-smi's names that do not tell the memory: the vendor and product line, the form factor
# ("NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-16GB", "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 3090").
_NOISE = frozenset({"nvidia", "geforce", "tesla", "quadro", "sxm", "sxm2", "sxm3", "sxm4", "sxm5", "pcie",
                    "hbm2", "hbm2e", "hbm3", "hbm3e"})


def _key(name: str) -> str:
    """A GPU name as a lookup key: lower case, words joined by "-", nvidia-smi's extra words left out."""
    words = [w for w in re.split(r"[\s_\-]+", name.strip().lower()) if w and w not in _NOISE]
    # "A100-40G", "H100 80G": the memory written without its B, as people often do
    return "-".join(re.sub(r"^(\d+)g$", r"\1gb", w) for w in words)


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
    """Look a GPU up by name: the registry's (``RTX-4090``), an alias (``4090``) or nvidia-smi's own
    (``NVIDIA GeForce RTX 4090``, ``NVIDIA A100-SXM4-80GB``, ``Tesla T4``); case-insensitive.
    All of vramscope resolves GPU names here.

    Raises:
        PlanInputError: unknown name; the message lists the closest names.
    """
    canonical = _index().get(_key(name))
    if canonical is None:
        near = [_index()[k] for k in difflib.get_close_matches(_key(name), list(_index()), n=8, cutoff=0.4)]
        near = list(dict.fromkeys(near))[:5] or names()
        raise PlanInputError(f"unknown GPU {name!r}; closest: {', '.join(near)} (or give its memory as nvidia-smi "
                             "shows it, e.g. --gpu-memory 24564MiB)")
    entry = _load()[canonical]
    return Gpu(canonical, int(entry["memory_mib"] * MIB), int(float(entry["cublas_workspace_mib"]) * MIB))


def parse_gpu_memory(text: str) -> int:
    """A GPU's memory as people write it, in bytes: ``24GiB``, ``80GB``, ``24564MiB`` (nvidia-smi's unit).

    A number without a unit is refused: a "24 GB" card holds about 24 GiB (23.99 GiB on an RTX 4090),
    which is neither 24 bytes nor 24 GB (22.35 GiB), and nvidia-smi shows MiB; only the writer knows.

    Raises:
        PlanInputError: no unit (the message shows the readings it could mean), or unreadable.
    """
    stripped = text.strip()
    try:
        number = float(stripped) if stripped.isascii() else None  # float() also reads other scripts' digits
    except ValueError:
        number = None
    if number is not None:
        if not number > 0 or not math.isfinite(number):
            raise PlanInputError(f"GPU memory must be positive, got {text[:40]!r}")
        if number * MIB > MAX_BYTES:  # the largest reading below (MiB) stays within the bounds of a size
            raise PlanInputError(f"GPU memory {text[:40]!r} has no unit and is out of range; write it like 24GiB")
        shown = f"{number:g}"
        if number >= 2**20:  # more MiB than any GPU has (a TiB): a count of bytes, as torch's counters give
            readings = f"if it counts bytes, write {number / GIB:.4g}GiB"
        elif number >= 1024:  # a count of MiB, as nvidia-smi shows memory.total
            readings = f"nvidia-smi's unit is MiB: write {shown}MiB"
        else:
            readings = f"write {shown}GiB (binary, as nvidia-smi and torch count) or {shown}GB (10^9 bytes)"
        cards = _cards_of(round(number if number < 1024 else number * MIB / GIB))
        card = f", or name the card: --gpu {' or '.join(cards[:2])}" if cards else ""
        raise PlanInputError(f"GPU memory {text!r} has no unit; {readings}{card}")
    try:
        return parse_bytes(stripped)
    except ValueError as exc:
        raise PlanInputError(str(exc)) from None


def capacity_note(gpu: str | None, gpu_memory: int | str | None) -> str | None:
    """One line saying which capacity a plan uses and in which unit (GiB: 1024**3 bytes), or None.

    ``--gpu-memory 48GB`` is 44.70 GiB, while a "48 GB" card (an A6000) has 47.99 GiB: the note says so.
    """
    if gpu_memory is not None:
        size = parse_gpu_memory(gpu_memory) if isinstance(gpu_memory, str) else gpu_memory
        decimal = isinstance(gpu_memory, str) and re.search(r"[0-9.]\s*[kmgt]b?\s*$", gpu_memory.lower())
        if not decimal:
            return None
        note = f"GPU memory {str(gpu_memory).strip()} is {size / 1e9:g} GB = {size / GIB:.2f} GiB (1 GB = 10^9 bytes; "\
               "sizes here are GiB, 1024^3 bytes)"
        cards = _cards_of(round(size / 1e9))
        if cards:
            card = get_gpu(cards[0])
            note += (f"; a card sold as {round(size / 1e9)} GB, such as {card.name}, has "
                     f"{card.memory_bytes / GIB:.2f} GiB ({card.memory_bytes // MIB} MiB in nvidia-smi): "
                     f"--gpu {card.name}")
        return note
    if gpu is not None:
        card = get_gpu(gpu)
        note = (f"GPU {card.name}: {card.memory_bytes // MIB} MiB = {card.memory_bytes / GIB:.2f} GiB, the "
                "memory.total nvidia-smi shows (sizes here are GiB, 1024^3 bytes)")
        others = [name for name in AMBIGUOUS.get(_key(gpu), ()) if name != card.name]
        if others:
            note = (f"--gpu {gpu.strip()} is sold with more than one memory size: planned for {card.name}; "
                    f"for the other, write --gpu {' or --gpu '.join(others)}. {note}")
        return note
    return None


# Family names sold with more than one memory size: each plans as the first, and the plan says which.
AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "a100": ("A100-40GB", "A100-80GB"),
    "v100": ("V100-16GB", "V100-32GB"),
    "h100": ("H100-80GB", "H100-94GB"),
}
# Cards before Ampere have no bf16 arithmetic: a bf16 run there is emulated or refused; people train in fp16.
NO_BF16 = frozenset({"T4", "V100-16GB", "V100-32GB"})


def supports_bf16(gpu: str) -> bool:
    """Whether the card computes in bf16 (Ampere and newer)."""
    return get_gpu(gpu).name not in NO_BF16


def _cards_of(marketed: int) -> list[str]:
    """Registry GPUs sold as this many GB (which, for GPU memory, is about as many GiB), most memory first."""
    cards = [(entry["memory_mib"], name) for name, entry in _load().items()
             if round(entry["memory_mib"] * MIB / GIB) == marketed or f"{marketed}gb" in name.lower()]
    return [name for _, name in sorted(cards, reverse=True)]
