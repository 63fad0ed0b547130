"""The planner's own recommendations: what to change so the plan fits.

Each rule is a function of one :class:`Situation` (the plan's model, recipe, shapes and figures) returning its
:class:`Candidate` changes; :data:`RULES` is the tuple that :func:`vramscope.planner.api._recommendations` walks.
A rule only says what to try. The walker predicts each candidate's saving (the step with the change against the
step without it), drops what saves too little, judges whether it is enough and writes it in the user's keys, in one
place for every rule. A new recommendation is a function here and its place in :data:`RULES`.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vramscope.planner.batching import largest_divisor
from vramscope.planner.frameworks import FRAMEWORK_TABLE, Framework
from vramscope.planner.memory import Estimate, Hardware, lora_modules
from vramscope.planner.search import max_batch_size
from vramscope.planner.settings import EXPANDABLE_SEGMENTS
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

# expandable_segments lets the allocator grow segments in place instead of keeping freed blocks it cannot
# reuse; what stays is rounding to 2 MiB pages, so most of the fragmentation goes away.
EXPANDABLE_SEGMENTS_RECLAIM = 0.8
# The projections a LoRA on the attention only wraps, under each architecture's names.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "query_key_value", "dense")


@dataclass(frozen=True, kw_only=True)
class Situation:
    """What every rule sees: the planned step and its figures.

    Attributes:
        shape, spec, batch, seq, hw: the step as planned (``batch`` the step's rows, ``seq`` its length).
        current: the model's estimate of that step.
        peak: the peak to bring down: the estimate's, or a measured one (an OOM's, a log's).
        capacity: the GPU's memory, None when the plan has none.
        loaded: what loading the model holds on the device (0 where only the step is compared).
        base: the larger of the step and the loading: what a saving is taken from.
        deficit: how far the larger of ``peak`` and ``base`` is over the capacity (None without one).
        framework: the recipe's framework.
        style: whose keys the advice is written in; trainer: the run's trainer (``sft``, ``dpo``, ...).
        grad_accum: the run's own gradient accumulation steps.
    """

    shape: ModelShape
    spec: QLoraSpec
    batch: int
    seq: int
    hw: Hardware
    current: Estimate
    peak: int
    capacity: int | None
    loaded: int
    base: int
    deficit: int | None
    framework: Framework
    style: str
    trainer: str
    grad_accum: int


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One change a rule proposes; the walker predicts what it saves and keeps it if it saves enough.

    Attributes:
        name: the recommendation's stable key (``Recommendation.name``).
        text: one line for people, with ``{saving:.2f}`` where the saving in GiB goes.
        change: what to change, in neutral keys (``planner/settings.written_as`` writes it in the user's).
        spec, batch, seq, framework: the step with the change (None: the situation's own), which the walker
            estimates for the saving.
        saving: a saving the rule computes itself instead (expandable segments: the allocator's reclaim, which
            no estimate of a changed step shows).
        noise_floor: whether a saving under ``MIN_SAVING_SHARE`` of the step is dropped as noise; the
            allocator's reclaim is offered whenever it is positive.
        under_trl_step: offered where the step is a TRL trainer's own (DPO, GRPO, KTO, reward). Its rows are
            2 x batch or prompt + completion long and its forward is TRL's, whatever the recipe's framework: the
            batch and length changes are the phases' own recommendations, in the trainer's settings, and the
            framework's changes do not apply.
    """

    name: str
    text: str
    change: dict[str, Any]
    spec: QLoraSpec | None = None
    batch: int | None = None
    seq: int | None = None
    framework: Framework | None = None
    saving: int | None = None
    noise_floor: bool = True
    under_trl_step: bool = True


Rule = Callable[[Situation], list[Candidate]]


# -- the framework's own: savings that belong to the training program rather than to the recipe's numbers ------


def drop_output(s: Situation) -> list[Candidate]:
    fw, spec = s.framework, s.spec
    if fw.logits != "kept":
        return []
    return [Candidate(
        name="drop_output",
        text="drop the model output before backward (keep only `loss`; the logits"
             + (" and the KV cache" if not spec.gradient_checkpointing and fw.keeps_kv_cache else "")
             + " otherwise live until the next forward returns): saves {saving:.2f} GiB",
        change={"keep_output": False}, framework=output_dropped(fw), under_trl_step=False)]


def use_cache(s: Situation) -> list[Candidate]:
    if not (s.framework.keeps_kv_cache and not s.spec.gradient_checkpointing):
        return []
    return [Candidate(
        name="use_cache",
        text="pass `use_cache=False` to the forward (without checkpointing, train mode still builds the KV "
             "cache and `out` keeps it): saves {saving:.2f} GiB",
        change={"use_cache": False}, framework=replace(s.framework, keeps_kv_cache=False), under_trl_step=False)]


def model_dtype(s: Situation) -> list[Candidate]:
    if not (s.framework.dtype_advice and s.spec.compute_dtype == "fp32"):
        return []
    return [Candidate(name="model_dtype", text=s.framework.dtype_advice, change={"dtype": "bfloat16"},
                      spec=s.spec.with_(compute_dtype="bf16"))]


def switch_framework(s: Situation) -> list[Candidate]:
    if s.framework.switch_to is None or s.spec.bits not in (4, 8):
        return []
    target = FRAMEWORK_TABLE[s.framework.switch_to]
    return [Candidate(name="framework", text=target.switch_advice, change={"framework": target.name},
                      spec=s.spec.with_(framework=target.name), under_trl_step=False)]


def output_dropped(fw: Framework) -> Framework:
    """What ``fw`` becomes when its step keeps only the loss: the framework it names (a loop: ``loop-loss``, with
    its own allocator constants), else itself with the output dropped."""
    if fw.output_dropped is not None:
        return FRAMEWORK_TABLE[fw.output_dropped]
    return replace(fw, logits="dropped", keeps_kv_cache=False)


# -- the recipe's and the shapes' -----------------------------------------------------------------------------


def gradient_checkpointing(s: Situation) -> list[Candidate]:
    if s.spec.gradient_checkpointing:
        return []
    return [Candidate(
        name="gradient_checkpointing",
        text="turn gradient checkpointing on (recompute each layer in backward): saves {saving:.2f} GiB",
        change={"gradient_checkpointing": True}, spec=s.spec.with_(gradient_checkpointing=True))]


def micro_batch(s: Situation) -> list[Candidate]:
    if s.batch <= 1:
        return []
    # Prefer a divisor of the batch, so that accumulation keeps the effective batch exactly.
    limit = s.batch // 2
    if s.capacity is not None and s.deficit is not None and s.deficit > 0:
        # the largest micro-batch that fits, judged against the measured peak's excess over the model
        room = s.capacity - (s.peak - s.base)
        limit = min(limit, max(1, max_batch_size(s.shape, s.spec, s.seq, room, s.hw)))
    micro = largest_divisor(s.batch, limit)
    # The user's own accumulation carries over: the effective batch is micro-batch x accumulation.
    accum, effective = s.batch // micro * s.grad_accum, s.batch * s.grad_accum
    return [Candidate(
        name="micro_batch",
        text=f"micro-batch {micro} with gradient accumulation {accum} (same effective batch {effective}): "
             "saves {saving:.2f} GiB",
        change={"batch_size": micro, "grad_accum": accum}, batch=micro, under_trl_step=False)]


def optimizer(s: Situation) -> list[Candidate]:
    if s.spec.optim not in ("adamw_torch", "adamw_torch_fused", "adamw_8bit"):
        return []
    return [Candidate(
        name="optimizer",
        text="use paged_adamw_8bit (8-bit states in unified memory, paged out under pressure): saves {saving:.2f} GiB",
        change={"optim": "paged_adamw_8bit"}, spec=s.spec.with_(optim="paged_adamw_8bit"))]


def shorter_length(s: Situation) -> list[Candidate]:
    if s.seq <= 64:
        return []
    shorter = max(64, s.seq // 2)
    return [Candidate(
        name="seq_len",
        text=f"cap the maximum length at {shorter} tokens, or pack short examples into full rows: "
             "saves {saving:.2f} GiB",
        change={"seq_len": shorter}, seq=shorter, under_trl_step=False)]


def expandable_segments(s: Situation) -> list[Candidate]:
    frag = s.current.breakdown.allocator_overhead
    if frag <= 0:
        return []
    # expandable segments shrink the step's fragments, not what loading holds (planned without any)
    saving = s.base - max(s.current.device_bytes - int(frag * EXPANDABLE_SEGMENTS_RECLAIM), s.loaded)
    return [Candidate(
        name="expandable_segments",
        text="set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less allocator fragmentation): "
             "saves about {saving:.2f} GiB",
        change=dict(EXPANDABLE_SEGMENTS), saving=saving, noise_floor=False)]


def lower_rank(s: Situation) -> list[Candidate]:
    if s.spec.lora_r <= 8:
        return []
    lower = max(8, s.spec.lora_r // 4)
    return [Candidate(name="lora_rank", text=f"lower the LoRA rank from {s.spec.lora_r} to {lower}: "
                      "saves {saving:.2f} GiB", change={"lora_r": lower}, spec=s.spec.with_(lora_r=lower))]


def attention_only(s: Situation) -> list[Candidate]:
    attn_only = tuple(n for n in s.shape.linear_names() if n in ATTENTION_PROJECTIONS)
    current_targets = {m.name for m in lora_modules(s.shape, s.spec)}
    if not (attn_only and set(attn_only) < current_targets):
        return []
    return [Candidate(
        name="lora_targets",
        text=f"put LoRA on the attention projections only ({','.join(attn_only)}): saves {{saving:.2f}} GiB",
        change={"lora_targets": list(attn_only)}, spec=s.spec.with_(lora_targets=attn_only))]


# In this order; the walker ranks what they offer by saving, and an equal saving keeps this order.
RULES: tuple[Rule, ...] = (
    drop_output, use_cache, model_dtype, switch_framework,
    gradient_checkpointing, micro_batch, optimizer, shorter_length, expandable_segments, lower_rank, attention_only,
)
