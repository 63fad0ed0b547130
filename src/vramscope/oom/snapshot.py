"""Read torch's allocator snapshot at an OOM: who held what, how fragmented, how short; pure functions."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from vramscope.advice.oom import advise, merge_advice, planner_advice
from vramscope.oom.records import NO_STACK, AllocationSite, OomEvent, OomReport

# Frames that say nothing about *who* asked for memory: torch's own Python and the interpreter.
_SKIP_PARTS = ("/torch/", "\\torch\\", "<frozen ", "/importlib/", "/contextlib.py", "/functools.py")


def _is_torch_internal(filename: str) -> bool:
    return (
        any(part in filename for part in _SKIP_PARTS)
        or filename.endswith((".cpp", ".h", ".cc"))
        or filename
        in (
            "??",
            "",
        )
    )


def _short_path(filename: str) -> str:
    # Keep what identifies the file (package/module.py) and drop the machine-specific prefix.
    for marker in ("site-packages/", "dist-packages/", "/src/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return os.path.basename(filename) or filename


def _frame_text(frame: Mapping[str, Any]) -> str:
    return f"{_short_path(str(frame.get('filename', '?')))}:{frame.get('line', '?')} in {frame.get('name', '?')}"


def site_of(frames: Sequence[Mapping[str, Any]], depth: int = 3) -> tuple[str, tuple[str, ...]]:
    """The allocation site for a stack (innermost frame first, as torch stores it) and its callers."""
    outside = [f for f in frames if not _is_torch_internal(str(f.get("filename", "")))]
    if not outside:
        if frames:  # only torch frames: still better than nothing
            return _frame_text(frames[0]), ()
        return NO_STACK, ()
    return _frame_text(outside[0]), tuple(_frame_text(f) for f in outside[1 : 1 + depth])


def classify_stack(frames: Sequence[Mapping[str, Any]]) -> str:
    """What memory allocated from this stack is, judged from every frame (torch's own included).

    One of ``"optimizer state"``, ``"loss/logits"``, ``"weights (loading)"``, ``"checkpointed
    activations"`` (allocated under ``torch.utils.checkpoint``), ``"activations"`` (anything else with
    a stack: the step's activations and temporaries), or ``"no stack"``.
    """
    if not frames:
        return "no stack"
    files = [str(f.get("filename", "")).replace("\\", "/") for f in frames]
    names = [str(f.get("name", "")) for f in frames]
    if any("/optim/" in f or f.endswith("optimizer.py") for f in files):
        return "optimizer state"
    if any(n in ("from_pretrained", "load_state_dict", "_load_pretrained_model") for n in names):
        return "weights (loading)"
    if any("cross_entropy" in n or "nll_loss" in n for n in names) or any(f.endswith("loss_utils.py") for f in files):
        return "loss/logits"
    if any("utils/checkpoint" in f for f in files):
        return "checkpointed activations"
    return "activations"


def _segments_of(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    segments = list(snapshot.get("segments", []))
    if any("device" in s for s in segments):
        return [s for s in segments if s.get("device", device) == device]
    return segments


def _trace_of(snapshot: Mapping[str, Any], device: int) -> list[Mapping[str, Any]]:
    traces = snapshot.get("device_traces") or []
    if device < len(traces):
        return list(traces[device] or [])
    return []


def build_report(
    snapshot: Mapping[str, Any],
    event: OomEvent,
    *,
    top: int = 10,
    snapshot_file: str | None = None,
    model: Any = None,
    spec: Any = None,
) -> OomReport:
    """Analyse one OOM: ``snapshot`` is ``torch.cuda.memory._snapshot()`` taken at that moment.

    Reserved and allocated come from the snapshot's segments (the allocator's own accounting at the
    moment of the OOM, after it had already returned its fully free segments to CUDA), so what is left
    free inside segments is memory that fragmentation made unusable.

    Args:
        snapshot: torch's snapshot dict (``segments`` with ``blocks`` and ``frames``, ``device_traces``).
        event: what the OOM observer and the training loop reported.
        top: how many allocation sites to keep.
        snapshot_file: where the pickle was written, for the report to point at.
        model: the model for the planner (a registry name such as ``"Llama-2-7B"`` or a config.json
            dict); with it and a ``batch_shape`` in the context, the advice includes the planner's
            recommendations fed with the measured peak and capacity. Also read from the context's
            ``"model"`` key.
        spec: the recipe (:class:`~vramscope.recipe.QLoraSpec`, or its dict) for the planner;
            also read from the context's ``"spec"`` key. Default: the QLoRA reference recipe.
    """
    segments = _segments_of(snapshot, event.device)
    reserved = allocated = free_in_segments = largest_free = 0
    by_site: dict[str, list[int]] = {}
    via_of: dict[str, tuple[str, ...]] = {}
    kinds: dict[str, dict[str, int]] = {}
    checkpointing = False
    for segment in segments:
        reserved += int(segment.get("total_size", 0))
        for block in segment.get("blocks", []):
            size = int(block.get("size", 0))
            state = block.get("state")
            if str(state).startswith("active"):  # active_allocated, or awaiting a free on another stream
                allocated += size
                frames = block.get("frames") or []
                kind = classify_stack(frames)
                checkpointing = checkpointing or kind == "checkpointed activations"
                where, via = site_of(frames)
                entry = by_site.setdefault(where, [0, 0, 0])
                entry[0] += size
                entry[1] += 1
                entry[2] = max(entry[2], size)
                via_of.setdefault(where, via)
                per_kind = kinds.setdefault(where, {})
                per_kind[kind] = per_kind.get(kind, 0) + size
            elif state == "inactive":
                free_in_segments += size
                largest_free = max(largest_free, size)
    sites = sorted(
        (
            AllocationSite(where, via_of[where], b, n, big, max(kinds[where].items(), key=lambda kv: kv[1])[0])
            for where, (b, n, big) in by_site.items()
        ),
        key=lambda s: s.bytes,
        reverse=True,
    )
    unattributed = by_site.get(NO_STACK, [0])[0]

    trace = _trace_of(snapshot, event.device)
    requested = event.requested_bytes
    device_free = event.device_free_bytes
    oom_entries = [e for e in trace if e.get("action") == "oom"]
    if oom_entries:  # the allocator records the failed request itself in the history
        requested = requested if requested is not None else _int(oom_entries[-1].get("size"))
        device_free = device_free if device_free is not None else _int(oom_entries[-1].get("device_free"))
    if event.stats:
        # memory_stats read in the observer is the same instant; prefer it when the snapshot's
        # segments were filtered (another device) or are empty.
        reserved = reserved or int(event.stats.get("reserved_bytes.all.current", 0))
        allocated = allocated or int(event.stats.get("allocated_bytes.all.current", 0))

    capacity = event.capacity_bytes
    outside = None
    if capacity is not None and device_free is not None:
        outside = max(0, capacity - device_free - reserved)
    shortfall = None
    if requested is not None:
        room = largest_free
        if capacity is not None:
            # A new segment can come from what CUDA still has free, within the allowed capacity.
            new_segment = capacity - reserved
            if device_free is not None:
                new_segment = min(new_segment, device_free)
            room = max(room, new_segment)
        shortfall = max(0, requested - room)
    fragmentation = (1.0 - largest_free / free_in_segments) if free_in_segments > 0 else None

    ctx = dict(event.context or {})
    report = OomReport(
        device=event.device,
        kind=event.kind,
        time=event.time,
        message=event.message,
        requested_bytes=requested,
        capacity_bytes=capacity,
        device_free_bytes=device_free,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        free_in_segments_bytes=free_in_segments,
        largest_free_block_bytes=largest_free,
        fragmentation=fragmentation,
        segments=len(segments),
        outside_bytes=outside,
        shortfall_bytes=shortfall,
        step=ctx.get("step"),
        phase=ctx.get("phase"),
        tokens=ctx.get("tokens"),
        batch_shape=_shape(ctx.get("batch_shape")),
        breakdown=ctx.get("breakdown") if isinstance(ctx.get("breakdown"), dict) else None,
        top_sites=tuple(sites[:top]),
        unattributed_bytes=unattributed,
        checkpointing_seen=checkpointing,
        history_entries=len(trace),
        advice=(),
        advice_source="",
        snapshot_file=snapshot_file,
    )
    own = advise(report, sites)
    planned, why_not = planner_advice(
        report, model if model is not None else ctx.get("model"), spec if spec is not None else ctx.get("spec")
    )
    if planned:
        advice = merge_advice(planned, own, report)
        source = "the planner's recommendations fed with the measured peak, plus the snapshot's evidence"
    else:
        advice = own
        source = f"vramscope's rules over the measured numbers ({why_not})"
    return _replace(report, advice=tuple(advice), advice_source=source)


def _replace(report: OomReport, **changes: Any) -> OomReport:
    return replace(report, **changes)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _shape(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return None


def report_from_files(
    snapshot_path: str | os.PathLike[str],
    event_path: str | os.PathLike[str] | None = None,
    *,
    model: Any = None,
    spec: Any = None,
) -> OomReport:
    """Rebuild a report from a snapshot pickle (and the ``*.event.json`` the recorder wrote beside it)."""
    with open(snapshot_path, "rb") as f:
        snapshot = pickle.load(f)  # a file the user points at, written by torch
    event = OomEvent()
    if event_path is not None:
        raw = json.loads(Path(event_path).read_text(encoding="utf-8"))
        event = OomEvent(**{k: v for k, v in raw.items() if k in OomEvent.__dataclass_fields__})
    return build_report(snapshot, event, snapshot_file=str(snapshot_path), model=model, spec=spec)
