"""The model registry: architectures by name, stored as their Hugging Face config.json fields.

The data lives in ``models.json`` beside this module (shipped as package data), so adding a model is
an edit to a data file, not to code. Every entry's ``config`` is accepted by
``transformers.AutoConfig.for_model(**config)``, which is what the H200 measurement harness does to
build random-weight checkpoints of exactly the shapes the planner predicts for.
"""

from __future__ import annotations

import copy
import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from vramscope.planner.errors import UnknownModelError

_DATA = "models.json"


@lru_cache(maxsize=1)
def _load() -> dict[str, dict[str, Any]]:
    text = resources.files("vramscope.planner").joinpath(_DATA).read_text(encoding="utf-8")
    models: dict[str, dict[str, Any]] = json.loads(text)["models"]
    return models


@lru_cache(maxsize=1)
def _index() -> dict[str, str]:
    """Lower-cased name or alias -> canonical name (lookups are case-insensitive)."""
    index: dict[str, str] = {}
    for name, entry in _load().items():
        index[name.lower()] = name
        for alias in entry.get("aliases", ()):
            index.setdefault(str(alias).lower(), name)
    return index


def names() -> list[str]:
    """The canonical names in the registry, in the data file's order."""
    return list(_load())


def closest(name: str, n: int = 5) -> list[str]:
    """Registry names that look most like ``name`` (for 'did you mean' messages), best first."""
    index = _index()
    query = name.strip().lower()
    hits = difflib.get_close_matches(query, list(index), n=n * 2, cutoff=0.4)
    # Substring matches ("llama-2" -> every Llama-2) rank after fuzzy ones but are often what was meant.
    hits += [key for key in index if query and query in key and key not in hits]
    out: list[str] = []
    for key in hits:
        canonical = index[key]
        if canonical not in out:
            out.append(canonical)
    return out[:n]


def resolve(name: str) -> str:
    """The canonical registry name for ``name`` (case-insensitive; aliases accepted).

    Raises:
        UnknownModelError: the name is not in the registry; the message lists the closest names.
    """
    canonical = _index().get(name.strip().lower())
    if canonical is None:
        near = closest(name)
        hint = f"closest: {', '.join(near)}" if near else f"known: {', '.join(names())}"
        raise UnknownModelError(
            f"unknown model {name!r}; {hint} (or pass --config PATH/config.json for any Hugging Face model)"
        )
    return canonical


def get_config(name: str) -> dict[str, Any]:
    """The config.json fields of a registry model, as a fresh dict.

    The dict includes ``model_type``, so ``transformers.AutoConfig.for_model(**get_config(name))``
    builds the architecture.

    Raises:
        UnknownModelError: the name is not in the registry.
    """
    return copy.deepcopy(_load()[resolve(name)]["config"])


def source(name: str) -> str:
    """The Hugging Face hub repository the registry entry's fields come from."""
    return str(_load()[resolve(name)]["source"])
