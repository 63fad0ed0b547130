"""Advice from a log's analysis: what to do about what the log shows.

Two sources. :func:`advise` reads the log alone: a log does not say which model or optimizer ran, so
each piece of its advice rests on a measured fact (an eval peak above the training peak, memory
reserved beyond the largest demand, a leak, a batch far longer than the rest) and states the bytes it
could save where the log shows them. When the user says what ran (``--model``, ``--batch-size``),
:func:`planner_advice` adds the planner's ranked changes (:func:`vramscope.planner.recommend`), each
with its predicted saving, judged against the peak and capacity measured in the log; :func:`advise_run`
puts the two in the report's order.

Reads the summary dict of :func:`vramscope.report.model.build_report` until the analysis hands typed results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vramscope.advice.plan import from_recommendation
from vramscope.advice.types import Advice, rank_by_urgency
from vramscope.planner import PlanInputError, recommend
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB, MIB, gib

# Below this share of the GPU left free at the peak, a longer batch or a fragmented cache can OOM.
TIGHT_HEADROOM = 0.08
# Above this share left free, a larger micro-batch would likely fit and run faster.
ROOMY_HEADROOM = 0.45
# Memory the CUDA context and libraries take outside torch's allocator on a typical GPU.
CONTEXT_ALLOWANCE = 1536 * MIB


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
    """

    model: str | dict[str, Any]
    batch_size: int
    seq_len: int | None = None
    spec: QLoraSpec = field(default_factory=QLoraSpec)
    style: str | None = None


def planner_advice(summary: dict[str, Any], settings: RunSettings) -> list[Advice]:
    """The planner's changes for this run, judged against the peak and the capacity measured in the log.

    Raises:
        vramscope.planner.PlanInputError: unknown model, non-positive sizes, or no sequence length
            (none given and the log records no batch tokens).
    """
    devices = [d for d in (summary.get("devices") or {}).values() if not d.get("idle")]
    seq_len = settings.seq_len
    if seq_len is None:
        tokens = [b["tokens"] for d in devices for b in d.get("longest_batches") or [] if b.get("tokens")]
        if not tokens:
            raise PlanInputError("the log records no batch tokens; give the run's --seq-len")
        seq_len = math.ceil(max(tokens) / settings.batch_size)
    peak = _measured_peak(devices)
    capacity = min((d["capacity_bytes"] for d in devices if d.get("capacity_bytes")), default=None)
    recs = recommend(settings.model, settings.batch_size, seq_len, settings.spec, peak_bytes=peak,
                     capacity_bytes=capacity, style=settings.style)
    # "Enough to fit" only means something for a run that did not fit.
    over = peak is not None and capacity is not None and peak > capacity
    out = []
    for r in recs:
        sufficient = r.sufficient if over else None
        detail = _planner_detail(r.how, sufficient, seq_len, settings)
        out.append(from_recommendation(r, detail, sufficient=sufficient, urgent=bool(sufficient), device="all"))
    return out


def _measured_peak(devices: list[dict[str, Any]]) -> int | None:
    # The planner's peak is the process's memory on the GPU; the device's used memory is the nearest
    # measure when the process's own is unknown.
    for metric in ("process_bytes", "device_used_bytes"):
        values = [((d.get("peaks") or {}).get(metric) or {}).get("bytes") for d in devices]
        known = [v for v in values if v]
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


def advise_run(summary: dict[str, Any], settings: RunSettings | None = None) -> list[Advice]:
    """The report's advice: what is urgent in the log (a leak, a batch that will not fit) first; then, given what
    ran, the planner's changes priced for this model and batch; then the rest of what the log shows.

    Raises:
        vramscope.planner.PlanInputError: as :func:`planner_advice`.
    """
    advice = advise(summary)
    if settings is None:
        return advice
    urgent = [a for a in advice if a.urgent]
    return urgent + planner_advice(summary, settings) + [a for a in advice if not a.urgent]


def advise(summary: dict[str, Any]) -> list[Advice]:
    """Advice for one log's summary (see :func:`vramscope.report.model.build_report`), each from ``source`` "log":
    urgent first (a leak, a batch that will not fit, a GPU nearly full), then by bytes saved; advice without a
    measured saving last.
    """
    items: list[Advice] = []
    leak = summary.get("leak") or {}
    for key, dev in (summary.get("devices") or {}).items():
        if dev.get("idle"):  # the run did not use this GPU: nothing to change there
            continue
        where = dev.get("title") or key
        items.extend(_leak_advice(key, where, (leak.get("devices") or {}).get(key) or {}, summary))
        items.extend(_eval_advice(key, where, dev))
        items.extend(_cache_advice(key, where, dev))
        items.extend(_headroom_advice(key, where, dev))
        items.extend(_batch_advice(key, where, dev, summary))
        items.extend(_foreign_advice(key, where, dev))
    return rank_by_urgency(items)


# The allocator setting that lets the cache grow in place, as a change in neutral keys and as the user writes it.
EXPANDABLE = {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
EXPANDABLE_HOW = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def _item(key: str, title: str, detail: str, device: str, saves: float | None = None, urgent: bool = False,
          change: dict[str, Any] | None = None, how: str = "") -> Advice:
    return Advice(key, title, detail, None if saves is None else int(saves), "log", None, change or {}, how, urgent,
                  device)


def _leak_advice(key: str, where: str, leak: dict[str, Any], summary: dict[str, Any]) -> list[Advice]:
    if not leak.get("detected"):
        return []
    forecast = ((summary.get("forecast") or {}).get("devices") or {}).get(key) or {}
    when = ""
    if forecast.get("steps_to_oom") is not None:
        when = f"; at this rate it runs out of memory in ~{forecast['steps_to_oom']:,.0f} steps"
    return [_item(
        "leak", "Find what keeps memory from one step to the next",
        f"{where}: {leak.get('verdict', 'memory grows step after step')}{when}. Usual causes: a loss or logits kept "
        "without .item() or .detach() (e.g. appended to a list), a growing cache, hooks that store activations.",
        key, leak.get("growth_bytes"), urgent=True,
    )]


def _eval_advice(key: str, where: str, dev: dict[str, Any]) -> list[Advice]:
    phases = dev.get("phases") or {}
    train, evaluation = phases.get("train") or {}, phases.get("eval") or {}
    for metric in ("peak_allocated_bytes", "allocated_bytes", "reserved_bytes", "device_used_bytes"):
        t, e = (train.get(metric) or {}).get("bytes"), (evaluation.get(metric) or {}).get("bytes")
        if t is not None and e is not None:
            break
    else:
        return []
    if e <= t * 1.03:
        return []
    return [_item(
        "lighter_eval", "Make evaluation lighter than training",
        f"{where}: evaluation peaks {gib(e - t)} above training "
        f"(at step {(evaluation.get(metric) or {}).get('step')}). "
        "Lower per_device_eval_batch_size, set eval_accumulation_steps, or prediction_loss_only=True so that "
        "logits of the whole eval set are not gathered on the GPU.",
        key, e - t, urgent=_tight(dev),
    )]


def _cache_advice(key: str, where: str, dev: dict[str, Any]) -> list[Advice]:
    frag = dev.get("fragmentation") or {}
    at = frag.get("at_peak_reserved") or {}
    unused, share = at.get("unused_bytes"), at.get("unused_fraction")
    if unused is None or share is None:
        return []
    growing = (frag.get("unused_trend") or 0) > 0 and frag.get("unused_trend_bytes_per") is not None
    retries = frag.get("alloc_retries") or 0
    if (share < 0.15 or unused < 512 * MIB) and not retries:
        return []
    detail = (f"{where}: {gib(unused)} ({share:.0%}) of the reserved memory held no tensor at the reserved peak"
              f"{', and the gap grows' if growing else ''}"
              f"{f'; the allocator retried {retries} times after freeing its cache' if retries else ''}. "
              "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so that the cache grows in place "
              "instead of keeping split blocks.")
    return [_item("expandable_segments", "Let the allocator reuse its cache (expandable segments)", detail, key,
                  unused, urgent=bool(retries) or _tight(dev), change=EXPANDABLE, how=EXPANDABLE_HOW)]


def _headroom_advice(key: str, where: str, dev: dict[str, Any]) -> list[Advice]:
    fraction, room = dev.get("headroom_fraction"), dev.get("headroom_bytes")
    if fraction is None or room is None:
        return []
    if fraction < TIGHT_HEADROOM:
        return [_item(
            "make_room", "Make room before a longer batch arrives",
            f"{where}: only {gib(room)} ({fraction:.0%}) of {gib(dev.get('capacity_bytes'))} was left at the peak. "
            "Turn on gradient checkpointing, halve the micro-batch and double gradient_accumulation_steps, or use "
            "an 8-bit paged optimizer; 'vramscope plan' predicts each one's saving for your model.",
            key, None, urgent=True,
        )]
    if fraction > ROOMY_HEADROOM:
        return [_item(
            "use_free_memory", "Use the free memory for speed",
            f"{where}: {gib(room)} ({fraction:.0%}) stayed free at the peak. A larger micro-batch (with fewer "
            "accumulation steps) or gradient checkpointing off would likely fit and run faster; "
            "'vramscope tune' finds the largest batch that fits in a few real steps.",
            key, None,
        )]
    return []


def _batch_advice(key: str, where: str, dev: dict[str, Any], summary: dict[str, Any]) -> list[Advice]:
    forecast = ((summary.get("forecast") or {}).get("devices") or {}).get(key) or {}
    lb = forecast.get("longest_batch") or {}
    if lb.get("at_risk"):
        return [_item(
            "cap_longest_batch", "Cap the longest batch",
            f"{where}: {lb.get('warning') or 'the longest batch the run can see is predicted not to fit'}. "
            "Lower max_length, or use group_by_length / packing so that batches of similar length go together.",
            key, None, urgent=True,
        )]
    batches = dev.get("longest_batches") or []
    tokens = [b["tokens"] for b in batches if b.get("tokens")]
    per_token = lb.get("bytes_per_token")
    if tokens and per_token and lb.get("tokens_seen_max") and _tight(dev):
        return [_item(
            "cap_longest_batch", "Cap the longest batch",
            f"{where}: each token of a batch costs ~{per_token / MIB:.2f} MiB at the peak and the longest batch "
            f"had {max(tokens)} tokens; a lower max_length or packing flattens the peaks.",
            key, None, urgent=True,
        )]
    return []


def _foreign_advice(key: str, where: str, dev: dict[str, Any]) -> list[Advice]:
    peaks = dev.get("peaks") or {}
    used = (peaks.get("device_used_bytes") or {}).get("bytes")
    reserved = (peaks.get("reserved_bytes") or {}).get("bytes")
    process = (peaks.get("process_bytes") or {}).get("bytes")
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
        "other_processes", "Check what else holds memory on this GPU",
        f"{where}: at the peak the device used {gib(used)}, {gib(others)} more than this run's "
        f"{'allocator and CUDA context' if reserved is not None else 'processes'}. Other processes or another "
        "framework share the GPU ('vramscope watch' lists them).",
        key, others,
    )]


def _tight(dev: dict[str, Any]) -> bool:
    fraction = dev.get("headroom_fraction")
    return fraction is not None and fraction < TIGHT_HEADROOM

