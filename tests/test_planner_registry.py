"""The model registry: names the H200 grid uses, case-insensitive lookup, configs transformers accepts."""

from __future__ import annotations

import importlib.util

import pytest

from vramscope.planner import registry
from vramscope.planner.errors import UnknownModelError

GRID = ["TinyLlama-1.1B", "Llama-2-7B", "Mistral-7B", "Llama-3-8B", "Qwen2.5-1.5B"]


def test_grid_names_exist_exactly() -> None:
    assert set(GRID) <= set(registry.names())


def test_issue_models_are_registered() -> None:
    wanted = ["LLaMA-7B", "LLaMA-13B", "LLaMA-33B", "LLaMA-65B", "Llama-2-13B", "Llama-2-70B", "Llama-3-70B",
              "Llama-3.1-8B", "Llama-3.1-70B", "Mixtral-8x7B", "Qwen2.5-0.5B", "Qwen2.5-72B", "Gemma-2-2B",
              "Gemma-2-9B", "Gemma-2-27B", "Phi-3-mini", "Phi-3-medium", "Falcon-7B", "Falcon-40B", "Pythia-12B"]
    assert set(wanted) <= set(registry.names())


def test_lookup_is_case_insensitive_and_returns_a_copy() -> None:
    cfg = registry.get_config("llama-3-8b")
    assert cfg["vocab_size"] == 128256 and cfg["num_key_value_heads"] == 8
    cfg["vocab_size"] = 1
    assert registry.get_config("LLAMA-3-8B")["vocab_size"] == 128256


def test_unknown_name_lists_closest() -> None:
    with pytest.raises(UnknownModelError, match=r"closest: .*Llama-2-7B"):
        registry.get_config("llama2-7b")


def test_tied_embeddings_and_moe_fields() -> None:
    assert registry.get_config("Qwen2.5-1.5B")["tie_word_embeddings"] is True
    mixtral = registry.get_config("Mixtral-8x7B")
    assert mixtral["num_local_experts"] == 8 and mixtral["num_experts_per_tok"] == 2


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("name", GRID)
def test_transformers_builds_the_config(name: str) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(**registry.get_config(name))
    want = registry.get_config(name)
    assert cfg.model_type == want["model_type"]
    assert cfg.hidden_size == want["hidden_size"] and cfg.vocab_size == want["vocab_size"]
    assert cfg.num_key_value_heads == want["num_key_value_heads"]
