"""What an allocator snapshot taken at an OOM shows: who held what, how fragmented, how short; pure functions.

The facts of one OOM (:class:`OomEvent`, what torch's observer and the training loop reported) and torch's
snapshot dict go in; an :class:`OomReport` comes out, as a log's rows go into :class:`~vramscope.analysis.results.
AnalysisResult`. What to do about it is :mod:`vramscope.advice.oom`'s; the post-mortem files that put the two
together are :mod:`vramscope.oom`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class OomEvent:
    """The facts of one OOM, as torch's observer and the training loop reported them.

    ``capacity_bytes`` is what the allocator was allowed to hold: the device's total memory, or the
    per-process limit when ``torch.cuda.set_per_process_memory_fraction`` set one.
    """

    device: int = 0
    kind: str = "cuda_allocator"
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    device_free_bytes: int | None = None
    time: float | None = None
    message: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)  # step, phase, tokens, batch_shape
    stats: Mapping[str, int] = field(default_factory=dict)  # torch.cuda.memory_stats at that moment

    def to_json(self, snapshot_file: str) -> dict[str, Any]:
        """The ``oom-N.event.json`` the recorder writes beside the snapshot: these fields and the snapshot's path."""
        return {**asdict(self), "snapshot_file": snapshot_file}

    @classmethod
    def from_json(cls, data: object) -> tuple[OomEvent, str | None]:
        """An event file read back: the event and the snapshot it names (None when it names none). Keys it does not
        know are passed over, so a file of a later version still reads.

        Raises:
            ValueError: not a JSON object.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"an OOM event file holds a JSON object, not {type(data).__name__}")
        event = cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        snapshot = data.get("snapshot_file")
        return event, None if snapshot is None else str(snapshot)


@dataclass(frozen=True)
class AllocationSite:
    """Live memory at the OOM grouped by where it was allocated (the innermost frame outside torch)."""

    where: str
    via: tuple[str, ...]  # the next frames outwards, for context
    bytes: int
    blocks: int
    largest_bytes: int
    kind: str = "activations"  # what the whole stack says it is: see :func:`classify_stack`


@dataclass(frozen=True)
class OomReport:
    device: int
    kind: str
    time: float | None
    message: str | None
    requested_bytes: int | None
    capacity_bytes: int | None
    device_free_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    free_in_segments_bytes: int  # cached by the allocator but not in use (after its own cache flush)
    largest_free_block_bytes: int
    fragmentation: float | None  # 1 - largest free block / free in segments; None when nothing is free
    segments: int
    outside_bytes: int | None  # device memory held outside this process's PyTorch allocator
    shortfall_bytes: int | None  # how much more would have been needed for this one request
    step: Any
    phase: Any
    tokens: Any
    batch_shape: Any
    top_sites: tuple[AllocationSite, ...]
    unattributed_bytes: int  # live blocks without a Python stack
    checkpointing_seen: bool  # torch.utils.checkpoint frames among the live blocks' stacks
    history_entries: int
    snapshot_file: str | None = None
    breakdown: dict[str, Any] | None = None  # what the model and optimizer held (MemoryBreakdown.to_dict())
    # Every site, not only the top ones: the advice weighs all live memory by kind. Not in the JSON, which keeps
    # the top sites (a snapshot can have thousands).
    sites: tuple[AllocationSite, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, without :attr:`sites`."""
        out = asdict(self)
        del out["sites"]
        return out


NO_STACK = "(no Python stack: allocated before recording began, e.g. weights, or by autograd's backward thread)"


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
    return OomReport(
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
        snapshot_file=snapshot_file,
        sites=tuple(sites),
    )


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
