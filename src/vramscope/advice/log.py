"""Advice from a log's analysis: what to do about what the log shows.

Two sources. :func:`advise_devices` reads the log alone: a log does not say which model or optimizer ran, so
each piece of its advice rests on a measured fact (an eval peak above the training peak, memory reserved
beyond the largest demand, a leak, a batch far longer than the rest) and states the bytes it could save where
the log shows them. When the user says what ran (``--model``, ``--batch-size``), :func:`priced_by_planner` adds
the planner's ranked changes (:func:`vramscope.planner.recommend`), each with its predicted saving, judged
against the peak and capacity measured in the log; :func:`in_report_order` puts the two together.

The rules read :class:`DeviceFacts`, taken from the typed analysis (:func:`facts_of`, over
:class:`vramscope.analysis.results.AnalysisResult`); :func:`advise_result` and :func:`advise_run_result` are the
entry points.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vramscope.advice.plan import from_recommendation
from vramscope.advice.types import EXPANDABLE_SEGMENTS, Advice, rank_by_urgency
from vramscope.analysis.results import AnalysisResult, DeviceAnalysis
from vramscope.planner import PlanInputError, recommend
from vramscope.planner.api import MIN_SAVING_SHARE as PLANNER_MIN_SAVING_SHARE
from vramscope.planner.settings import written_as
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB, MIB, gib

# The smallest measured saving worth a line, as a share of the device's peak: the planner's threshold.
MIN_SAVING_SHARE = PLANNER_MIN_SAVING_SHARE
# Below this share of the GPU left free at the peak, a longer batch or a fragmented cache can OOM.
TIGHT_HEADROOM = 0.08
# Above this share left free, a larger micro-batch would likely fit and run faster.
ROOMY_HEADROOM = 0.45
# Memory the CUDA context and libraries take outside torch's allocator on a typical GPU.
CONTEXT_ALLOWANCE = 1536 * MIB
# The columns an evaluation peak is compared to training's on, the first both phases have.
EVAL_METRICS = ("peak_allocated_bytes", "allocated_bytes", "reserved_bytes", "device_used_bytes")
# An environment variable is written the same in every program's style: an export line.
EXPANDABLE_HOW = written_as(dict(EXPANDABLE_SEGMENTS), "hf")


@dataclass(frozen=True)
class RunSettings:
    """What ran, as the user tells it: enough for the planner to price each change.

    Attributes:
        model: a planner registry name (``Llama-2-7B``) or a config.json dict.
        batch_size: the micro-batch.
        seq_len: the maximum sequence length; None takes the log's longest batch / ``batch_size``.
        spec: the recipe (default: the QLoRA reference recipe); its ``framework`` decides the model of the step.
        style: whose keys the advice is written in (``hf``, ``trl``, ``loop``, ``axolotl``); default the
            framework's own (HF/TRL arguments, a loop's code).
        grad_accum: the run's gradient accumulation steps: a smaller micro-batch advised keeps the effective
            batch ``batch_size x grad_accum``.
    """

    model: str | dict[str, Any]
    batch_size: int
    seq_len: int | None = None
    spec: QLoraSpec = field(default_factory=QLoraSpec)
    style: str | None = None
    grad_accum: int = 1


@dataclass(frozen=True)
class DeviceFacts:
    """What the advice reads of one device the run used (bytes; None: not in the log).

    ``phase_peaks`` is phase -> column -> (peak bytes, its step); ``peaks`` each column's peak over the run.
    """

    key: str
    where: str  # "GPU 0", for people
    leak_detected: bool
    leak_verdict: str
    leak_growth_bytes: float | None
    steps_to_oom: float | None
    oom_kind: str  # the analysis' outlook: "over_capacity", "at_capacity", "leak", "longest_batch", "none", ...
    oom_headline: str  # "out of memory in about 4 min", ...
    oom_detail: str
    phase_peaks: Mapping[str, Mapping[str, tuple[int | None, int | None]]]
    peaks: Mapping[str, int | None]
    capacity_bytes: int | None
    headroom_bytes: int | None
    headroom_fraction: float | None
    unused_bytes: int | None  # reserved memory that held no tensor at the reserved peak
    unused_fraction: float | None
    unused_growing: bool
    alloc_retries: int
    batch_at_risk: bool
    batch_warning: str | None
    bytes_per_token: float | None
    tokens_seen_max: int | None
    batch_tokens: tuple[int, ...]  # the longest batches' token counts

    @property
    def tight(self) -> bool:
        return self.headroom_fraction is not None and self.headroom_fraction < TIGHT_HEADROOM


def facts_of(result: AnalysisResult, idle: Collection[str] = ()) -> list[DeviceFacts]:
    """The facts of each device of the typed analysis, but those in ``idle`` (the run did not use them)."""
    return [_facts_of_device(d) for d in result.devices if d.key not in idle]


def _facts_of_device(dev: DeviceAnalysis) -> DeviceFacts:
    detail = dev.detail
    frag = detail.fragmentation
    lb = dev.forecast.longest_batch
    return DeviceFacts(
        key=dev.key, where=detail.title, leak_detected=dev.leak.detected, leak_verdict=dev.leak.shown_verdict,
        leak_growth_bytes=dev.leak.growth_bytes, steps_to_oom=dev.forecast.oom.steps_to_oom,
        oom_kind=dev.forecast.outlook.kind, oom_headline=dev.forecast.outlook.headline,
        oom_detail=dev.forecast.outlook.detail,
        phase_peaks={phase: {m: (p.bytes, p.step) for m, p in peaks.peaks.items()}
                     for phase, peaks in detail.phases.items()},
        peaks={m: p.bytes for m, p in detail.peaks.items()},
        capacity_bytes=detail.capacity_bytes, headroom_bytes=detail.headroom.headroom_bytes,
        headroom_fraction=detail.headroom.headroom_fraction,
        unused_bytes=None if frag is None else frag.at_peak_reserved.unused_bytes,
        unused_fraction=None if frag is None else frag.at_peak_reserved.unused_fraction,
        unused_growing=frag is not None and (frag.unused_trend or 0) > 0,
        alloc_retries=0 if frag is None else frag.alloc_retries or 0,
        batch_at_risk=lb.at_risk, batch_warning=lb.warning, bytes_per_token=lb.bytes_per_token,
        tokens_seen_max=lb.tokens_seen_max, batch_tokens=tuple(b.tokens for b in detail.longest_batches if b.tokens),
    )


def advise_result(result: AnalysisResult, idle: Collection[str] = ()) -> list[Advice]:
    """Advice on the log alone (see :func:`advise_devices`) from the typed analysis; ``idle``: keys to skip."""
    return advise_devices(facts_of(result, idle))


def advise_run_result(result: AnalysisResult, settings: RunSettings | None = None,
                      idle: Collection[str] = ()) -> list[Advice]:
    """The report's advice from the typed analysis: see :func:`in_report_order`.

    Raises:
        vramscope.planner.PlanInputError: as :func:`priced_by_planner`.
    """
    facts = facts_of(result, idle)
    return in_report_order(advise_devices(facts), None if settings is None else priced_by_planner(facts, settings))


def in_report_order(own: Sequence[Advice], planned: Sequence[Advice] | None) -> list[Advice]:
    """What is urgent in the log (a leak, a batch that will not fit) first; then, given what ran, the planner's
    changes priced for this model and batch; then the rest of what the log shows."""
    if planned is None:
        return list(own)
    return [a for a in own if a.urgent] + list(planned) + [a for a in own if not a.urgent]


def advise_devices(devices: Sequence[DeviceFacts]) -> list[Advice]:
    """Advice for the devices a run used, each from ``source`` "log": urgent first (a leak, a batch that will not
    fit, a GPU nearly full), then by bytes saved; advice without a measured saving last."""
    items: list[Advice] = []
    for f in devices:
        for rule in (_leak_advice, _eval_advice, _cache_advice, _headroom_advice, _batch_advice, _foreign_advice):
            items.extend(a for a in rule(f) if _worth_saying(a, f))
    return rank_by_urgency(items)


def _worth_saying(advice: Advice, f: DeviceFacts) -> bool:
    """A measured saving under :data:`MIN_SAVING_SHARE` of what the device held is noise, not advice (as the
    planner's own rule); advice without a measured saving stands on its fact."""
    held = max((v for v in f.peaks.values() if v), default=None)
    return advice.saves_bytes is None or held is None or advice.saves_bytes >= MIN_SAVING_SHARE * held


def priced_by_planner(devices: Sequence[DeviceFacts], settings: RunSettings) -> list[Advice]:
    """The planner's changes for this run, judged against the peak and the capacity measured in the log.

    Raises:
        vramscope.planner.PlanInputError: unknown model, non-positive sizes, or no sequence length
            (none given and the log records no batch tokens).
    """
    seq_len = settings.seq_len
    if seq_len is None:
        tokens = [t for f in devices for t in f.batch_tokens]
        if not tokens:
            raise PlanInputError("the log records no batch tokens; give the run's --seq-len")
        seq_len = math.ceil(max(tokens) / settings.batch_size)
    peak = _measured_peak(devices)
    capacity = min((f.capacity_bytes for f in devices if f.capacity_bytes), default=None)
    recs = recommend(settings.model, settings.batch_size, seq_len, settings.spec, peak_bytes=peak,
                     capacity_bytes=capacity, style=settings.style, grad_accum=settings.grad_accum)
    # "Enough to fit" only means something for a run that did not fit.
    over = peak is not None and capacity is not None and peak > capacity
    out = []
    for r in recs:
        sufficient = r.sufficient if over else None
        detail = _planner_detail(r.how, sufficient, seq_len, settings)
        out.append(from_recommendation(r, detail, sufficient=sufficient, urgent=bool(sufficient), device="all"))
    return out


def _measured_peak(devices: Sequence[DeviceFacts]) -> int | None:
    # The planner's peak is the process's memory on the GPU; the device's used memory is the nearest
    # measure when the process's own is unknown.
    for metric in ("process_bytes", "device_used_bytes"):
        known = [v for v in (f.peaks.get(metric) for f in devices) if v]
        if known:
            return int(max(known))
    return None


def _planner_detail(how: str, sufficient: bool | None, seq_len: int, settings: RunSettings) -> str:
    name = settings.model if isinstance(settings.model, str) else "the given config"
    verdict = "" if sufficient is None else (
        " Alone, it brings the measured peak under the capacity." if sufficient
        else " Alone, it is not enough to fit under the capacity.")
    return (f"planner, for {name} at batch {settings.batch_size} x {seq_len} tokens under {settings.spec.framework}: "
            f"{how}.{verdict}")


def _item(f: DeviceFacts, key: str, title: str, detail: str, saves: float | None = None, urgent: bool = False,
          change: dict[str, Any] | None = None, how: str = "") -> Advice:
    return Advice(key, title, detail, None if saves is None else int(saves), "log", None, change or {}, how, urgent,
                  f.key)


def _leak_advice(f: DeviceFacts) -> list[Advice]:
    if not f.leak_detected:
        return []
    # The analysis' own words for when it runs out (in steps, or in time for a log without steps).
    when = f"; at this rate it runs {f.oom_headline}" if f.oom_kind == "leak" else ""
    return [_item(
        f, "leak", "Find what keeps memory from one step to the next",
        f"{f.where}: {f.leak_verdict}{when}. Usual causes: a loss or logits kept "
        "without .item() or .detach() (e.g. appended to a list), a growing cache, hooks that store activations.",
        f.leak_growth_bytes, urgent=True,
    )]


def _eval_advice(f: DeviceFacts) -> list[Advice]:
    train, evaluation = f.phase_peaks.get("train") or {}, f.phase_peaks.get("eval") or {}
    for metric in EVAL_METRICS:
        t, e = (train.get(metric) or (None, None))[0], (evaluation.get(metric) or (None, None))[0]
        if t is not None and e is not None:
            break
    else:
        return []
    if e <= t * 1.03:
        return []
    return [_item(
        f, "lighter_eval", "Make evaluation lighter than training",
        f"{f.where}: evaluation peaks {gib(e - t)} above training (at step {evaluation[metric][1]}). "
        "Lower per_device_eval_batch_size, set eval_accumulation_steps, or prediction_loss_only=True so that "
        "logits of the whole eval set are not gathered on the GPU.",
        e - t, urgent=f.tight,
    )]


def _cache_advice(f: DeviceFacts) -> list[Advice]:
    unused, share, retries = f.unused_bytes, f.unused_fraction, f.alloc_retries
    if unused is None or share is None:
        return []
    if (share < 0.15 or unused < 512 * MIB) and not retries:
        return []
    detail = (f"{f.where}: {gib(unused)} ({share:.0%}) of the reserved memory held no tensor at the reserved peak"
              f"{', and the gap grows' if f.unused_growing else ''}"
              f"{f'; the allocator retried {retries} times after freeing its cache' if retries else ''}. "
              "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that the cache grows in place "
              "instead of keeping split blocks.")
    return [_item(f, "expandable_segments", "Let the allocator reuse its cache (expandable segments)", detail,
                  unused, urgent=bool(retries) or f.tight, change=dict(EXPANDABLE_SEGMENTS), how=EXPANDABLE_HOW)]


def _headroom_advice(f: DeviceFacts) -> list[Advice]:
    fraction, room = f.headroom_fraction, f.headroom_bytes
    if fraction is None or room is None:
        return []
    if f.oom_kind == "over_capacity":
        return [_item(
            f, "make_room", "Fit the run into the capacity given",
            f"{f.oom_detail}, {gib(-room)} more than it. Turn on gradient checkpointing, lower the micro-batch "
            "(with more gradient accumulation), or use an 8-bit paged optimizer; 'vramscope plan' predicts each "
            "one's saving for your model.",
            None, urgent=True,
        )] if room < 0 else []
    if fraction < TIGHT_HEADROOM:
        return [_item(
            f, "make_room", "Make room before a longer batch arrives",
            f"{f.where}: only {gib(room)} ({fraction:.0%}) of {gib(f.capacity_bytes)} was left at the peak. "
            "Turn on gradient checkpointing, halve the micro-batch and double gradient_accumulation_steps, or use "
            "an 8-bit paged optimizer; 'vramscope plan' predicts each one's saving for your model.",
            None, urgent=True,
        )]
    if fraction > ROOMY_HEADROOM:
        return [_item(
            f, "use_free_memory", "Use the free memory for speed",
            f"{f.where}: {gib(room)} ({fraction:.0%}) stayed free at the peak. A larger micro-batch (with fewer "
            "accumulation steps) or gradient checkpointing off would likely fit and run faster; "
            "'vramscope tune' finds the largest batch that fits in a few real steps.",
        )]
    return []


def _batch_advice(f: DeviceFacts) -> list[Advice]:
    if f.batch_at_risk:
        return [_item(
            f, "cap_longest_batch", "Cap the longest batch",
            f"{f.where}: {f.batch_warning or 'the longest batch the run can see is predicted not to fit'}. "
            "Lower max_length, or use group_by_length / packing so that batches of similar length go together.",
            None, urgent=True,
        )]
    if f.batch_tokens and f.bytes_per_token and f.tokens_seen_max and f.tight:
        return [_item(
            f, "cap_longest_batch", "Cap the longest batch",
            f"{f.where}: each token of a batch costs ~{f.bytes_per_token / MIB:.2f} MiB at the peak and the longest "
            f"batch had {max(f.batch_tokens)} tokens; a lower max_length or packing flattens the peaks.",
            None, urgent=True,
        )]
    return []


def _foreign_advice(f: DeviceFacts) -> list[Advice]:
    used, reserved, process = (f.peaks.get(m) for m in ("device_used_bytes", "reserved_bytes", "process_bytes"))
    if used is None:
        return []
    if reserved is not None:
        others = used - reserved - CONTEXT_ALLOWANCE  # the allocator does not count the CUDA context
    elif process is not None:
        others = used - process  # NVML counts the context in the process's memory
    else:
        return []
    if others < GIB:
        return []
    return [_item(
        f, "other_processes", "Check what else holds memory on this GPU",
        f"{f.where}: at the peak the device used {gib(used)}, {gib(others)} more than this run's "
        f"{'allocator and CUDA context' if reserved is not None else 'processes'}. Other processes or another "
        "framework share the GPU ('vramscope watch' lists them).",
        others,
    )]
