"""Advice from an OOM record (:class:`vramscope.analysis.oom.OomReport`): vramscope's rules over the measured
numbers (:data:`RULES`, each a function of :class:`OomFacts`, as a log's rules in :mod:`vramscope.advice.log`),
the planner's changes fed with them, and the two ranked together (:func:`merge_advice`); :func:`oom_advice` is what
a post-mortem shows.

Each rule states what to change in neutral keys (``change``) and in the run's own (``how``, HF style by default,
as the rules' texts speak of TrainingArguments).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vramscope.advice.plan import from_recommendation
from vramscope.advice.types import EXPANDABLE_SEGMENTS, Advice, rank_by_sufficiency
from vramscope.analysis.oom import NO_STACK, AllocationSite, OomReport
from vramscope.planner.batching import split_batch
from vramscope.planner.settings import written_as
from vramscope.units import GIB, MIB, human


def _shortfall(report: OomReport) -> int | None:
    """How much the step's memory must shrink at least to avoid this OOM.

    The larger of: what it held plus what it asked, over what it had; and what this one request
    lacked given where the free memory was (fragmentation).
    """
    if report.capacity_bytes is None:
        return report.shortfall_bytes
    need = report.allocated_bytes + (report.requested_bytes or 0)
    usable = report.capacity_bytes - (report.outside_bytes or 0)
    return max(0, need - usable, report.shortfall_bytes or 0)


@dataclass(frozen=True)
class OomFacts:
    """What the rules read of one OOM, weighed once (bytes).

    The live memory split by allocation site tells activations (what scales with batch and length) from
    optimizer state and from memory without a Python stack (weights loaded before recording, gradients written
    by autograd's C++ thread).
    """

    report: OomReport
    need: int  # what the step held plus what it asked for
    over: int | None  # how much the step's memory must shrink at least (:func:`_shortfall`)
    target: int  # what a rule sized by the batch aims to free: ``over``, else the failed request
    activation_bytes: int  # activations and step temporaries with a Python stack, plus the failed request
    optimizer_bytes: int
    loss_bytes: int
    loss_site: str | None  # the largest site of the logits/loss, None when there is none


def facts_of(report: OomReport, sites: Sequence[AllocationSite] | None = None) -> OomFacts:
    """The facts of ``report``, weighed over ``sites`` (default: every live site of the snapshot)."""
    weighed = sites if sites is not None else (report.sites or report.top_sites)  # a report built by hand: its top
    attributed = [s for s in weighed if s.where != NO_STACK]
    loss_sites = [s for s in attributed if s.kind == "loss/logits"]
    # Memory with a Python stack that is neither optimizer state nor model loading: the step's
    # activations and temporaries, i.e. what scales with the batch; plus the request that failed.
    scaling = ("activations", "checkpointed activations", "loss/logits")
    over = _shortfall(report)
    return OomFacts(
        report=report,
        need=(report.requested_bytes or 0) + report.allocated_bytes,
        over=over,
        target=over if over else (report.requested_bytes or 0),
        activation_bytes=sum(s.bytes for s in attributed if s.kind in scaling) + (report.requested_bytes or 0),
        optimizer_bytes=sum(s.bytes for s in attributed if s.kind == "optimizer state"),
        loss_bytes=sum(s.bytes for s in loss_sites),
        loss_site=loss_sites[0].where if loss_sites else None,
    )


def _fragmentation_advice(f: OomFacts) -> list[Advice]:
    report, frag_free = f.report, f.report.free_in_segments_bytes
    if report.requested_bytes is not None and frag_free >= report.requested_bytes > report.largest_free_block_bytes:
        return [Advice(
            "expandable_segments",
            "Let the allocator grow segments instead of splitting them",
            f"{human(frag_free)} was free inside the allocator's segments, enough for the "
            f"{human(report.requested_bytes)} request, but the largest free piece was "
            f"{human(report.largest_free_block_bytes)} (fragmentation {report.fragmentation or 0:.0%}). "
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting the process.",
            frag_free,
            change=dict(EXPANDABLE_SEGMENTS),
        )]
    if report.fragmentation is not None and report.fragmentation > 0.3 and frag_free > 256 * MIB:
        return [Advice(
            "expandable_segments",
            "Reduce fragmentation",
            f"{human(frag_free)} sat free but split inside segments (fragmentation {report.fragmentation:.0%}). "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually reclaims most of it.",
            frag_free,
            change=dict(EXPANDABLE_SEGMENTS),
        )]
    return []


def _micro_batch_advice(f: OomFacts) -> list[Advice]:
    shape = f.report.batch_shape
    if not shape or f.activation_bytes <= 0:
        return []
    batch = shape[0]
    per_sample = f.activation_bytes / batch if batch else 0.0
    if batch <= 1 or per_sample <= 0:
        return []
    drop = max(1, math.ceil(f.target / per_sample)) if f.target else 1
    micro, accum = split_batch(batch, max(1, batch - drop))
    return [Advice(
        "micro_batch",
        f"Lower the micro-batch from {batch} to {micro}, with gradient accumulation {accum}",
        f"About {human(per_sample)} per sample is activations and step temporaries "
        f"({human(f.activation_bytes)} at batch {batch}); {micro} x {accum} accumulation steps keeps "
        f"the effective batch at {micro * accum}. `vramscope tune` finds the exact largest batch in "
        "a few steps.",
        int(per_sample * (batch - micro)),
        change={"batch_size": micro, "grad_accum": accum},
    )]


def _seq_len_advice(f: OomFacts) -> list[Advice]:
    shape = f.report.batch_shape
    if not shape or f.activation_bytes <= 0 or len(shape) < 2 or shape[1] <= 1:
        return []
    seq = shape[1]
    per_token = f.activation_bytes / seq
    cut = max(1, math.ceil(f.target / per_token)) if f.target else seq // 4
    new_seq = max(1, seq - cut)
    new_seq = (new_seq // 64) * 64 or new_seq  # a multiple of 64 suits the kernels, when one is left
    return [Advice(
        "seq_len",
        f"Shorten sequences from {seq} to {new_seq} tokens",
        "Activations grow at least linearly with sequence length (quadratically with eager "
        "attention); truncating or packing to a shorter length frees about "
        f"{human(per_token * (seq - new_seq))}.",
        int(per_token * (seq - new_seq)),
        change={"seq_len": new_seq},
    )]


def _checkpointing_advice(f: OomFacts) -> list[Advice]:
    if f.report.checkpointing_seen or f.activation_bytes <= 0.3 * max(f.need, 1):
        return []
    return [Advice(
        "gradient_checkpointing",
        "Turn on gradient checkpointing",
        "No torch.utils.checkpoint frames among the live allocations, and activations are "
        f"{human(f.activation_bytes)} of the {human(f.need)} needed. model.gradient_checkpointing_enable() "
        "(TrainingArguments(gradient_checkpointing=True)) keeps one tensor per layer and recomputes the rest.",
        int(f.activation_bytes * 0.6),
        change={"gradient_checkpointing": True},
    )]


def _loss_advice(f: OomFacts) -> list[Advice]:
    if f.loss_site is None or f.loss_bytes <= 0.1 * max(f.need, 1):
        return []
    return [Advice(
        "loss_chunking",
        "Shrink the loss over the vocabulary",
        f"{human(f.loss_bytes)} is live at the logits/loss ({f.loss_site}). The logits are "
        "batch x sequence x vocabulary, often upcast to fp32: compute the loss in chunks or with a "
        "fused linear-cross-entropy kernel, or lower batch x sequence.",
        f.loss_bytes // 2,
    )]


def _optimizer_advice(f: OomFacts) -> list[Advice]:
    if f.optimizer_bytes <= 0.1 * max(f.need, 1):
        return []
    return [Advice(
        "optimizer",
        "Use an 8-bit or paged optimizer",
        f"{human(f.optimizer_bytes)} is optimizer state. bitsandbytes' paged_adamw_8bit keeps it in "
        "8 bits (about a quarter of 32-bit Adam) and pages it to host memory under pressure.",
        int(f.optimizer_bytes * 0.75),
        change={"optim": "paged_adamw_8bit"},
    )]


def _outside_advice(f: OomFacts) -> list[Advice]:
    capacity, outside = f.report.capacity_bytes, f.report.outside_bytes or 0
    if capacity is None or outside <= max(GIB, 0.05 * capacity):
        return []
    return [Advice(
        "outside_memory",
        "Free the memory held outside this process's PyTorch allocator",
        f"{human(outside)} of the {human(capacity)} was not in this process's allocator: other processes, "
        "the CUDA context, library workspaces, or bitsandbytes' paged buffers. Check `vramscope watch` or "
        "nvidia-smi for other processes on this GPU.",
        outside,
    )]


# vramscope's rules over an OOM's measured numbers, each ``(facts) -> advice``; a new rule is a function here.
# Their order is the order of equals after ranking.
RULES: tuple[Callable[[OomFacts], list[Advice]], ...] = (
    _fragmentation_advice,
    _micro_batch_advice,
    _seq_len_advice,
    _checkpointing_advice,
    _loss_advice,
    _optimizer_advice,
    _outside_advice,
)


def advise(report: OomReport, sites: Sequence[AllocationSite] | None = None, style: str = "hf") -> list[Advice]:
    """Ranked advice from the report's measured numbers alone (vramscope's :data:`RULES`; no planner involved).

    Each rule estimates what it would free at the peak; the estimates are first-order (:class:`OomFacts`).
    ``sites``: the live sites to weigh (default: all of the snapshot's). ``style``: whose keys ``how`` is
    written in (:data:`vramscope.planner.settings.STYLES`).
    """
    facts = facts_of(report, sites)
    return rank_advice([_judged(_written(a, style), facts.over) for rule in RULES for a in rule(facts)])


def _written(advice: Advice, style: str) -> Advice:
    return replace(advice, how=written_as(dict(advice.change), style)) if advice.change else advice


def _judged(advice: Advice, over: int | None) -> Advice:
    if advice.sufficient is not None or over is None or advice.saves_bytes is None:
        return advice
    return replace(advice, sufficient=advice.saves_bytes >= over)


def rank_advice(items: Iterable[Advice]) -> list[Advice]:
    """Changes that alone would have avoided the OOM first, then by the memory they free."""
    return rank_by_sufficiency(items)


def planner_advice(report: OomReport, model: Any, spec: Any = None) -> tuple[list[Advice], str]:
    """The planner's recommendations for this OOM's batch shape, fed with the measured numbers.

    The measured peak is at least what was allocated plus what was asked for; the capacity is what
    the allocator was allowed. Returns ``(advice, "")``, or ``([], why)`` when the planner cannot be used.
    """
    if model is None:
        return [], "the planner was not told the model"
    shape = report.batch_shape
    if not shape or len(shape) < 2:
        return [], "no batch shape (batch x sequence) in the context"
    try:
        from vramscope.planner import PlanInputError, recommend
        from vramscope.recipe import QLoraSpec
    except ImportError as exc:  # pragma: no cover - the planner ships with vramscope
        return [], f"the planner cannot be imported: {exc}"
    if isinstance(spec, Mapping):
        fields = QLoraSpec.__dataclass_fields__
        values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in spec.items() if k in fields}
        spec = QLoraSpec(**values)
    peak = report.allocated_bytes + (report.requested_bytes or 0)
    try:
        recs = recommend(
            model, int(shape[0]), int(shape[1]), spec, peak_bytes=max(peak, 1), capacity_bytes=report.capacity_bytes
        )
    except (PlanInputError, ValueError, TypeError) as exc:
        return [], f"the planner could not use this model: {exc}"
    out = []
    for r in recs:
        _, said, saving = r.text.rpartition(": saves ")
        saving = saving if said else ""
        detail = (
            f"saves {saving or human(r.saving_bytes)} as predicted by the planner for batch {shape[0]} x "
            f"{shape[1]} tokens; the measured need was {human(peak)} against a capacity of "
            f"{human(report.capacity_bytes)}."
        )
        out.append(from_recommendation(r, detail, sufficient=r.sufficient))
    return out, ""


def merge_advice(planned: Sequence[Advice], own: Sequence[Advice], report: OomReport) -> list[Advice]:
    """The planner's recommendations plus what only the snapshot can tell, ranked together.

    Where both speak about the same change, the snapshot's version wins when it rests on evidence the
    planner cannot see (fragmentation measured in the segments, memory outside the allocator);
    otherwise the planner's (a prediction from the model's shapes beats a first-order split).
    """
    measured_only = {"expandable_segments", "outside_memory", "loss_chunking"}
    own_keys = {a.key for a in own if a.key in measured_only}
    merged = [a for a in planned if a.key not in own_keys]
    planned_keys = {a.key for a in merged}
    merged += [a for a in own if a.key in measured_only or a.key not in planned_keys]
    return rank_advice(_judged(a, _shortfall(report)) for a in merged)


# Where the advice of a post-mortem came from, as its files say it.
PLANNER_AND_SNAPSHOT = "the planner's recommendations fed with the measured peak, plus the snapshot's evidence"


def oom_advice(report: OomReport, model: Any = None, spec: Any = None) -> tuple[list[Advice], str]:
    """The post-mortem's advice and where it came from: the planner's recommendations merged with what only the
    snapshot can tell when the planner can be used (``model`` given, a batch shape in the report), else
    vramscope's rules alone (:func:`advise`), with why the planner was not."""
    own = advise(report)
    planned, why_not = planner_advice(report, model, spec)
    if planned:
        return merge_advice(planned, own, report), PLANNER_AND_SNAPSHOT
    return own, f"vramscope's rules over the measured numbers ({why_not})"
