"""The evaluation beside the training step's allocator pool (planner/pool.py): which of its wider tensors the
blocks the step left cached hold, and which open segments of their own. The figures are the H200's (issue 28,
bench/results/whole-run/logs-call*.tar.gz: reserved after the first evaluation minus reserved before it)."""

from __future__ import annotations

from typing import Any

import pytest

from vramscope.planner import resolve_model
from vramscope.planner.phases import RunPhases, plan_run
from vramscope.planner.pool import eval_loop_segments, new_segments, segment_bytes
from vramscope.recipe import QLoraSpec
from vramscope.units import MIB

# config.json fields of the three architectures as the probe read them inside the runs
LLAMA31_8B: dict[str, Any] = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False}
QWEN25_7B: dict[str, Any] = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                             "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                             "vocab_size": 152064, "max_position_embeddings": 131072, "tie_word_embeddings": False,
                             "sliding_window": 131072, "use_sliding_window": False}
PHI3_MINI: dict[str, Any] = {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                             "vocab_size": 32064, "max_position_embeddings": 4096, "tie_word_embeddings": False,
                             "sliding_window": 2047}
TRL = QLoraSpec(framework="trl", lora_r=16, lora_alpha=32, lora_dropout=0.05, lora_targets=("q_proj", "v_proj"),
                optim="adamw_torch", gradient_checkpointing=True)
HF = QLoraSpec(framework="hf", lora_r=64, lora_dropout=0.05, gradient_checkpointing=True)


def _growth(config: dict[str, Any], spec: QLoraSpec, batch: int, seq: int, run: RunPhases) -> int:
    p = plan_run(resolve_model(config)[1], spec, batch, seq, run=run)
    return p.phases["eval"].peak_reserved_bytes - p.phases["train"].peak_reserved_bytes


def test_best_fit_takes_the_smallest_block_that_holds_a_tensor_and_opens_a_segment_otherwise() -> None:
    pool = [128 * MIB, 112 * MIB]
    assert new_segments(pool, [[112 * MIB, 112 * MIB]]) == 0  # 112 -> 112, 112 -> 128
    assert new_segments(pool, [[112 * MIB] * 3]) == 112 * MIB
    # a segment opened in one moment is cached for the next: the second moment needs nothing new
    assert new_segments(pool, [[256 * MIB], [200 * MIB]]) == 256 * MIB
    assert new_segments([], [[5 * MIB]]) == 0  # small requests: the small pool, not counted
    assert segment_bytes(11 * MIB + 1) == 12 * MIB


def test_logits_kept_for_compute_metrics_are_concatenated_into_ever_larger_segments() -> None:
    block = 1002 * MIB
    # the step's loss needs two fp32 blocks; one fits the pool, one is new (HF Llama-3.1-8B, 4 x 512 eval)
    loss = [[block, block]]
    # 4 eval batches: 1 for the loss, 1 more for the returned logits held by the container, then the
    # concatenations of 2, 3 and 4 batches: 11 blocks in all (the H200: +11022 MiB)
    assert eval_loop_segments([block], loss, block, 4) == 11 * block
    assert eval_loop_segments([block], loss, 0, 4) == block  # loss only: every step is the same
    # moved to the host every 2 batches: the 2-batch container is the largest segment ever needed
    assert eval_loop_segments([block], loss, block, 100, accumulate_every=2) < eval_loop_segments(
        [block], loss, block, 4)
    # a long eval set without host moves: the k-th concatenation opens k batches while the GPU has room; past
    # the replayed steps the allocator's release of its cached blocks bounds reserved, not their sum
    assert eval_loop_segments([block], loss, block, 8) == eval_loop_segments([block], loss, block, 7) + 8 * block
    assert eval_loop_segments([block], loss, block, 10**6) == eval_loop_segments([block], loss, block, 8)


@pytest.mark.parametrize(("config", "spec", "measured_mib"), [
    # TRL's fused head: the [4096, 32768] bf16 tile is twice the step's (2 x 1024 rows); Llama's [4096, 14336]
    # MLP intermediates fit the step's dequantized-weight blocks, so the tile is all (H200: +256 MiB)
    (LLAMA31_8B, TRL, 256),
    # Qwen2.5's [4096, 18944] intermediates (148 MiB) exceed every block of the step: act(gate), up and their
    # product open three, plus the tile (H200: +700 MiB)
    (QWEN25_7B, TRL, 700),
    # Phi-3's LoRA'd fused gate_up: the base result's clone, the adapter's output and their sum (128 MiB each)
    # beside one tile-sized block of the step: two new, plus the tile (H200: +512 MiB)
    (PHI3_MINI, TRL.with_(lora_targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj")), 512),
])
def test_trls_wider_evaluation_opens_the_segments_the_h200_reserved(config: dict[str, Any], spec: QLoraSpec,
                                                                    measured_mib: int) -> None:
    growth = _growth(config, spec, 2, 1024, RunPhases(eval_batch=4, eval_examples=8))
    assert growth == measured_mib * MIB


def test_hf_argmax_eval_finds_one_fp32_block_in_autocasts_half_lm_head() -> None:
    # HF recipe (fp32 lm_head under bf16 autocast), 2 x 512 step, 4 x 512 eval: the loss's fp32 upcast of the
    # [2048, 128256] logits (1002 MiB) fits the block the step's half copy of lm_head ([128256, 4096] bf16)
    # left; its log-softmax opens the one segment (H200: +1002 MiB; the plan before said two)
    run = RunPhases(eval_batch=4, eval_examples=16, eval_logits="argmax")
    assert _growth(LLAMA31_8B, HF, 2, 512, run) == segment_bytes(4 * 2048 * 128256)


def test_an_evaluation_no_wider_than_the_step_fits_its_pool() -> None:
    for config, spec in ((LLAMA31_8B, TRL), (QWEN25_7B, TRL), (LLAMA31_8B, HF)):
        assert _growth(config, spec, 4, 1024, RunPhases(eval_batch=4)) == 0


MIXTRAL_2L: dict[str, Any] = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                              "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
                              "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                              "max_position_embeddings": 32768, "tie_word_embeddings": False}


def test_adapted_experts_leave_their_merged_stacks_and_gradients_cached() -> None:
    # HF recipe on Mixtral-8x7B-2L with all-linear (peft's ParamWrapper on the fused experts, dropout 0): after a
    # step the H200's pool held two free 3584 MiB blocks (the fp32 merged gate_up stack, opened in the forward,
    # and its gradient, opened in backward) and two of 1792 MiB (down's); bench/results/whole-run/
    # segments-2026-12-02/hf-evalloss-Mixtral-8x7B-2L/segments-after-step2.json
    from vramscope.planner.frameworks import framework_for, precision
    from vramscope.planner.pool import train_blocks

    spec = HF.with_(lora_dropout=0.0, lora_targets=("all-linear",))
    shape = resolve_model(MIXTRAL_2L)[1]
    fw = framework_for(spec)
    blocks = train_blocks(shape, spec, fw, precision(spec, fw), 2, 1024)
    assert blocks.count(3584 * MIB) == 2 and blocks.count(1792 * MIB) == 2


def test_an_evaluation_finds_room_in_the_merged_expert_blocks() -> None:
    # the 4 x 1024 loss-only evaluation beside the 2 x 1024 step: its fp32 loss pair ([4096, 32000], 500 MiB each)
    # and the no-grad forward's merged stacks take the cached merged blocks (H200: reserved 24772 MiB before the
    # evaluation, 24774 after; the plan before said +1000 MiB)
    spec = HF.with_(lora_dropout=0.0, lora_targets=("all-linear",))
    assert _growth(MIXTRAL_2L, spec, 2, 1024, RunPhases(eval_batch=4, eval_examples=8)) == 0


@pytest.mark.parametrize(("spec", "measured"), [
    # the H200's process memory over the training steps (bench/results/whole-run/points.json, 2026-12-01/02)
    (HF.with_(lora_dropout=0.0, lora_targets=("all-linear",)), 26774339584),
    (TRL.with_(lora_dropout=0.0, lora_targets=("all-linear",)), 14541651968),
])
def test_merged_expert_blocks_are_not_scaled_as_fragmented_activations(spec: QLoraSpec, measured: int) -> None:
    # The frameworks' fragmentation factors were fitted on activations; applied to the merged expert stacks too
    # (they are among a layer's saved tensors) they put the HF run's process at +30 %. As exact-fit blocks they
    # add only those of them free at the backward's fullest moment (layer.merged_expert_pool).
    # The holes the upcast of the bf16 expert stacks leaves in the loading segment take the activations'
    # fragments (memory.expert_upcast_holes): the HF run went from +8.0 % to +1.0 %; TRL does not upcast.
    p = plan_run(resolve_model(MIXTRAL_2L)[1], spec, 2, 1024, run=RunPhases())
    assert abs(p.phases["train"].process_bytes / measured - 1) < 0.025


def test_the_expert_upcast_leaves_one_down_proj_a_layer_free_in_the_loading_segment() -> None:
    # Mixtral-8x7B-2L: gate_up's fp32 copy (3584 MiB) opens a segment, down's (1792) fits the hole gate_up left,
    # and down's bf16 original (896) stays free: 1792 MiB over two layers (the H200 had 1402 MiB free in the
    # loading segment after a step, the adapters and workspaces inside it)
    from vramscope.planner.frameworks import framework_for
    from vramscope.planner.memory import expert_upcast_holes

    shape = resolve_model(MIXTRAL_2L)[1]
    spec = HF.with_(lora_dropout=0.0, lora_targets=("all-linear",))
    assert expert_upcast_holes(shape, spec, framework_for(spec)) == 2 * 896 * MIB
    assert expert_upcast_holes(shape, TRL, framework_for(TRL)) == 0  # TRL keeps the experts bf16
    assert expert_upcast_holes(shape, spec.with_(compute_dtype="fp32"), framework_for(spec)) == 0  # no upcast
    assert expert_upcast_holes(resolve_model(LLAMA31_8B)[1], HF, framework_for(HF)) == 0  # no experts


@pytest.mark.parametrize(("config", "measured_free_mib"), [
    # the H200's largest free block in transformers' loading segment after the first steps, HF recipe (r 64, all
    # linear layers, bf16 load): bench/results/whole-run/segments-2026-12-02/hf-evalargmax-*-history/
    (QWEN25_7B, 1646.56),  # 2079 MiB freed by the upcast, 252 of adapters, two cuBLAS workspaces and 120 of gaps
    (LLAMA31_8B, 1732.0),  # 2004 freed, 224 of adapters, one workspace inside it (the other in a loss block)
])  # the plan counts every adapter tensor above 1 MiB in it (some fit smaller gaps): the smaller figure
def test_the_loading_region_is_the_upcast_embedding_and_head_less_the_adapters(config: dict[str, Any],
                                                                               measured_free_mib: float) -> None:
    from vramscope.planner.frameworks import framework_for, precision
    from vramscope.planner.pool import loading_region

    shape = resolve_model(config)[1]
    fw = framework_for(HF)
    region = loading_region(shape, HF, fw, precision(HF, fw))
    freed = 2 * (shape.embedding_params + shape.lm_head_params)
    assert 0 < region < freed
    assert 0.9 * measured_free_mib * MIB < region <= measured_free_mib * MIB
    # TRL keeps the 16-bit embedding and head (no upcast, no region); a model loaded in fp32 is not upcast
    trl_fw = framework_for(TRL)
    assert loading_region(shape, TRL, trl_fw, precision(TRL, trl_fw)) == 0
    fp32 = HF.with_(compute_dtype="fp32")
    assert loading_region(shape, fp32, fw, precision(fp32, fw)) == 0


def test_hf_argmax_eval_of_qwen_takes_the_loading_region_for_its_fp32_logits() -> None:
    # Qwen2.5-7B, HF recipe, 2 x 512 step, 4 x 512 argmax eval: autocast's half lm_head (1039.5 MiB) and then the
    # loss's fp32 upcast of the [2048, 152064] logits (1188 MiB) take the loading region; only the log-softmax
    # opens a segment (H200: reserved 12214 MiB after step 2, 13402 after the evaluation; the plan before the
    # region said two segments, +8.7 % in process memory)
    run = RunPhases(eval_batch=4, eval_examples=16, eval_logits="argmax")
    assert _growth(QWEN25_7B, HF, 2, 512, run) == segment_bytes(4 * 2048 * 152064)


@pytest.mark.parametrize(("model", "measured_mib"), [
    # HF recipe, 2 x 512 step, 4 x 512 argmax eval, on architectures the pool model was not read from (H200,
    # session 8 call B: reserved after step 2 and after the evaluation, bench/results/whole-run/
    # segments-2026-12-02/hf-evalargmax-*-history/). Nemo's 800 MiB of checkpoints leave its region too small
    # for the half lm_head (1280 MiB), which opens a segment of its own; in the evaluation the fp32 upcast takes
    # that block and the log-softmax the region: nothing new (15926 -> 15926 MiB)
    ("Mistral-Nemo-12B", 0),
    # Gemma-2's tied 256k embedding: a 1750 MiB region, the fp32 pair of [2048, 256000] (2000 MiB each) fits
    # neither it nor the step's blocks: two segments (16542 -> 20542 MiB)
    ("Gemma-2-9B", 4000),
    # Llama-3.2-3B's tied embedding leaves 751 MiB: the log-softmax's 1002 MiB opens its own, and so does the
    # upcast (6704 -> 8708 MiB)
    ("Llama-3.2-3B", 2004),
])
def test_hf_argmax_eval_on_unseen_architectures_opens_the_segments_the_h200_reserved(model: str,
                                                                                     measured_mib: int) -> None:
    from vramscope.planner import registry

    run = RunPhases(eval_batch=4, eval_examples=16, eval_logits="argmax")
    assert _growth(dict(registry.get_config(model)), HF, 2, 512, run) == measured_mib * MIB
