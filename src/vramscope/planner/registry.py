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
    """Lower-cased name, alias or hub id (with and without its org) -> canonical name (case-insensitive)."""
    index: dict[str, str] = {}
    for name in _load():
        index[name.lower()] = name
    for name, entry in _load().items():  # after every name: an alias never hides another entry's name
        hub_id = str(entry.get("source", "")).lower()
        for alias in (*entry.get("aliases", ()), hub_id, hub_id.rpartition("/")[2]):
            if alias:
                index.setdefault(str(alias).lower(), name)
    return index


# Hub ids of fine-tuned variants share the base model's architecture (and so its memory):
# "Qwen/Qwen2.5-7B-Instruct" is planned as Qwen2.5-7B.
_VARIANT_SUFFIXES = ("-hf", "-chat", "-instruct", "-it", "-base")


def _lookup(name: str) -> str | None:
    """The canonical name for a registry name, alias or hub id as people paste them, or None."""
    index = _index()
    key = name.strip().lower()
    tail = key.rpartition("/")[2]  # "meta-llama/Llama-2-7b-hf" or "Llama-2-7b-hf"
    for candidate in (key, tail):
        if candidate in index:
            return index[candidate]
    stem = tail
    while True:
        cut = next((s for s in _VARIANT_SUFFIXES if stem.endswith(s) and len(stem) > len(s)), None)
        if cut is None:
            break
        stem = stem[: -len(cut)]
        if stem in index:
            return index[stem]
    # The variant word in the middle: "Mistral-7B-Instruct-v0.2" is Mistral-7B-v0.2's architecture.
    words = [w for w in tail.split("-") if f"-{w}" not in _VARIANT_SUFFIXES]
    joined = "-".join(words)
    return index.get(joined) if words and joined != tail else None


# A size alone ("--model 7B") plans a representative model of that size: the most fine-tuned architecture of it.
REPRESENTATIVE: dict[str, str] = {
    "1b": "Llama-3.2-1B", "3b": "Llama-3.2-3B", "7b": "Llama-2-7B", "8b": "Llama-3.1-8B", "9b": "Gemma-2-9B",
    "12b": "Mistral-Nemo-12B", "13b": "Llama-2-13B", "14b": "Qwen2.5-14B", "27b": "Gemma-2-27B",
    "32b": "Qwen2.5-32B", "33b": "LLaMA-33B", "65b": "LLaMA-65B", "70b": "Llama-3.1-70B", "72b": "Qwen2.5-72B",
}


def representative(name: str) -> str | None:
    """The registry model planned for a bare size (``7B``, ``70b``), or None when ``name`` is not one."""
    return REPRESENTATIVE.get(name.strip().lower())


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
    """The canonical registry name for ``name``: a registry name, an alias or a Hugging Face hub id.

    Case-insensitive, with or without the org (``meta-llama/Llama-2-7b-hf``, ``Llama-2-7b-hf``,
    ``qwen/qwen2.5-0.5b``); a chat or instruct variant's id gives its base model (same architecture).
    Every name ``plan --list-models`` prints is accepted. All of vramscope resolves model names here.

    Raises:
        UnknownModelError: the name is not in the registry; the message lists the closest names.
    """
    canonical = _lookup(name) or representative(name)
    if canonical is None:
        near = closest(name.strip().rpartition("/")[2])
        hint = f"closest: {', '.join(near)}" if near else f"known: {', '.join(names())}"
        raise UnknownModelError(
            f"unknown model {name!r}; {hint} (or pass --config PATH/config.json for any Hugging Face model; "
            "a hub id whose config.json is in the local Hugging Face cache plans as it is)"
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
