"""Why a plan cannot fit one GPU, and what would: more GPUs, CPU offload, a smaller model, fewer bits.

When the weights alone outgrow the GPU no batch, sequence or LoRA setting helps, so the ordinary
recommendations (lower the rank, a smaller micro-batch) are replaced by these.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.planner import registry
from vramscope.planner.errors import PlanInputError
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate
from vramscope.planner.multigpu import fit_table
from vramscope.planner.recommendation import Recommendation
from vramscope.planner.shapes import ModelShape, shape_from_config
from vramscope.recipe import QLoraSpec
from vramscope.units import gib

SMALLER = 0.8
# The most GPUs offered when a way on one GPU exists: one node. Beyond it, a second machine and its network.
NODE_GPUS = 8
# The most offered at all: past two nodes what is left per GPU is the replicated part (activations, logits), which
# more GPUs do not shrink; `plan --gpus N` still shows any count.
MOST_GPUS = 16


@dataclass(frozen=True)
class NoFit:
    """Why, and the ways out; ``replaces_others`` when the usual recommendations cannot help (weights too big)."""

    reason: str
    alternatives: tuple[Recommendation, ...]
    replaces_others: bool


def explain(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, est: Estimate,
            capacity: int, model_name: str | None = None, grad_accum: int = 1) -> NoFit:
    """Why ``est`` does not fit ``capacity`` bytes, and what would (each with its predicted per-GPU saving).

    ``grad_accum`` is the run's own accumulation: a smaller micro-batch offered keeps ``batch x grad_accum``."""
    bd = est.breakdown
    weights = bd.quantized_weights + bd.quantization_constants + bd.unquantized_params
    floor = estimate(shape, spec, 1, 1, hw).device_bytes
    experts = _unquantized_experts(shape, spec, bd)
    # A quantized MoE model's weights are mostly not 4-bit: its experts are said apart, not "the 4-bit weights".
    bits = "" if experts else {4: "4-bit ", 8: "8-bit ", 16: f"{spec.compute_dtype} "}[spec.bits]
    if weights > capacity:
        reason = f"the {bits}weights alone need {gib(weights, 1)}{experts} of the GPU's {gib(capacity, 1)}"
        replaces = True
    elif floor > capacity:
        reason = (f"even 1 token needs {gib(floor, 1)}: weights {gib(weights, 1)}, LoRA weights, gradients and "
                  f"optimizer states {gib(bd.lora_weights + bd.lora_weights + bd.optimizer_states, 1)}, CUDA context "
                  f"{gib(bd.cuda_context, 1)}")
        replaces = True
    else:
        reason = (f"{batch} x {seq} tokens need {gib(est.device_bytes - floor, 1)} of activations and logits on top of "
                  f"{gib(floor, 1)} of weights and states")
        replaces = False
    # A 4-bit base that fits this GPU first (LoRA's own answer), then more GPUs (a few: within a node when a way
    # on this GPU exists), then offload (slower), then 4-bit when it helps but is not enough alone.
    quantize: Recommendation | None = None
    if spec.bits in (8, 16):
        saving = est.device_bytes - estimate(shape, spec.with_(bits=4), batch, seq, hw).device_bytes
        if saving > 0:
            quantize = Recommendation("quantize", saving, f"load the base in 4-bit NF4 (QLoRA): saves {gib(saving, 1)}",
                                      {"bits": 4}, saving >= est.device_bytes - capacity)
    table = fit_table(shape, spec, batch, seq, 1, capacity, hw, rows=(("fsdp", "none"), ("fsdp", "params")))
    rows = {(r.strategy, r.offload): r for r in table.rows}
    fsdp, offload = rows[("fsdp", "none")], rows[("fsdp", "params")]
    out: list[Recommendation] = []
    if quantize is not None and quantize.sufficient:
        out.append(quantize)
    gpus = _more_gpus(shape, spec, batch, seq, hw, capacity, fsdp.min_gpus, fsdp.max_batch_at_min,
                      one_gpu_way=offload.min_gpus == 1 or bool(out), grad_accum=grad_accum)
    if gpus is None and fsdp.min_gpus is None and (fsdp.load_bytes or 0) > capacity:
        # every FSDP rank loads the whole model first (parallel_loading), at any count: a split loads each GPU's
        # layers only
        gpus = _split_gpus(shape, spec, batch, seq, hw, capacity)
    if gpus is not None:
        out.append(gpus)
    if offload.min_gpus is not None:
        where = "on this GPU" if offload.min_gpus == 1 else f"over {offload.min_gpus} GPUs"
        out.append(Recommendation(
            "cpu_offload", 0,
            f"offload the parameters to the CPU (FSDP cpu_offload / ZeRO-3 offload_param) {where}: up to "
            f"micro-batch {offload.max_batch_at_min}, slower (every step copies the weights)",
            {"gpus": offload.min_gpus, "strategy": "fsdp", "offload": "params"}, True))
    if quantize is not None and not quantize.sufficient:
        out.append(quantize)
    smaller = _smaller_model(shape, spec, batch, seq, hw, capacity, model_name)
    if smaller is not None:
        out.append(Recommendation("smaller_model", 0, f"a smaller model: {smaller} fits at {batch} x {seq}",
                                  {"model": smaller}, True))
    elif replaces:
        out.append(Recommendation("smaller_model", 0, "a smaller model", {}, None))
    return NoFit(reason, tuple(out), replaces)


def _more_gpus(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, capacity: int,
               min_gpus: int | None, max_batch: int | None, one_gpu_way: bool,
               grad_accum: int = 1) -> Recommendation | None:
    """FSDP over the fewest GPUs that fit, at the plan's micro-batch or, when that takes more than a node, at
    micro-batch 1 with the rest as gradient accumulation; None when neither fits within a node and a way on
    this GPU exists (dozens of GPUs for a 7B is no advice), or none fits at all."""
    accumulate = grad_accum
    if (min_gpus is None or min_gpus > NODE_GPUS) and batch > 1:
        one = fit_table(shape, spec, 1, seq, 1, capacity, hw, rows=(("fsdp", "none"),)).rows[0]
        if one.min_gpus is not None and (min_gpus is None or one.min_gpus < min_gpus):
            min_gpus, max_batch, accumulate = one.min_gpus, one.max_batch_at_min, batch * grad_accum
    if min_gpus is None or min_gpus <= 1 or min_gpus > MOST_GPUS or (min_gpus > NODE_GPUS and one_gpu_way):
        return None
    # 4-bit weights need bf16 storage for FSDP to shard them; a 16-bit base shards as it is.
    how = " (bnb_4bit_quant_storage=bfloat16 shards the 4-bit weights)" if spec.bits == 4 else ""
    if accumulate > grad_accum:
        # FSDP's ranks each take a micro-batch: the effective batch is micro-batch 1 x accumulation x GPUs.
        total = accumulate
        accumulate = max(1, round(total / min_gpus))
        same = ("the same effective batch" if accumulate * min_gpus == total
                else f"effective batch {accumulate * min_gpus}, the nearest to {total}")
        size = f"at micro-batch 1 with gradient accumulation {accumulate} ({same})"
        change = {"gpus": min_gpus, "strategy": "fsdp", "batch_size": 1, "grad_accum": accumulate}
    else:
        size = f"up to micro-batch {max_batch} each"
        change = {"gpus": min_gpus, "strategy": "fsdp"}
    return Recommendation("more_gpus", 0, f"use {min_gpus} GPUs with FSDP{how}: {size} "
                          f"(plan --gpus {min_gpus} --strategy fsdp)", change, True)


def _split_gpus(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware,
                capacity: int) -> Recommendation | None:
    """The layers split over the fewest GPUs that fit (``device_map="auto"``, one process), within a node; None
    when no such count fits."""
    split = fit_table(shape, spec, batch, seq, 2, capacity, hw, rows=(("split", "none"),)).rows[0]
    if split.min_gpus is None or split.min_gpus > NODE_GPUS:
        return None
    return Recommendation("more_gpus", 0, f"split the layers over {split.min_gpus} GPUs (device_map=\"auto\", one "
                          f"process; FSDP's ranks would each load the whole model first): up to micro-batch "
                          f"{split.max_batch_at_min} (plan --gpus {split.min_gpus} --strategy split)",
                          {"gpus": split.min_gpus, "strategy": "split"}, True)


def _unquantized_experts(shape: ModelShape, spec: QLoraSpec, bd: Breakdown) -> str:
    """`` (of which 167.9 GiB unquantized experts)`` for a quantized MoE model, whose fused experts bitsandbytes
    leaves as they are: they, not the 4-bit weights, are what outgrows the GPU. Empty otherwise."""
    others = (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params
              + shape.expert_params)
    if spec.bits == 16 or not shape.expert_params or not others:
        return ""
    experts = bd.unquantized_params * shape.expert_params / others  # the unquantized bytes are per parameter
    return f" (of which {gib(int(experts), 2)} unquantized experts)"


def _smaller_model(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, capacity: int,
                   current: str | None) -> str | None:
    """The largest registry model below this one's size that fits with the same recipe and shape."""
    size = shape.total_params()
    best: tuple[int, str] | None = None
    for name in registry.names():
        if name == current:
            continue
        try:
            other = shape_from_config(registry.get_config(name))
            # Noticeably smaller (Llama-2-70B is not "a smaller model" than Llama-3-70B), and dense.
            if other.total_params() >= SMALLER * size or other.experts:
                continue
            fits = estimate(other, spec, batch, seq, hw).device_bytes <= capacity
        except PlanInputError:  # a recipe that does not apply to that model (its LoRA targets, say)
            continue
        if fits and (best is None or other.total_params() > best[0]):
            best = (other.total_params(), name)
    return best[1] if best else None


__all__ = ["NoFit", "explain"]
