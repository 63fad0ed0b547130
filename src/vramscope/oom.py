"""Explain an out-of-memory error: what was asked, what was held, by whom, and what to change.

Three parts, split so that the analysis can be tested without a GPU:

* :func:`oom_kind` recognises every form an OOM takes in PyTorch training (the caching allocator's
  ``torch.OutOfMemoryError``, and the cuBLAS / cuDNN / CUDA runtime allocation failures that arrive
  as plain ``RuntimeError`` messages). The tuner uses it too.
* :class:`OomRecorder` (needs CUDA) records torch's allocator history into a bounded ring buffer
  (``torch.cuda.memory._record_memory_history(max_entries=...)``) and, from torch's OOM observer
  (``torch._C._cuda_attach_out_of_memory_observer``), writes at the moment of the OOM a snapshot pickle
  that https://pytorch.org/memory_viz opens, plus a Markdown and an HTML report.
* :func:`build_report` turns a snapshot dict (torch's format) and the OOM's facts into an
  :class:`OomReport`; :func:`render_markdown` and :func:`render_html` print it. All three are pure.

Imports torch lazily: importing this module costs nothing on a machine without it.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import math
import os
import pickle
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vramscope.types import MemoryBreakdown
from vramscope.units import human

log = logging.getLogger(__name__)

ENV_VAR = "VRAMSCOPE_OOM_SNAPSHOT"
"""``vramscope run --oom-snapshot DIR`` sets this to DIR's absolute path for the child; a training
process that sees it records allocator history and writes OOM post-mortems into DIR."""
ENV_MAX_ENTRIES = "VRAMSCOPE_OOM_MAX_ENTRIES"
"""Optional: the history ring buffer's size (alloc/free events kept), default :data:`DEFAULT_MAX_ENTRIES`."""

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_DIR = "vramscope-oom"


def snapshot_env(out_dir: str | None, log_path: str | None = None) -> dict[str, str]:
    """The child environment for ``vramscope run --oom-snapshot [DIR]``: ``{ENV_VAR: absolute DIR}``.

    Without DIR the post-mortems go beside the log (``mem.csv`` -> ``mem.oom/``), else into
    ``./vramscope-oom``. The folder is created now, so a path that cannot be written fails before
    the command starts.

    Raises:
        ValueError: with a message that says what to do.
    """
    if out_dir:
        target = Path(out_dir)
    elif log_path:
        log = Path(log_path)
        target = log.with_name((log.stem if log.suffix else log.name) + ".oom")
    else:
        target = Path(DEFAULT_DIR)
    target = target.resolve()  # the child may change directory
    if target.exists() and not target.is_dir():
        raise ValueError(f"--oom-snapshot {target} is a file; give a folder for the OOM post-mortems")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cannot create {target} for OOM post-mortems: {exc.strerror or exc}; choose a writable folder"
        ) from None
    return {ENV_VAR: str(target)}


# (substring of the error message, kind). Exact texts as PyTorch and the NVIDIA libraries print them:
# torch's caching allocator raises torch.OutOfMemoryError("CUDA out of memory. Tried to allocate ...");
# TORCH_CUDABLAS_CHECK prints "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`";
# AT_CUDNN_CHECK prints "cuDNN error: " + cudnnGetErrorString(status), which is CUDNN_STATUS_ALLOC_FAILED
# up to cuDNN 8 and CUDNN_STATUS_INTERNAL_ERROR_{DEVICE,HOST}_ALLOCATION_FAILED from cuDNN 9; a raw
# cudaMalloc failure outside the allocator prints cudaGetErrorString's "out of memory".
_OOM_MESSAGES: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "cuda_allocator"),
    ("HIP out of memory", "cuda_allocator"),
    ("CUBLAS_STATUS_ALLOC_FAILED", "cublas"),
    ("CUBLASLT_STATUS_ALLOC_FAILED", "cublas"),
    ("CUDNN_STATUS_ALLOC_FAILED", "cudnn"),
    ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "cudnn"),
    ("CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", "cudnn"),
    # cuDNN's answer when no algorithm's workspace fits; accelerate and Lightning count it as an OOM
    # too, so the tuner behaves like them here.
    ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input", "cudnn"),
    ("CUSOLVER_STATUS_ALLOC_FAILED", "cusolver"),
    ("CUFFT_ALLOC_FAILED", "cufft"),
    ("CUDA error: out of memory", "cuda_runtime"),
)

OOM_KINDS = ("cuda_allocator", "cublas", "cudnn", "cusolver", "cufft", "cuda_runtime")


def oom_kind(exc: BaseException) -> str | None:
    """Which kind of GPU out-of-memory ``exc`` is, or None when it is not one.

    ``torch.OutOfMemoryError`` is recognised by type (without importing torch); the library
    failures by their exact status names, so an unrelated ``RuntimeError`` that merely contains the
    words "out of memory" is not mistaken for one.
    """
    if any(cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch") for cls in type(exc).__mro__):
        return "cuda_allocator"
    if not isinstance(exc, RuntimeError):
        return None
    message = str(exc)
    for needle, kind in _OOM_MESSAGES:
        if needle in message:
            return kind
    return None


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is any form of GPU out-of-memory (see :func:`oom_kind`)."""
    return oom_kind(exc) is not None


# --------------------------------------------------------------------------------------------------
# The report: pure functions over torch's snapshot format
# --------------------------------------------------------------------------------------------------


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
class Advice:
    """One ranked way out. ``sufficient``: whether this change alone would have avoided this OOM."""

    key: str  # stable name: micro_batch, seq_len, gradient_checkpointing, expandable_segments, ...
    title: str
    detail: str
    saves_bytes: int | None = None  # estimated memory it frees at the peak, when it can be estimated
    source: str = "snapshot"  # "snapshot" (vramscope's rules over the measured numbers) or "planner"
    sufficient: bool | None = None


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
    advice: tuple[Advice, ...]
    advice_source: str
    snapshot_file: str | None = None
    breakdown: dict[str, Any] | None = None  # what the model and optimizer held (MemoryBreakdown.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        spec: the recipe (:class:`~vramscope.integrations.qlora.QLoraSpec`, or its dict) for the planner;
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
    from dataclasses import replace

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


def advise(report: OomReport, sites: Sequence[AllocationSite] | None = None) -> list[Advice]:
    """Ranked advice from the report's measured numbers alone (vramscope's rules; no planner involved).

    Each rule estimates what it would free at the peak. The estimates are first-order: the live
    memory split by allocation site tells activations (what scales with batch and length) from
    optimizer state and from memory without a Python stack (weights loaded before recording,
    gradients written by autograd's C++ thread).
    """
    sites = list(sites if sites is not None else report.top_sites)
    need = (report.requested_bytes or 0) + report.allocated_bytes
    capacity = report.capacity_bytes
    outside = report.outside_bytes or 0
    over = _shortfall(report)
    attributed = [s for s in sites if s.where != NO_STACK]
    optimizer_bytes = sum(s.bytes for s in attributed if s.kind == "optimizer state")
    loss_sites = [s for s in attributed if s.kind == "loss/logits"]
    # Memory with a Python stack that is neither optimizer state nor model loading: the step's
    # activations and temporaries, i.e. what scales with the batch; plus the request that failed.
    scaling = ("activations", "checkpointed activations", "loss/logits")
    activation_bytes = sum(s.bytes for s in attributed if s.kind in scaling) + (report.requested_bytes or 0)
    out: list[Advice] = []

    frag_free = report.free_in_segments_bytes
    if report.requested_bytes is not None and frag_free >= report.requested_bytes > report.largest_free_block_bytes:
        out.append(
            Advice(
                "expandable_segments",
                "Let the allocator grow segments instead of splitting them",
                f"{human(frag_free)} was free inside the allocator's segments, enough for the "
                f"{human(report.requested_bytes)} request, but the largest free piece was "
                f"{human(report.largest_free_block_bytes)} (fragmentation {report.fragmentation or 0:.0%}). "
                "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting the process.",
                frag_free,
            )
        )
    elif report.fragmentation is not None and report.fragmentation > 0.3 and frag_free > 256 * 1024**2:
        out.append(
            Advice(
                "expandable_segments",
                "Reduce fragmentation",
                f"{human(frag_free)} sat free but split inside segments (fragmentation {report.fragmentation:.0%}). "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually reclaims most of it.",
                frag_free,
            )
        )

    shape = report.batch_shape
    target = over if over else (report.requested_bytes or 0)
    if shape and activation_bytes > 0:
        batch = shape[0]
        per_sample = activation_bytes / batch if batch else 0.0
        if batch > 1 and per_sample > 0:
            from vramscope.tuner import split_batch  # here: the tuner imports this module

            drop = max(1, math.ceil(target / per_sample)) if target else 1
            micro, accum = split_batch(batch, max(1, batch - drop))
            out.append(
                Advice(
                    "micro_batch",
                    f"Lower the micro-batch from {batch} to {micro}, with gradient accumulation {accum}",
                    f"About {human(per_sample)} per sample is activations and step temporaries "
                    f"({human(activation_bytes)} at batch {batch}); {micro} x {accum} accumulation steps keeps "
                    f"the effective batch at {micro * accum}. `vramscope tune` finds the exact largest batch in "
                    "a few steps.",
                    int(per_sample * (batch - micro)),
                )
            )
        if len(shape) > 1 and shape[1] > 1:
            seq = shape[1]
            per_token = activation_bytes / seq
            cut = max(1, math.ceil(target / per_token)) if target else seq // 4
            new_seq = max(1, seq - cut)
            new_seq = (new_seq // 64) * 64 or new_seq  # a multiple of 64 suits the kernels, when one is left
            out.append(
                Advice(
                    "seq_len",
                    f"Shorten sequences from {seq} to {new_seq} tokens",
                    "Activations grow at least linearly with sequence length (quadratically with eager "
                    "attention); truncating or packing to a shorter length frees about "
                    f"{human(per_token * (seq - new_seq))}.",
                    int(per_token * (seq - new_seq)),
                )
            )

    if not report.checkpointing_seen and activation_bytes > 0.3 * max(need, 1):
        out.append(
            Advice(
                "gradient_checkpointing",
                "Turn on gradient checkpointing",
                "No torch.utils.checkpoint frames among the live allocations, and activations are "
                f"{human(activation_bytes)} of the {human(need)} needed. model.gradient_checkpointing_enable() "
                "(TrainingArguments(gradient_checkpointing=True)) keeps one tensor per layer and recomputes the rest.",
                int(activation_bytes * 0.6),
            )
        )

    loss_bytes = sum(s.bytes for s in loss_sites)
    if loss_sites and loss_bytes > 0.1 * max(need, 1):
        out.append(
            Advice(
                "loss_chunking",
                "Shrink the loss over the vocabulary",
                f"{human(loss_bytes)} is live at the logits/loss ({loss_sites[0].where}). The logits are "
                "batch x sequence x vocabulary, often upcast to fp32: compute the loss in chunks or with a "
                "fused linear-cross-entropy kernel, or lower batch x sequence.",
                loss_bytes // 2,
            )
        )

    if optimizer_bytes > 0.1 * max(need, 1):
        out.append(
            Advice(
                "optimizer",
                "Use an 8-bit or paged optimizer",
                f"{human(optimizer_bytes)} is optimizer state. bitsandbytes' paged_adamw_8bit keeps it in "
                "8 bits (about a quarter of 32-bit Adam) and pages it to host memory under pressure.",
                int(optimizer_bytes * 0.75),
            )
        )

    if capacity is not None and outside > max(1024**3, 0.05 * capacity):
        out.append(
            Advice(
                "outside_memory",
                "Free the memory held outside this process's PyTorch allocator",
                f"{human(outside)} of the {human(capacity)} was not in this process's allocator: other processes, "
                "the CUDA context, library workspaces, or bitsandbytes' paged buffers. Check `vramscope watch` or "
                "nvidia-smi for other processes on this GPU.",
                outside,
            )
        )
    return rank_advice([_judged(a, over) for a in out])


def _judged(advice: Advice, over: int | None) -> Advice:
    if advice.sufficient is not None or over is None or advice.saves_bytes is None:
        return advice
    from dataclasses import replace

    return replace(advice, sufficient=advice.saves_bytes >= over)


def rank_advice(items: Iterable[Advice]) -> list[Advice]:
    """Changes that alone would have avoided the OOM first, then by the memory they free."""
    return sorted(items, key=lambda a: (0 if a.sufficient else 1, -(a.saves_bytes or 0)))


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
        title, _, saving = r.text.rpartition(": saves ")
        title = title or r.text
        detail = (
            f"saves {saving or human(r.saving_bytes)} as predicted by the planner for batch {shape[0]} x "
            f"{shape[1]} tokens; the measured need was {human(peak)} against a capacity of "
            f"{human(report.capacity_bytes)}."
        )
        out.append(Advice(r.name, title[:1].upper() + title[1:], detail, int(r.saving_bytes), "planner", r.sufficient))
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


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def _facts(report: OomReport) -> list[tuple[str, str]]:
    rows = [
        ("Kind", report.kind),
        ("Requested", human(report.requested_bytes)),
        ("Capacity (allowed for the allocator)", human(report.capacity_bytes)),
        ("Free on the device (CUDA)", human(report.device_free_bytes)),
        ("Reserved by PyTorch", human(report.reserved_bytes)),
        ("Allocated (in use by tensors)", human(report.allocated_bytes)),
        ("Free inside reserved segments", human(report.free_in_segments_bytes)),
        ("Largest free block", human(report.largest_free_block_bytes)),
        ("Fragmentation", "-" if report.fragmentation is None else f"{report.fragmentation:.0%}"),
        ("Held outside PyTorch's allocator", human(report.outside_bytes)),
        ("Short by", human(report.shortfall_bytes)),
        ("Step", _text(report.step)),
        ("Phase", _text(report.phase)),
        ("Tokens in the batch", _text(report.tokens)),
        ("Batch shape", "-" if report.batch_shape is None else " x ".join(str(d) for d in report.batch_shape)),
        ("Segments", str(report.segments)),
        ("History events kept", str(report.history_entries)),
    ]
    return rows


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _breakdown_rows(report: OomReport) -> list[tuple[str, str]]:
    """What the model's and optimizer's own tensors held when memory ran out (empty when unknown)."""
    if report.breakdown is None:
        return []
    try:
        found = MemoryBreakdown.from_dict(report.breakdown)
    except (ValueError, TypeError):
        return []
    return [(label, "-" if value is None else human(value)) for label, value in found.rows()]


def _md(text: str) -> str:
    # Text from the snapshot (file and function names) goes into Markdown that renderers may turn into
    # HTML: escape markup, keep table cells intact (pipes) and on one line.
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _advice_tail(a: Advice) -> str:
    parts = []
    if a.saves_bytes:
        parts.append(f"frees about {human(a.saves_bytes)}")
    if a.sufficient is not None:
        parts.append("enough on its own" if a.sufficient else "not enough alone")
    parts.append(a.source)
    return f" ({'; '.join(parts)})"


def render_markdown(report: OomReport) -> str:
    """The report as Markdown (GitHub tables)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.time)) if report.time else "unknown time"
    lines = [f"# CUDA out of memory on GPU {report.device}", "", f"_{when}_", ""]
    if report.message:
        lines += ["```", report.message.strip().splitlines()[0][:500].replace("`", "'"), "```", ""]
    lines += ["## At the moment of the OOM", "", "| | |", "|---|---|"]
    lines += [f"| {_md(k)} | {_md(v)} |" for k, v in _facts(report)]
    held = _breakdown_rows(report)
    if held:
        lines += ["", "## What held memory (the model's and the optimizer's tensors, the run's peak)", "",
                  "| | |", "|---|---|"]
        lines += [f"| {_md(k)} | {_md(v)} |" for k, v in held]
    lines += ["", "## Where the memory was allocated", ""]
    if report.top_sites:
        lines += ["| Site | Called from | What | Live | Blocks | Largest |", "|---|---|---|---:|---:|---:|"]
        for s in report.top_sites:
            lines.append(
                f"| {_md(s.where)} | {_md(' <- '.join(s.via) or '-')} | {_md(s.kind)} | {human(s.bytes)} | "
                f"{s.blocks} | {human(s.largest_bytes)} |"
            )
    else:
        lines.append("No live blocks in the snapshot.")
    lines += ["", "## What to change, ranked", "", f"_Advice: {_md(report.advice_source)}._", ""]
    if report.advice:
        for i, a in enumerate(report.advice, 1):
            lines.append(f"{i}. **{_md(a.title)}**{_advice_tail(a)}: {_md(a.detail)}")
    else:
        lines.append("No rule applied; open the snapshot in https://pytorch.org/memory_viz to look at the timeline.")
    if report.snapshot_file:
        lines += [
            "",
            f"Snapshot: `{report.snapshot_file}`; drag it onto https://pytorch.org/memory_viz, or run "
            f"`python -m torch.cuda._memory_viz trace_plot {report.snapshot_file} -o oom.html`.",
        ]
    return "\n".join(lines) + "\n"


def render_html(report: OomReport) -> str:
    """The report as one self-contained HTML page; every value from the snapshot is escaped."""
    e = html.escape
    facts = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _facts(report))
    held = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _breakdown_rows(report))
    sites = "".join(
        f"<tr><td><code>{e(s.where)}</code></td><td><code>{e(' <- '.join(s.via) or '-')}</code></td>"
        f"<td>{e(s.kind)}</td>"
        f"<td class=n>{e(human(s.bytes))}</td><td class=n>{s.blocks}</td>"
        f"<td class=n>{e(human(s.largest_bytes))}</td></tr>"
        for s in report.top_sites
    )
    advice = "".join(
        f"<li><b>{e(a.title)}</b>"
        + (f" <i>{e(_advice_tail(a).strip())}</i>" if _advice_tail(a) else "")
        + f": {e(a.detail)}</li>"
        for a in report.advice
    )
    message = f"<pre>{e(report.message.strip().splitlines()[0][:500])}</pre>" if report.message else ""
    snap = (
        f"<p>Snapshot: <code>{e(report.snapshot_file)}</code>; open it in "
        "<a href='https://pytorch.org/memory_viz'>pytorch.org/memory_viz</a>.</p>"
        if report.snapshot_file
        else ""
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>CUDA out of memory on GPU {report.device}</title><style>"
        "body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
        "td.n{text-align:right}code{font-size:.9em}</style></head><body>"
        f"<h1>CUDA out of memory on GPU {report.device}</h1>{message}"
        f"<h2>At the moment of the OOM</h2><table>{facts}</table>"
        + (f"<h2>What held memory</h2><table>{held}</table>" if held else "")
        + "<h2>Where the memory was allocated</h2>"
        "<table><tr><th>Site</th><th>Called from</th><th>What</th><th>Live</th><th>Blocks</th><th>Largest</th></tr>"
        f"{sites}</table>"
        f"<h2>What to change, ranked</h2><p><i>Advice: {e(report.advice_source)}.</i></p><ol>{advice}</ol>{snap}"
        "</body></html>\n"
    )


def write_report(report: OomReport, out_dir: str | os.PathLike[str], stem: str) -> dict[str, Path]:
    """Write ``stem.md``, ``stem.html`` and ``stem.json`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / f"{stem}.md", "html": out / f"{stem}.html", "json": out / f"{stem}.json"}
    paths["md"].write_text(render_markdown(report), encoding="utf-8")
    paths["html"].write_text(render_html(report), encoding="utf-8")
    paths["json"].write_text(json.dumps(report.to_dict(), indent=2, default=str), encoding="utf-8")
    return paths


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


# --------------------------------------------------------------------------------------------------
# Recording on a real GPU
# --------------------------------------------------------------------------------------------------

_listeners: list[Callable[[int, int, int, int], None]] = []
_attached = False
_lock = threading.Lock()
_recording = 0  # recorders started and not stopped: history stays on until the last one stops


def add_oom_listener(listener: Callable[[int, int, int, int], None]) -> Callable[[], None]:
    """Call ``listener(device, requested, capacity, device_free)`` on every caching-allocator OOM.

    torch keeps observers for the life of the process and has no way to detach one, so vramscope
    attaches a single dispatcher once and this returns a function that removes ``listener`` from it.
    """
    global _attached
    import torch

    with _lock:
        if not _attached:
            # Private but stable since torch 2.0; the observer runs with the GIL, outside the allocator lock.
            attach: Any = getattr(torch._C, "_cuda_attach_out_of_memory_observer")  # noqa: B009
            attach(_dispatch)
            _attached = True
        _listeners.append(listener)

    def remove() -> None:
        with _lock, contextlib.suppress(ValueError):
            _listeners.remove(listener)

    return remove


def _dispatch(device: int, requested: int, capacity: int, device_free: int) -> None:
    # Runs inside the allocator's malloc, before torch raises the OOM: never let an error escape,
    # or it would replace the OutOfMemoryError the program is about to see.
    for listener in list(_listeners):
        try:
            listener(int(device), int(requested), int(capacity), int(device_free))
        except Exception:  # pragma: no cover - defensive
            log.exception("vramscope: OOM listener failed")


class OomRecorder:
    """Record allocator history and write a post-mortem when CUDA runs out of memory.

    ``start()`` turns on torch's allocator history with a ring buffer of ``max_entries`` alloc/free
    events (older ones are overwritten, so memory stays bounded) and attaches to torch's OOM
    observer. On an OOM it writes, into ``out_dir``: ``oom-<n>-snapshot.pickle`` (open it in
    https://pytorch.org/memory_viz), ``oom-<n>.md``, ``oom-<n>.html``, ``oom-<n>.json`` and
    ``oom-<n>.event.json``. At most ``max_reports`` post-mortems are written per recorder, so a loop
    that catches OOMs does not fill the disk.

    Args:
        out_dir: where the files go (created when needed).
        context: called at the moment of the OOM; returns ``{"step", "phase", "tokens", "batch_shape"}``.
        max_entries: the history ring buffer's size.
        max_reports: post-mortems to write at most.
        stacks: ``"python"`` (cheaper) or ``"all"`` (adds C++ frames, so backward allocations get stacks too).
        device: the CUDA device; None means the current one.
        model: for the planner's advice: a registry name or a config.json dict (or put ``"model"`` in
            the context).
        spec: the recipe for the planner (``QLoraSpec`` or its dict); default the QLoRA reference recipe.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        context: Callable[[], Mapping[str, Any]] | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_reports: int = 3,
        stacks: str = "python",
        device: int | None = None,
        model: Any = None,
        spec: Any = None,
    ) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        self.out_dir = Path(out_dir)
        self.context = context
        self.max_entries = int(max_entries)
        self.max_reports = int(max_reports)
        self.stacks = stacks
        self.device = device
        self.model = model
        self.spec = spec
        self.reports: list[Path] = []
        self._remove: Callable[[], None] | None = None
        self._count = 0
        self._pending: OomEvent | None = None

    @classmethod
    def from_env(
        cls, context: Callable[[], Mapping[str, Any]] | None = None, environ: Mapping[str, str] | None = None
    ) -> OomRecorder | None:
        """The recorder ``vramscope run --oom-snapshot DIR`` asked for, or None when it did not."""
        env = os.environ if environ is None else environ
        out = env.get(ENV_VAR)
        if not out:
            return None
        try:
            entries = int(env.get(ENV_MAX_ENTRIES, DEFAULT_MAX_ENTRIES))
        except ValueError:
            entries = DEFAULT_MAX_ENTRIES
        return cls(out, context=context, max_entries=entries)

    @property
    def active(self) -> bool:
        return self._remove is not None

    def start(self) -> None:
        """Begin recording (idempotent). Raises RuntimeError when torch sees no CUDA device."""
        if self._remove is not None:
            return
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("OOM snapshots need a CUDA GPU, and torch sees none")
        global _recording
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with _lock:
            # History is one per process; with several recorders the last one started sets its size.
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks=self.stacks, max_entries=self.max_entries
            )
            _recording += 1
        self._remove = add_oom_listener(self._on_oom)

    def stop(self) -> None:
        """Stop recording and detach (idempotent); files already written stay."""
        if self._remove is None:
            return
        import torch

        global _recording
        self._remove()
        self._remove = None
        with _lock:
            _recording -= 1
            if _recording == 0:  # another recorder still running keeps the history it needs
                torch.cuda.memory._record_memory_history(enabled=None)

    def __enter__(self) -> OomRecorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_oom(self, device: int, requested: int, capacity: int, device_free: int) -> None:
        if self.device is not None and device != self.device:
            return
        self.write(
            OomEvent(device=device, requested_bytes=requested, capacity_bytes=capacity, device_free_bytes=device_free)
        )

    def record_exception(self, exc: BaseException) -> Path | None:
        """Write a post-mortem for an OOM the allocator's observer does not see (cuBLAS, cuDNN, raw CUDA).

        For ``torch.OutOfMemoryError`` the observer already wrote one; this only adds the message.
        Call it from an ``except`` block, before the stack unwinds further.
        """
        kind = oom_kind(exc)
        if kind is None or self._remove is None:
            return None
        if kind == "cuda_allocator":
            return self._annotate_last(str(exc))
        import torch

        device = self.device if self.device is not None else torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(device)
        return self.write(
            OomEvent(device=device, kind=kind, capacity_bytes=total, device_free_bytes=free, message=str(exc))
        )

    def _annotate_last(self, message: str) -> Path | None:
        if not self.reports:
            return None
        event_file = self.reports[-1].with_suffix(".event.json")
        try:
            raw = json.loads(event_file.read_text(encoding="utf-8"))
            raw["message"] = message
            event_file.write_text(json.dumps(raw, indent=2, default=str), encoding="utf-8")
            report = report_from_files(Path(raw["snapshot_file"]), event_file, model=self.model, spec=self.spec)
            write_report(report, self.out_dir, self.reports[-1].stem)
        except (OSError, ValueError, KeyError) as exc:  # pragma: no cover - best effort
            log.warning("vramscope: could not add the OOM message to %s: %s", event_file, exc)
        return self.reports[-1]

    def write(self, event: OomEvent) -> Path | None:
        """Take the snapshot now and write the post-mortem; returns the Markdown report's path."""
        if self._count >= self.max_reports:
            return None
        self._count += 1
        try:
            import torch

            stats = {k: int(v) for k, v in torch.cuda.memory_stats(event.device).items() if isinstance(v, int)}
            ctx: dict[str, Any] = {}
            if self.context is not None:
                try:
                    ctx = dict(self.context())
                except Exception as exc:  # the monitor's state must not stop the post-mortem
                    ctx = {"context_error": repr(exc)}
            event = OomEvent(
                device=event.device,
                kind=event.kind,
                requested_bytes=event.requested_bytes,
                capacity_bytes=event.capacity_bytes,
                device_free_bytes=event.device_free_bytes,
                time=time.time(),
                message=event.message,
                context=ctx,
                stats=stats,
            )
            snapshot = torch.cuda.memory._snapshot()
            stem = f"oom-{self._count}"
            snap_path = self.out_dir / f"{stem}-snapshot.pickle"
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(snap_path, "wb") as f:
                pickle.dump(snapshot, f)
            (self.out_dir / f"{stem}.event.json").write_text(
                json.dumps({**asdict(event), "snapshot_file": str(snap_path)}, indent=2, default=str),
                encoding="utf-8",
            )
            report = build_report(snapshot, event, snapshot_file=str(snap_path), model=self.model, spec=self.spec)
            paths = write_report(report, self.out_dir, stem)
            self.reports.append(paths["md"])
            log.warning("vramscope: CUDA out of memory; post-mortem in %s", paths["md"])
            return paths["md"]
        except Exception:
            log.exception("vramscope: could not write the OOM post-mortem")
            return None
