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

The search itself (:func:`search`, here) is pure: it sees the hardware only through a :class:`MemoryProbe`.
:class:`~vramscope.tune.cuda.CudaProbe` is torch's CUDA caching allocator; :mod:`vramscope.tune.trials` runs the
step and catches its OOMs; :mod:`vramscope.tune.find` puts the three together.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

DEFAULT_MAX_BATCH = 4096
DEFAULT_MAX_TRIALS = 5
# The second (far) probe assumes the reserve rises this much faster than the larger of the first
# probe's reserve and allocated rises. Why: a step's reserve/allocated ratio grows with the tensors'
# size (tests/data/planner/h200_measurements.csv: 0.3-1.0x at batch 1 x 512 tokens, where cached
# weight blocks are reused, up to 1.39x at Mistral-7B batch 8 x 1024), and the far probe must not OOM.
FAR_PROBE_HEADROOM = 0.4
# The last trial aims this much below the usable memory: the answer is the largest size measured within the margin,
# so a last trial that overshoots by a hair throws the whole extrapolation away. Why: a line through two points
# still misses the reserve's growth far out (the allocator's segments round up as tensors grow); on the H200,
# `tune --gpus 2` behind accelerate FSDP extrapolated from batch 15 to 38 and reserved 22.53 GiB against 22.29 GiB
# usable (+1.1%), so its answer fell back to 15; the same through torchrun DDP landed 0.1% inside.
LAST_TRIAL_SAFETY = 0.02


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
    check_bounds(start=start, max_size=max_size, margin=margin, max_trials=max_trials)
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
        last = len(st.trials) == max_trials - 1
        size = _next_size(st, line, start, degree, safety=LAST_TRIAL_SAFETY if last else 0.0)

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


def _next_size(st: _State, line: _Line | None, start: int, degree: int, safety: float = 0.0) -> int | None:
    """The next size to run, or None when the answer is known; ``safety``: the share of the usable memory the
    line's aim keeps free (the last trial's)."""
    tried = {t.size for t in st.trials}
    lo, hi = st.lo, st.hi
    if hi - lo <= 1:
        return None
    if line is None:  # nothing ran yet: everything tried failed; halve towards 1
        nxt = max(1, min(t.size for t in st.trials) // 2)
        return None if nxt in tried else nxt
    room = st.usable * (1.0 - safety) - st.base
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


def check_bounds(*, start: int, max_size: int, margin: float, max_trials: int) -> None:
    """Refuse search bounds that make no sense, with what was given."""
    if start < 1:
        raise ValueError(f"start must be at least 1, got {start}")
    if max_size < start:
        raise ValueError(f"the upper bound ({max_size}) must be at least start ({start})")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin is a fraction of the capacity in [0, 1), got {margin}")
    if max_trials < 1:
        raise ValueError(f"max_trials must be at least 1, got {max_trials}")
