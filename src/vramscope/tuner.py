"""Find the largest batch (or sequence length) that fits, in a few real steps instead of a walk through OOMs.

How: run one real step at a small size and measure how far the step's peak *reserve* rises above
the memory reserved before it. The reserve, not the allocation, is what the capacity limits: the
caching allocator holds allocated blocks plus cached and rounded-up ones (on the H200, TinyLlama
QLoRA batch 8 OOMed with its allocated peak 0.8 GB under the cap). If all of that rise scaled with
the batch, ``start * room / rise`` samples would fit; the rise also has a fixed part, but the
allocator's overhead grows with the tensors' size, so the second step runs there with
:data:`FAR_PROBE_HEADROOM` kept spare: a safe, far point. The two measured reserve peaks give a
line (reserve vs batch); the third step runs at the largest batch the line says fits while keeping
``margin`` of the capacity free. If that step runs out of memory or
eats into the margin, the search backs off along the corrected line, inside the bracket of sizes
already known to fit and to fail. Every OOM form counts (:func:`vramscope.oom.oom_kind`), and memory
is released after every trial, so no OOM is left behind.

The search itself (:func:`search`) is pure: it sees the hardware only through a :class:`MemoryProbe`.
:class:`CudaProbe` is torch's CUDA caching allocator (imported lazily, so ``import vramscope.tuner``
needs no torch).
"""

from __future__ import annotations

import gc
import logging
import math
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from vramscope.oom.classify import oom_kind
from vramscope.tune.batching import split_batch

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_TRIALS = 5
# The second (far) probe assumes the reserve rises this much faster than the larger of the first
# probe's reserve and allocated rises. Why: a step's reserve/allocated ratio grows with the tensors'
# size (tests/data/planner/h200_measurements.csv: 0.3-1.0x at batch 1 x 512 tokens, where cached
# weight blocks are reused, up to 1.39x at Mistral-7B batch 8 x 1024), and the far probe must not OOM.
FAR_PROBE_HEADROOM = 0.4


class MemoryProbe(Protocol):
    """The hardware boundary: what the search reads from the device between and during trials.

    All values are bytes. ``peak_bytes`` is the highest allocation since the last ``reset_peak``;
    ``reserved_bytes`` / ``peak_reserved_bytes`` the same for what the allocator holds from the device
    (allocated plus cached and rounded blocks), which is what ``capacity_bytes`` limits.
    """

    def capacity_bytes(self) -> int: ...

    def allocated_bytes(self) -> int: ...

    def reserved_bytes(self) -> int: ...

    def reset_peak(self) -> None: ...

    def peak_bytes(self) -> int: ...

    def peak_reserved_bytes(self) -> int: ...

    def release(self) -> None: ...


class CudaProbe:
    """torch's CUDA caching allocator on one device.

    The capacity is what this process's allocator can hold: free device memory plus what it already
    reserved, capped by the per-process fraction (``torch.cuda.set_per_process_memory_fraction``) and
    by ``limit_bytes`` when given. torch enforces the per-process fraction on the allocator's
    *reserve* (``memory_reserved``), so the search measures and predicts reserved memory against it.

    Args:
        device: CUDA device index; None means the current device.
        limit_bytes: plan for at most this much (does not enforce it; the CLI's ``--memory-limit`` sets
            torch's per-process fraction so that an OOM really happens there).
    """

    def __init__(self, device: int | None = None, limit_bytes: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("finding the largest batch needs a CUDA GPU, and torch sees none")
        self._torch: Any = torch
        self.device = torch.cuda.current_device() if device is None else int(device)
        self.limit_bytes = limit_bytes

    def capacity_bytes(self) -> int:
        cuda = self._torch.cuda
        self.release()
        free, total = cuda.mem_get_info(self.device)
        capacity = int(free) + int(cuda.memory_reserved(self.device))
        # Recent torch can say what set_per_process_memory_fraction set; older torch cannot, and then
        # only limit_bytes knows about such a cap.
        get_fraction = getattr(cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            capacity = min(capacity, int(float(get_fraction(self.device)) * int(total)))
        if self.limit_bytes is not None:
            capacity = min(capacity, int(self.limit_bytes))
        return capacity

    def allocated_bytes(self) -> int:
        return int(self._torch.cuda.memory_allocated(self.device))

    def reserved_bytes(self) -> int:
        return int(self._torch.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        # Resets the allocated and the reserved peak alike; release() ran empty_cache() just before,
        # so the reserve starts at what live tensors need and its peak reflects this trial only.
        self._torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self.device))

    def peak_reserved_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_reserved(self.device))

    def release(self) -> None:
        gc.collect()
        self._torch.cuda.synchronize(self.device)
        self._torch.cuda.empty_cache()


@dataclass(frozen=True)
class Trial:
    """One real step at one size."""

    size: int
    ok: bool  # the step finished
    base_bytes: int  # allocated before the step (weights, optimizer state, ...)
    peak_bytes: int | None  # highest allocation during the step; None when it ran out of memory
    seconds: float
    error: str | None = None  # OOM kind and the message's first line
    after_bytes: int | None = None  # allocated after the step, once released (state the step created)
    # The same three for the allocator's reserve (None from a probe or caller that cannot tell).
    base_reserved_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    after_reserved_bytes: int | None = None

    @property
    def rise_bytes(self) -> int | None:
        return None if self.peak_bytes is None else self.peak_bytes - self.base_bytes

    @property
    def reserve_rise_bytes(self) -> int | None:
        if self.peak_reserved_bytes is None or self.base_reserved_bytes is None:
            return None
        return self.peak_reserved_bytes - self.base_reserved_bytes

    def limited(self) -> tuple[int, int | None, int | None]:
        """``(base, peak, after)`` of what the capacity limits: the reserve when known, else allocation."""
        if self.base_reserved_bytes is not None and (self.peak_reserved_bytes is not None or not self.ok):
            return self.base_reserved_bytes, self.peak_reserved_bytes, self.after_reserved_bytes
        return self.base_bytes, self.peak_bytes, self.after_bytes


@dataclass(frozen=True)
class TuneResult:
    """What the search found.

    ``batch_size`` (also ``size``) is the largest size run for real whose peak reserve kept ``margin``
    of the capacity free; ``limit_size`` the largest that ran at all. ``predicted_max`` is the fitted line's
    zero-margin maximum. With ``target_batch``, ``micro_batch`` x ``grad_accum_steps`` reaches it.
    """

    size: int
    margin: float
    margin_bytes: int  # the capacity the margin keeps free
    capacity_bytes: int
    peak_bytes: int | None  # measured allocated peak at ``size``
    headroom_bytes: int | None  # capacity - peak reserve at ``size`` (- allocated peak without a reserve)
    limit_size: int
    predicted_max: int | None
    fixed_bytes: float | None  # fitted: peak reserve rise independent of size
    bytes_per_unit: float | None  # fitted: peak reserve rise per sample (or per token)
    trials: tuple[Trial, ...]
    ooms: int
    seconds: float
    capped: bool = False  # reached max_batch / max_len: more may fit
    target_batch: int | None = None
    micro_batch: int | None = None
    grad_accum_steps: int | None = None
    notes: tuple[str, ...] = ()
    unit: str = "batch"
    peak_reserved_bytes: int | None = None  # measured peak reserve at ``size``

    @property
    def batch_size(self) -> int:
        return self.size

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["trials"] = [
            dict(asdict(t), rise_bytes=t.rise_bytes, reserve_rise_bytes=t.reserve_rise_bytes) for t in self.trials
        ]
        out["batch_size" if self.unit == "batch" else "seq_len"] = self.size
        return out


class NoSizeFitsError(RuntimeError):
    """Even the smallest size ran out of memory."""


@dataclass
class _Line:
    """rise(x) = fixed + per_unit * x**degree (degree 1, or 2 for eager attention over sequence length)."""

    fixed: float
    per_unit: float
    degree: int = 1

    def rise(self, x: float) -> float:
        return self.fixed + self.per_unit * x**self.degree

    def largest_within(self, room: float) -> int:
        """Largest x whose rise stays within ``room`` (0 when none)."""
        if self.per_unit <= 0:
            return 0 if room < self.fixed else 1 << 40
        free = (room - self.fixed) / self.per_unit
        if free <= 0:
            return 0
        root: float = free ** (1.0 / self.degree)
        return math.floor(root + 1e-9)


def fit_line(points: Sequence[tuple[int, int] | tuple[int, int, int]], degree: int = 1) -> _Line:
    """The line through the two largest measured sizes; points are ``(size, rise_bytes[, created_bytes])``.

    The two largest points are the ones nearest the answer, so the secant through them is the best
    local model even if the step's memory bends slightly (allocator rounding, kernel choice).
    ``created_bytes`` is memory the step left allocated (optimizer state made by the first step): it
    may or may not have been part of that step's peak, so the smaller point's rise is taken without it,
    which makes the line steeper, i.e. errs towards a smaller answer, never a larger one.
    With a single point, or a non-increasing pair, all of the rise is taken to scale with size
    (a safe over-estimate for what follows it).
    """
    if not points:
        raise ValueError("fit_line needs at least one measured point")
    best: dict[int, tuple[int, int]] = {}
    for point in points:
        size, rise = point[0], point[1]
        created = point[2] if len(point) > 2 else 0
        if size not in best or rise > best[size][0]:
            best[size] = (rise, max(0, created))
    sizes = sorted(best)
    x2 = sizes[-1]
    y2 = best[x2][0]
    if len(sizes) >= 2:
        x1 = sizes[-2]
        y1 = best[x1][0] - best[x1][1]
        slope = (y2 - y1) / (x2**degree - x1**degree)
        if slope > 0:
            return _Line(fixed=y2 - slope * x2**degree, per_unit=slope, degree=degree)
    return _Line(fixed=0.0, per_unit=max(y2, 1) / x2**degree, degree=degree)


@dataclass
class _State:
    capacity: int
    usable: float
    lo: int = 0  # largest size known to fit within the margin
    hi: int = 0  # smallest size known to fail or to break the margin
    limit: int = 0  # largest size that ran at all
    points: list[tuple[int, int, int]] = field(default_factory=list)  # size, rise, created
    base: int = 0  # reserve (or allocation) before the next trial
    far_rise: float = 0.0  # the first point's rise as the far probe assumes it (see FAR_PROBE_HEADROOM)
    trials: list[Trial] = field(default_factory=list)
    contradicted: list[int] = field(default_factory=list)  # sizes the line said fit but that failed


def search(
    run_trial: Callable[[int], Trial],
    capacity: int,
    *,
    start: int = 1,
    max_size: int = DEFAULT_MAX_BATCH,
    margin: float = 0.05,
    max_trials: int = DEFAULT_MAX_TRIALS,
    degree: int = 1,
    scale: int = 1,
) -> TuneResult:
    """The pure search: ``run_trial(size)`` runs one real step and reports it; see the module doc.

    ``scale`` only changes how sizes read in the notes (the sequence search counts in multiples).
    """
    _check(start=start, max_size=max_size, margin=margin, max_trials=max_trials)
    t0 = time.perf_counter()
    usable = capacity * (1.0 - margin)
    st = _State(capacity=capacity, usable=usable, hi=max_size + 1)
    notes: list[str] = []
    line: _Line | None = None

    size: int | None = start
    while size is not None and len(st.trials) < max_trials:
        trial = run_trial(size)
        st.trials.append(trial)
        base, peak, after = trial.limited()
        # What stays held from now on: after the first step that includes optimizer state.
        st.base = after if after is not None else base
        if trial.ok and peak is not None:
            created = 0 if after is None else after - base
            if not st.points:
                # Only a measured reserve has an allocator overhead that can grow; plain bytes (a caller
                # of search() with its own memory model) are taken as exact.
                reserve = trial.peak_reserved_bytes is not None and trial.base_reserved_bytes is not None
                alloc_rise = trial.rise_bytes if trial.rise_bytes is not None else 0
                headroom = 1.0 + FAR_PROBE_HEADROOM if reserve else 1.0
                st.far_rise = max(peak - base, alloc_rise, 1) * headroom
            st.points.append((size, peak - base, created))
            st.limit = max(st.limit, size)
            if peak <= usable:
                st.lo = max(st.lo, size)
            else:
                st.hi = min(st.hi, size)
        else:
            st.hi = min(st.hi, size)
            if line is not None and base + line.rise(size) <= capacity:
                st.contradicted.append(size)
        if st.points:
            line = fit_line(st.points, degree)
            line = _corrected(line, st, degree)
        size = _next_size(st, line, start, degree)

    if st.limit == 0:
        smallest = min(t.size for t in st.trials)
        if smallest <= 1:
            raise NoSizeFitsError(
                f"even size 1 ran out of memory ({st.trials[-1].error}); free memory or change the model setup"
            )
        raise NoSizeFitsError(f"no size from {smallest} up fit in {len(st.trials)} trials; start lower")
    leaked = [t for t in st.trials if not t.ok and t.after_bytes is not None and t.after_bytes > t.base_bytes]
    if leaked:
        grown = max(t.after_bytes - t.base_bytes for t in leaked if t.after_bytes is not None)
        notes.append(
            f"{grown} bytes stayed allocated after an OOM: the step function keeps references "
            "(pass restore=(model, optimizer) so their grads are dropped)"
        )
    if st.lo == 0:
        notes.append("no size kept the margin; the result is the smallest size tried that ran at all")
    predicted = line.largest_within(capacity - st.base) if line is not None else None
    size_found = st.lo or st.limit
    peak = max((t.peak_bytes for t in st.trials if t.size == size_found and t.peak_bytes is not None), default=None)
    peak_reserved = max(
        (t.peak_reserved_bytes for t in st.trials if t.size == size_found and t.peak_reserved_bytes is not None),
        default=None,
    )
    held = peak_reserved if peak_reserved is not None else peak
    capped = size_found >= max_size
    if capped:
        notes.append(f"reached the upper bound {max_size * scale}; more may fit")
    if st.hi - max(st.lo, 1) > 1 and not capped and len(st.trials) >= max_trials:
        notes.append(f"stopped after {max_trials} trials; sizes between {st.lo * scale} and {st.hi * scale} untried")
    return TuneResult(
        size=size_found,
        margin=margin,
        margin_bytes=int(capacity - usable),
        capacity_bytes=capacity,
        peak_bytes=peak,
        headroom_bytes=None if held is None else capacity - held,
        limit_size=st.limit,
        predicted_max=predicted,
        fixed_bytes=None if line is None else line.fixed,
        bytes_per_unit=None if line is None else line.per_unit,
        trials=tuple(st.trials),
        ooms=sum(1 for t in st.trials if not t.ok),
        seconds=time.perf_counter() - t0,
        capped=capped,
        notes=tuple(notes),
        peak_reserved_bytes=peak_reserved,
    )


def _corrected(line: _Line, st: _State, degree: int) -> _Line:
    """Make the line agree with failures: a size that failed must not be predicted to fit."""
    for size in st.contradicted:
        if st.base + line.rise(size) <= st.capacity:
            # The steepest slope with the same fixed part that makes ``size`` just exceed the capacity.
            needed = (st.capacity - st.base - line.fixed) / size**degree
            line = _Line(line.fixed, max(line.per_unit, needed * 1.0001), degree)
    return line


def _next_size(st: _State, line: _Line | None, start: int, degree: int) -> int | None:
    """The next size to run, or None when the answer is known."""
    tried = {t.size for t in st.trials}
    lo, hi = st.lo, st.hi
    if hi - lo <= 1:
        return None
    if line is None:  # nothing ran yet: everything tried failed; halve towards 1
        nxt = max(1, min(t.size for t in st.trials) // 2)
        return None if nxt in tried else nxt
    room = st.usable - st.base
    if len(st.points) == 1 and lo > 0:
        # One point: if all of the rise scaled with size, this much would fit; the rise's fixed part
        # makes it a lower bound, and the allocator headroom in far_rise covers the reserve growing
        # faster than the allocation at larger sizes, which makes it a safe, far-away second point.
        x = st.points[0][0]
        nxt = math.floor(x * (max(room, 0.0) / st.far_rise) ** (1.0 / degree))
        nxt = max(nxt, x + 1)
    else:
        nxt = line.largest_within(room)
    if nxt <= lo:  # the line says nothing larger than ``lo`` fits
        return None
    nxt = min(nxt, hi - 1)  # stay below what already failed
    if st.contradicted and (len({p[0] for p in st.points}) < 2 or len(st.contradicted) >= 2):
        # The memory is not the line it was taken for (it bends upwards, or the first point was all
        # we had): stop trusting the model alone and halve the bracket, so the walk cannot crawl.
        nxt = min(nxt, (lo + hi) // 2)
        if nxt <= lo:
            return None
    return None if nxt in tried else nxt


def _check(*, start: int, max_size: int, margin: float, max_trials: int) -> None:
    if start < 1:
        raise ValueError(f"start must be at least 1, got {start}")
    if max_size < start:
        raise ValueError(f"the upper bound ({max_size}) must be at least start ({start})")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin is a fraction of the capacity in [0, 1), got {margin}")
    if max_trials < 1:
        raise ValueError(f"max_trials must be at least 1, got {max_trials}")


# --------------------------------------------------------------------------------------------------
# Running trials for real
# --------------------------------------------------------------------------------------------------


class _Restorer:
    """Copies the trainable parameters and the state of the given objects to host memory, to put back.

    Modules (anything with ``named_parameters``): only parameters that require grad are saved (the
    frozen, possibly quantized base does not change during a step), and their ``.grad`` is dropped
    after each failed trial. Optimizers (``state`` and ``param_groups``): the per-parameter state is
    copied back *into the tensors it lives in*, so that state kept in special memory (bitsandbytes'
    paged buffers) stays there; state the search created is dropped. Anything else with
    ``state_dict``/``load_state_dict`` (schedulers, scalers): its state dict.
    """

    def __init__(self, objects: Iterable[Any]) -> None:
        self._objects = list(objects)
        self._saved: list[Any] = []
        for obj in self._objects:
            if hasattr(obj, "named_parameters"):
                self._saved.append(
                    {n: p.detach().to("cpu", copy=True) for n, p in obj.named_parameters() if p.requires_grad}
                )
            elif hasattr(obj, "state") and hasattr(obj, "param_groups"):
                state = {p: {k: _host_copy(v) for k, v in st.items()} for p, st in obj.state.items()}
                groups = [{k: v for k, v in g.items() if k != "params"} for g in obj.param_groups]
                self._saved.append((state, _to_host(groups)))
            elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
                self._saved.append(_to_host(obj.state_dict()))
            else:
                raise TypeError(
                    f"cannot restore a {type(obj).__name__}: pass modules, optimizers or objects "
                    "with state_dict()/load_state_dict()"
                )

    def drop_grads(self) -> None:
        for obj in self._objects:
            if hasattr(obj, "named_parameters"):
                for p in obj.parameters():
                    p.grad = None

    def restore(self) -> None:
        import torch

        for obj, saved in zip(self._objects, self._saved, strict=True):
            if hasattr(obj, "named_parameters"):
                with torch.no_grad():
                    for n, p in obj.named_parameters():
                        if n in saved:
                            p.copy_(saved[n])
                        p.grad = None
            elif hasattr(obj, "state") and hasattr(obj, "param_groups"):
                state, groups = saved
                for p in [p for p in obj.state if p not in state]:
                    del obj.state[p]  # created by the search: training had none
                with torch.no_grad():
                    for p, entries in state.items():
                        current = obj.state.setdefault(p, {})
                        for key, (value, device) in entries.items():
                            now = current.get(key)
                            if torch.is_tensor(value) and torch.is_tensor(now) and now.shape == value.shape:
                                now.copy_(value)
                            else:
                                current[key] = value.to(device) if torch.is_tensor(value) else value
                for group, hyper in zip(obj.param_groups, groups, strict=False):
                    group.update(hyper)
            else:
                obj.load_state_dict(saved)


def _host_copy(value: Any) -> tuple[Any, Any]:
    """``(copy on the host, the device it came from)`` for a tensor; ``(value, None)`` otherwise."""
    if hasattr(value, "detach") and hasattr(value, "device"):
        return value.detach().to("cpu", copy=True), value.device
    return value, None


def _to_host(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "to"):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def make_trial_runner(
    step_fn: Callable[[int], Any],
    probe: MemoryProbe,
    restorer: _Restorer | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> Callable[[int], Trial]:
    """Wrap ``step_fn(size)`` into a trial: memory released before and after, OOMs caught and cleared."""

    def run(size: int) -> Trial:
        # empty_cache() first, so the reserve holds only live tensors and its peak is this trial's.
        probe.release()
        base = probe.allocated_bytes()
        base_reserved = probe.reserved_bytes()
        probe.reset_peak()
        t0 = time.perf_counter()
        error: str | None = None
        peak: int | None = None
        peak_reserved: int | None = None
        try:
            step_fn(size)
            peak = probe.peak_bytes()
            peak_reserved = probe.peak_reserved_bytes()
        except BaseException as exc:
            kind = oom_kind(exc)
            if kind is None:
                _forget(exc)
                probe.release()
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = f"{kind}: {first[:300]}"
            # The traceback's frames hold the failed step's tensors; clear them so release() frees them.
            _forget(exc)
            del exc
            if restorer is not None:
                restorer.drop_grads()
        seconds = time.perf_counter() - t0
        probe.release()
        trial = Trial(
            size=size,
            ok=error is None,
            base_bytes=base,
            peak_bytes=peak,
            seconds=seconds,
            error=error,
            after_bytes=probe.allocated_bytes(),
            base_reserved_bytes=base_reserved,
            peak_reserved_bytes=peak_reserved,
            after_reserved_bytes=probe.reserved_bytes(),
        )
        log.info("trial %d: %s", size, "ok" if trial.ok else error)
        if on_trial is not None:
            on_trial(trial)
        return trial

    return run


def _forget(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # a frame still executing (ours): nothing to clear there
            pass
        tb = tb.tb_next
    traceback.clear_frames(exc.__traceback__)


def find_max_batch_size(
    step_fn: Callable[[int], Any],
    *,
    start: int = 1,
    max_batch: int = DEFAULT_MAX_BATCH,
    margin: float = 0.05,
    target_batch: int | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
    restore: Sequence[Any] = (),
    probe: MemoryProbe | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """The largest batch whose training step fits, found with a few real steps.

    ``step_fn(batch_size)`` runs one full training step (forward, backward, optimizer step, zero_grad)
    at that batch size; the tuner calls it at most ``max_trials`` times (three in the usual case).
    The model and optimizer that ``step_fn`` uses either belong to the search alone (build them inside
    ``step_fn``'s closure and drop them afterwards) or are passed in ``restore``: their trainable
    parameters and state are copied to host memory first and put back at the end, so the search leaves
    training where it was. Memory is released (``gc.collect``, ``torch.cuda.empty_cache``) before and
    after every trial; grads of ``restore`` modules are dropped after a failed one.

    Args:
        step_fn: runs one training step at the given batch size.
        start: the first (small) batch size to measure.
        max_batch: never try more than this.
        margin: fraction of the capacity to keep free at the step's peak reserve (longer batches
            later; the allocator's fragmentation is measured, not guessed). 0 finds the raw limit.
        target_batch: the effective batch you want; the result then carries ``micro_batch`` and
            ``grad_accum_steps``.
        max_trials: real steps at most.
        restore: modules / optimizers (anything with ``state_dict``) to restore afterwards.
        probe: the device to measure; default :class:`CudaProbe` on the current CUDA device.
        on_trial: called after each trial (progress output).

    Returns:
        A :class:`TuneResult`: ``batch_size``, the margin kept, every trial, and the accumulation split.

    Raises:
        NoSizeFitsError: even batch size 1 runs out of memory.
        ValueError: bad arguments.
        Any non-OOM exception from ``step_fn``, after restoring.
    """
    if target_batch is not None and target_batch < 1:
        raise ValueError(f"target_batch must be at least 1, got {target_batch}")
    _check(start=start, max_size=max_batch, margin=margin, max_trials=max_trials)
    probe = probe if probe is not None else CudaProbe()
    restorer = _Restorer(restore) if restore else None
    try:
        result = search(
            make_trial_runner(step_fn, probe, restorer, on_trial),
            probe.capacity_bytes(),
            start=start,
            max_size=max_batch,
            margin=margin,
            max_trials=max_trials,
        )
    finally:
        if restorer is not None:
            restorer.restore()
        probe.release()
    if target_batch is not None:
        micro, steps = split_batch(target_batch, result.size)
        result = _with(result, target_batch=target_batch, micro_batch=micro, grad_accum_steps=steps)
    return result


def find_max_seq_len(
    step_fn: Callable[[int], Any],
    *,
    start: int = 256,
    max_len: int = 131072,
    multiple_of: int = 64,
    margin: float = 0.05,
    quadratic: bool = False,
    max_trials: int = DEFAULT_MAX_TRIALS,
    restore: Sequence[Any] = (),
    probe: MemoryProbe | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """The longest sequence length whose training step fits at a fixed batch size.

    ``step_fn(seq_len)`` runs one training step at that length. Lengths are multiples of
    ``multiple_of``. Memory grows linearly with length with fused attention (sdpa, flash-attention);
    pass ``quadratic=True`` for eager attention, whose scores are seq x seq. Otherwise as
    :func:`find_max_batch_size`.
    """
    if multiple_of < 1:
        raise ValueError(f"multiple_of must be at least 1, got {multiple_of}")
    if start < multiple_of:
        raise ValueError(f"start ({start}) must be at least multiple_of ({multiple_of})")
    if max_len < start:
        raise ValueError(f"max_len ({max_len}) must be at least start ({start})")
    probe = probe if probe is not None else CudaProbe()
    restorer = _Restorer(restore) if restore else None

    def step_units(units: int) -> Any:
        return step_fn(units * multiple_of)

    def on_unit_trial(trial: Trial) -> None:
        if on_trial is not None:
            on_trial(_scaled(trial, multiple_of))

    try:
        result = search(
            make_trial_runner(step_units, probe, restorer, on_unit_trial),
            probe.capacity_bytes(),
            start=start // multiple_of,
            max_size=max_len // multiple_of,
            margin=margin,
            max_trials=max_trials,
            degree=2 if quadratic else 1,
            scale=multiple_of,
        )
    finally:
        if restorer is not None:
            restorer.restore()
        probe.release()
    m = multiple_of
    per_unit = None if result.bytes_per_unit is None else result.bytes_per_unit / (m ** (2 if quadratic else 1))
    return _with(
        result,
        size=result.size * m,
        limit_size=result.limit_size * m,
        predicted_max=None if result.predicted_max is None else result.predicted_max * m,
        bytes_per_unit=per_unit,
        trials=tuple(_scaled(t, m) for t in result.trials),
        unit="seq_len",
    )


def _scaled(trial: Trial, factor: int) -> Trial:
    from dataclasses import replace

    return replace(trial, size=trial.size * factor)


def _with(result: TuneResult, **changes: Any) -> TuneResult:
    from dataclasses import replace

    return replace(result, **changes)
