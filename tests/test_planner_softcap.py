"""Gemma-2's soft-capping in the analytic plan (planner/layer.py, planner/memory.py), from transformers'
modeling_gemma2.py: ``eager_attention_forward`` caps every layer's scores as ``tanh(s / cap) * cap`` and
``Gemma2ForCausalLM.forward`` the logits the same way; ``tanh`` saves its output for backward, the division and
the multiplication by a constant save nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from vramscope.planner import plan, resolve_model
from vramscope.planner.memory import estimate
from vramscope.recipe import QLoraSpec


def _uncapped(attn: bool, final: bool) -> Any:
    shape = resolve_model("Gemma-2-9B")[1]
    assert shape.attn_softcap and shape.logit_softcap  # its config.json: 50.0 and 30.0
    return dataclasses.replace(shape, attn_softcap=attn, logit_softcap=final)


def test_gemma2_9b_keeps_one_more_scores_tensor_per_layer_and_the_logits_twice() -> None:
    spec = QLoraSpec(attn="eager", gradient_checkpointing=False)  # HF Trainer recipe: bf16 autocast
    B, S = 1, 2048
    plain = estimate(_uncapped(False, False), spec, B, S)
    attn = estimate(_uncapped(True, False), spec, B, S)
    both = estimate(_uncapped(True, True), spec, B, S)
    shape = _uncapped(True, True)
    # attention: tanh's output, [1, 16, 2048, 2048] in bf16 (autocast leaves tanh in half), in each of the 42
    # layers kept for backward: 128 MiB a layer, 5.25 GiB at the end of the forward
    per_layer = 2 * B * shape.heads * S * S
    assert attn.per_layer_activation_bytes - plain.per_layer_activation_bytes == per_layer == 128 * 2**20
    assert attn.phases["forward"] - plain.phases["forward"] == shape.layers * per_layer
    # the final soft-cap: tanh's bf16 output [2048, 256000] beside the capped logits the loss reads (1000 MiB)
    assert both.phases["forward"] - attn.phases["forward"] == 2 * B * S * shape.vocab
    assert both.phases["loss backward"] - attn.phases["loss backward"] == 2 * B * S * shape.vocab
    # as `vramscope plan` gives it: 67.43 GiB (the trace of the real model holds 67.37, docs/planner.md)
    assert both.peak_allocated_bytes == plan("Gemma-2-9B", B, S, spec).peak_allocated_bytes
    assert abs(both.peak_allocated_bytes / 2**30 - 67.43) < 0.01


def test_softcapping_costs_nothing_outside_eager_attention_and_full_logits() -> None:
    shape = _uncapped(True, True)
    # flash-attention caps inside its kernel; TRL's fused head caps inside its tiles
    for spec in (QLoraSpec(attn="flash_attention_2"), QLoraSpec(framework="trl", attn="eager")):
        with_cap = estimate(shape, spec, 1, 1024)
        attn_only = estimate(dataclasses.replace(shape, logit_softcap=False), spec, 1, 1024)
        if spec.attn == "flash_attention_2":
            none = estimate(_uncapped(False, True), spec, 1, 1024)
            assert with_cap.per_layer_activation_bytes == none.per_layer_activation_bytes
        else:
            assert with_cap.phases == attn_only.phases


TINY: dict[str, Any] = {"model_type": "gemma2", "hidden_size": 256, "intermediate_size": 512,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "vocab_size": 2048, "max_position_embeddings": 1024, "head_dim": 64,
                        "sliding_window": 512, "query_pre_attn_scalar": 64}


@pytest.mark.slow  # a traced step per cap
def test_a_traced_tiny_gemma2_grows_by_what_the_analytic_plan_adds_for_each_cap() -> None:
    pytest.importorskip("bitsandbytes")
    from vramscope.planner.trace.engine import trace_plan

    spec = QLoraSpec(framework="hf", gradient_checkpointing=False, lora_r=8)
    caps = {"capped": (50.0, 30.0), "attention only": (50.0, None), "none": (None, None)}
    traced, analytic = {}, {}
    for name, (attn, final) in caps.items():
        config = {**TINY, "attn_logit_softcapping": attn, "final_logit_softcapping": final}
        t = trace_plan(config, 2, 256, spec)  # the real transformers model on fake tensors, its own eager attention
        assert t.spec.attn == "eager"
        traced[name] = t.traced_peak_bytes
        analytic[name] = plan(config, 2, 256, t.spec).peak_allocated_bytes
    for more, less in (("attention only", "none"), ("capped", "attention only")):
        grew_traced, grew_analytic = traced[more] - traced[less], analytic[more] - analytic[less]
        assert grew_analytic > 0
        # 2 MiB each here (2 layers x [2, 4, 256, 256] bf16; [512, 2048] bf16 logits); agree within 0.1%
        assert abs(grew_traced - grew_analytic) <= 0.001 * grew_analytic, (more, grew_traced, grew_analytic)
