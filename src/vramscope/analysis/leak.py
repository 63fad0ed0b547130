"""Leak detection on what stays allocated after each training step.

A leak is memory that keeps growing step after step and is never given back. The test runs on the
memory left *after* each step (``allocated_bytes`` of the step rows; host RSS on a CPU), not on the
per-step peak, because the peak follows each batch's size while a leak shows in what remains.

The test is built to stay silent on what is not a leak:

* a noisy but flat series: the trend must be significant (Mann-Kendall test on the Theil-Sen slope,
  both robust to outliers) *and* large enough to matter (``min_growth_bytes`` over the window);
* a plateau after warm-up (optimizer state created on the first step, the allocator or glibc warming
  up): the first part of the run is skipped, and a growth that has stopped (a "rise then flat" shape
  fits better than "flat then rise") is reported as a plateau;
* variable sequence lengths: the growth must go on through the whole window (the median of each
  chunk above the one before), so that one long batch, or a few record-breaking ones, is not a trend;
* the allocator caching more (reserved grows, allocated flat): that test runs on allocated memory;
  :func:`vramscope.analysis.summary.analyze` runs it on reserved memory too and calls that caching.

Windows of several lengths ending at the newest step are tried, so a leak that begins late in a long
run is caught about as fast as one that begins at once. The series is read as numpy arrays; each test
looks at most at ``max_points`` points (O(n^2) pairs, in one numpy pass), so it is cheap enough to run
every few dozen steps inside training.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vramscope.units import MIB, human_precise


@dataclass(frozen=True)
class LeakConfig:
    """Thresholds of the leak test.

    Attributes:
        min_growth_bytes: growth over the tested window (slope times its span) below which a trend
            does not matter, however significant.
        z_critical: one-sided Mann-Kendall z to call a trend significant (3.29 is p = 0.0005).
        chunks: the window is cut into this many chunks; each chunk's median must rise above the last ...
        min_chunk_rise: ... by at least this share of the rise the trend predicts between them.
        min_points: fewest post-warm-up points to test at all.
        warmup_fraction: share of the points at the start that are skipped as warm-up ...
        min_warmup_points: ... and at least this many.
        max_points: longer series are thinned evenly to this many points (keeps the cost bounded).
        confirm_points: a leak is reported only when the test also fired this many rows earlier (or an
            eighth or a quarter of the run earlier) and memory kept growing since (a warm-up climbs
            and stops; a leak goes on).
    """

    min_growth_bytes: float = 16 * MIB
    z_critical: float = 3.29
    chunks: int = 3
    min_chunk_rise: float = 0.25
    min_points: int = 16
    warmup_fraction: float = 0.1
    min_warmup_points: int = 5
    max_points: int = 120
    confirm_points: int = 16


DEFAULT_CONFIG = LeakConfig()


@dataclass(frozen=True)
class Trend:
    """A robust linear trend: Theil-Sen slope and intercept, Mann-Kendall z."""

    slope: float
    intercept: float
    z: float
    n: int


@dataclass
class LeakResult:
    """What the leak test found. ``x`` is the step (or seconds when the log has no steps)."""

    detected: bool
    kind: str  # "leak", "none", "plateau", "unconfirmed", "batch_growth", "insufficient"
    verdict: str
    slope_per_x: float | None = None  # bytes per step (or per second)
    start_x: float | None = None  # where the growth began
    growth_bytes: float | None = None  # growth from the start to the newest point, along the trend
    z: float | None = None
    window: tuple[float, float] | None = None  # the x range of the window that decided
    points: int = 0
    checked: list[dict[str, Any]] = field(default_factory=list)  # per window, for --debug and tests

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("checked")
        return out


def median(values: Sequence[float] | np.ndarray) -> float:
    """The median (mean of the middle two for an even count)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    n = len(ordered)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (float(ordered[mid - 1]) + float(ordered[mid])) / 2.0


def trend(xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray) -> Trend:
    """Theil-Sen slope (median of pairwise slopes) and the Mann-Kendall z of ``ys`` ordered by ``xs``.

    Every pair at once: the differences, the signs of the rises, and the slopes where x moved. The z uses
    the variance with the correction for tied values (memory readings are often exactly equal); a
    series with no variation has z = 0.
    """
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    n = len(x)
    first, second = np.triu_indices(n, 1)  # pairs (i, j), i < j, in the order i, then j
    dys = y[second] - y[first]
    dxs = x[second] - x[first]
    s = int(np.count_nonzero(dys > 0)) - int(np.count_nonzero(dys < 0))
    moved = dxs != 0
    slopes = dys[moved] / dxs[moved]
    slope = median(slopes) if len(slopes) else 0.0
    intercept = median(y - slope * x) if n else 0.0
    ties = np.unique(y, return_counts=True)[1].tolist() if n else []
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties)) / 18.0
    z = 0.0 if var <= 0 or s == 0 else (s - 1 if s > 0 else s + 1) / math.sqrt(var)
    return Trend(slope=slope, intercept=intercept, z=z, n=n)


def thin(xs: Sequence[float], ys: Sequence[float], limit: int) -> tuple[list[float], list[float]]:
    """Keep at most ``limit`` points, evenly spaced by index, always keeping the newest."""
    n = len(xs)
    if n <= limit:
        return list(xs), list(ys)
    picks = thin_positions(n, limit)
    return [xs[i] for i in picks], [ys[i] for i in picks]


def thin_positions(n: int, limit: int) -> Sequence[int]:
    """The positions :func:`thin` keeps of ``n`` points: all of them up to ``limit``, else ``limit`` of them.

    Picking positions first lets a caller take only those cells of a long series (a day of rows) instead
    of copying the whole series to thin it.
    """
    if n <= limit:
        return range(n)
    stride = n / limit
    return sorted({n - 1 - int(k * stride) for k in range(limit)})


# The costs below are sums of absolute errors over at most ``max_points`` points, added up in order
# (``sum`` of the array's floats): the hinge search compares candidates' costs, and an equal cost must
# stay equal whatever the window.


def _chunk_medians(ys: Sequence[float] | np.ndarray, chunks: int) -> list[float]:
    n = len(ys)
    bounds = [round(k * n / chunks) for k in range(chunks + 1)]
    return [median(ys[bounds[k] : bounds[k + 1]]) for k in range(chunks)]


def _abs_cost(xs: np.ndarray, ys: np.ndarray, slope: float, intercept: float) -> float:
    return float(sum(np.abs(ys - (intercept + slope * xs)).tolist()))


def _flat_cost(ys: np.ndarray) -> float:
    if not len(ys):
        return 0.0
    return float(sum(np.abs(ys - median(ys)).tolist()))


def _segment_cost(xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray) -> tuple[float, Trend]:
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    t = trend(x, y)
    return _abs_cost(x, y, t.slope, t.intercept), t


def _breakpoints(n: int, minimum: int) -> list[int]:
    # A handful of candidate change points keeps the fits cheap; the start step is refined later.
    if n < 2 * minimum:
        return []
    count = min(12, n - 2 * minimum + 1)
    span = n - 2 * minimum
    return sorted({minimum + round(k * span / max(1, count - 1)) for k in range(count)})


def growth_stopped(xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray) -> bool:
    """True when "rise, then flat" explains the window clearly better than "flat (or not), then rise".

    That is the shape of a warm-up that has ended (or of one large allocation spread over a few
    steps), not of a leak, whose growth goes on up to the newest step.
    """
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    n = len(x)
    minimum = max(4, n // 8)
    best_rise_then_flat = math.inf
    best_leak = _segment_cost(x, y)[0]  # a straight line: the leak began before the window
    for b in _breakpoints(n, minimum):
        rise, _ = _segment_cost(x[:b], y[:b])
        best_rise_then_flat = min(best_rise_then_flat, rise + _flat_cost(y[b:]))
        late, _ = _segment_cost(x[b:], y[b:])
        best_leak = min(best_leak, _flat_cost(y[:b]) + late)
    # A clear margin: noise alone makes either fit a little better than the other.
    return best_rise_then_flat < 0.7 * best_leak


def find_start(xs: Sequence[float] | np.ndarray, ys: Sequence[float] | np.ndarray, slope: float) -> float:
    """The x where growth of ``slope`` began: the best "flat, then rising at ``slope``" hinge.

    With the slope fixed, every candidate start at once: the flat level is the median of the points
    before it and the line's offset the median of ``y - slope * x`` after it (one matrix of candidates
    against points, the points outside a candidate's part masked). The level before and the line meet
    at the start, so the hinge is continuous, as memory is.
    """
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    n = len(x)
    if n < 3:
        return float(x[0])
    offsets = y - slope * x
    k = np.arange(n - 2)[:, None]  # candidate starts
    i = np.arange(n)[None, :]
    before, after = i < k, i >= k
    levels = np.full(n - 2, np.nan)  # nothing before the first candidate
    if n > 3:
        levels[1:] = np.nanmedian(np.where(before[1:], y, np.nan), axis=1)
    offset = np.nanmedian(np.where(after, offsets, np.nan), axis=1)
    # Each candidate's cost: the flat part's and the rising part's, each added up in the points' order
    # (the zeros where a point is not in that part change no sum).
    flat = np.where(before, np.abs(y - np.nan_to_num(levels)[:, None]), 0.0).tolist()
    rising = np.where(after, np.abs(offsets - offset[:, None]), 0.0).tolist()
    costs = np.array([sum(f) + sum(r) for f, r in zip(flat, rising, strict=True)])
    if np.isnan(costs).all():
        return float(x[0])
    best = int(np.nanargmin(costs))  # the first of equal costs
    level = float(levels[best]) if best else float(offset[0]) + slope * float(x[0])
    # Where the flat level meets the rising line; clamped to the data around the start.
    meet = (level - float(offset[best])) / slope if slope else float(x[best])
    low = float(x[best - 1]) if best > 0 else float(x[0])
    return min(max(meet, low), float(x[best]))


class _Ordered:
    """A series in (x, y) order, as float arrays.

    The test only ever looks at a bounded number of points (``max_points`` per window, a few rows
    around a confirmation horizon), picked by position: a day of rows costs the same few hundred
    reads as a short run.
    """

    def __init__(self, xs: np.ndarray, ys: np.ndarray, increasing: bool) -> None:
        self.xs = xs
        self.ys = ys
        self.increasing = increasing  # x strictly rises from point to point (no tie, no NaN)

    def x(self, i: int) -> float:
        return float(self.xs[i])

    def thinned(self, lo: int, hi: int, limit: int) -> tuple[list[float], list[float]]:
        """:func:`thin` of the points from ``lo`` up to ``hi`` (exclusive), as floats."""
        picks = lo + np.asarray(thin_positions(hi - lo, limit), dtype=np.int64)
        return self.xs[picks].tolist(), self.ys[picks].tolist()

    def level(self, end: int, width: int = 5) -> float:
        """Memory around row ``end`` (exclusive): the median of the few rows before it."""
        window = self.ys[max(0, end - width) : end]
        return median(window) if len(window) else 0.0


def _order(xs: np.ndarray, ys: np.ndarray) -> np.ndarray | None:
    """The positions of the points in (x, y) order, ties kept in input order; None when already in order."""
    if bool(np.all(xs[1:] > xs[:-1])):
        return None
    return np.lexsort((np.arange(len(xs)), ys, xs))


def _confirmed(series: _Ordered, n: int, slope: float, config: LeakConfig) -> bool:
    """Did the test also fire some rows ago, with memory still growing since at a fair share of the trend?

    A warm-up that climbs for a while (the first eval, the first long batches, the allocator filling
    its caches) fires once and stops; a leak keeps going. Looking back ``confirm_points`` rows catches
    a steady leak soon; looking back an eighth and a quarter of the run keeps a leak in steps (an eval
    every 50 steps that keeps its logits) confirmed between its steps. ``n`` is how many of the
    series' points the test sees (the rest is later).
    """
    skip = max(config.min_warmup_points, int(n * config.warmup_fraction))
    body = n - skip
    for back in sorted({config.confirm_points, body // 8, body // 4}):
        if back < config.confirm_points or back >= n:
            continue
        end = n - back  # the test as it stood ``back`` rows ago
        since = series.level(n) - series.level(end)
        if since < config.min_chunk_rise * slope * (series.x(n - 1) - series.x(end - 1)):
            continue
        if _scan(series, end, config)[0] is not None:
            return True
    return False


def _scan(
    series: _Ordered, n: int, config: LeakConfig
) -> tuple[tuple[int, Trend] | None, list[dict[str, Any]], str]:
    """Try the trailing windows of the first ``n`` points, shortest first.

    Returns (window that shows a leak, checks, why not).
    """
    skip = max(config.min_warmup_points, int(n * config.warmup_fraction))
    if n - skip < config.min_points:
        return None, [], "insufficient"
    bx, by = series.thinned(skip, n, config.max_points)
    n = len(bx)
    sizes = []
    size = config.min_points
    while size < n:
        sizes.append(size)
        size *= 2
    sizes.append(n)
    checked: list[dict[str, Any]] = []
    plateau = False
    for size in sizes:
        wx, wy = bx[n - size :], by[n - size :]
        t = trend(wx, wy)
        span = wx[-1] - wx[0]
        growth = t.slope * span
        meds = _chunk_medians(wy, config.chunks)
        # Each chunk must rise by a fair share of what the trend predicts for it: a single jump (one
        # long batch) or noise on a plateau makes some chunk rise by next to nothing.
        step_rise = config.min_chunk_rise * t.slope * span / config.chunks
        rising = t.slope > 0 and all(b - a >= step_rise for a, b in itertools.pairwise(meds))
        ok = t.z >= config.z_critical and growth >= config.min_growth_bytes and rising
        stopped = ok and growth_stopped(wx, wy)
        checked.append(
            {"points": size, "from": wx[0], "z": round(t.z, 2), "slope": t.slope, "growth": growth,
             "rising": rising, "stopped": stopped}
        )
        if ok and not stopped:
            return (size, t), checked, ""  # the shortest window that shows it: its slope is the newest
        plateau = plateau or stopped
    return None, checked, "plateau" if plateau else "none"


def detect_leak(
    xs: Sequence[float] | np.ndarray,
    ys: Sequence[float] | np.ndarray,
    config: LeakConfig = DEFAULT_CONFIG,
    unit: str = "step",
    tokens: Sequence[int | None] | np.ndarray | None = None,
    rising: bool = False,
) -> LeakResult:
    """Test whether ``ys`` (bytes left after each step) keeps growing with ``xs`` (steps).

    Args:
        xs: steps (or seconds), increasing; repeated values are allowed.
        ys: bytes at each x.
        config: thresholds.
        unit: what x counts, for the verdict ("step" or "s").
        tokens: each row's batch tokens (None or NaN where unknown). Caches sized for the longest batch so far grow
            while longer batches keep arriving (a length curriculum); when that explains the growth
            as well as the steps do, it is reported as ``batch_growth``, not as a leak.
        rising: the caller knows that ``xs`` rises strictly from point to point (a log's steps, as a
            rule), which spares a pass over a day of rows to find it out.

    Returns:
        A :class:`LeakResult`; ``detected`` is True only for a significant, continuing growth of at
        least ``config.min_growth_bytes``.
    """
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    n = len(x)
    toks = _token_array(tokens) if tokens is not None and len(tokens) == n else None
    order = None if rising else _order(x, y)
    if order is None:
        series = _Ordered(x, y, increasing=True)
    else:
        series = _Ordered(x[order], y[order], increasing=False)
        toks = toks[order] if toks is not None else None
    found, checked, plateau = _scan(series, n, config)
    if found is None:
        if plateau == "insufficient":
            need = config.min_points + config.min_warmup_points
            return LeakResult(detected=False, kind="insufficient", verdict=_too_short(series, n, need, unit),
                              points=n)
        if plateau == "plateau":
            kind, verdict = "plateau", "no leak: memory rose, then stayed flat (a warm-up or a one-off allocation)"
        else:
            kind, verdict = "none", "no leak: no significant, continuing growth"
        return LeakResult(detected=False, kind=kind, verdict=verdict, points=n, checked=checked)

    # Confirmation: the test must also have fired ``confirm_points`` rows ago, and memory must have
    # gone on growing since at a fair share of the trend. A warm-up that climbs in a few steps (the
    # first eval, the first long batch) fires once and stops; a leak keeps going.
    _, t = found
    if not _confirmed(series, n, t.slope, config):
        return LeakResult(
            detected=False,
            kind="unconfirmed",
            verdict=("no leak yet: memory grew, and the next "
                     f"{'steps' if unit == 'step' else 'minutes'} will tell whether it goes on"),
            points=n,
            checked=checked,
        )

    # The growth began somewhere in or before the window: look for it over the whole series.
    tx, ty = series.thinned(0, n, config.max_points)
    start = find_start(tx, ty, t.slope)
    # Re-fit the slope on the growing part only (the window may also hold some flat steps).
    gx = [x for x in tx if x >= start]
    gy = [y for x, y in zip(tx, ty, strict=True) if x >= start]
    slope = trend(gx, gy).slope if len(gx) >= 4 else t.slope
    if slope <= 0:
        slope = t.slope
    assert slope > 0, "a leak whose trend does not grow"  # the window's test found growth; so does its re-fit
    last_x = series.x(n - 1)
    growth_total = slope * (last_x - start)
    if toks is not None:
        records = _follows_longest_batch(series, toks, start)
        if records is not None:
            return LeakResult(
                detected=False,
                kind="batch_growth",
                verdict=(
                    f"no leak: memory grows with the longest batch seen so far ({records[0]} -> {records[1]} tokens), "
                    "as caches sized for longer batches do; it stops when the batches stop growing"
                ),
                points=n,
                checked=checked,
            )
    if unit == "s":
        verdict = f"leak: memory grows {_rate(slope)}/s since {start:.1f} s (+{_size(growth_total)} so far)"
    else:
        verdict = (
            f"leak: memory left after each step grows {_rate(slope)}/step since step {round(start)} "
            f"(+{_size(growth_total)} so far)"
        )
    return LeakResult(
        detected=True,
        kind="leak",
        verdict=verdict,
        slope_per_x=slope,
        start_x=start,
        growth_bytes=growth_total,
        z=t.z,
        window=(checked[-1]["from"], last_x),
        points=n,
        checked=checked,
    )


def _too_short(series: _Ordered, n: int, need: int, unit: str) -> str:
    """Why the test cannot run yet: too few steps; in a log without steps, too few samples, said in time too
    ("60 samples (5 min at 5 s), need at least 66 (5.5 min)"), at the log's own sampling interval."""
    if unit == "step":
        return f"not enough steps to test for a leak: {n} logged, need at least {need}"
    every = _interval(series, n)
    if every is None:
        return f"not enough samples to test for a leak: {n} logged, need at least {need}"
    return (f"not enough samples to test for a leak: {n} samples ({_span(n * every)} at {_span(every)}), "
            f"need at least {need} ({_span(need * every)})")


def _interval(series: _Ordered, n: int) -> float | None:
    """The median seconds between samples; None for fewer than two, or all at one time."""
    if n < 2:
        return None
    gaps = np.diff(series.xs[:n])
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else None


def _span(seconds: float) -> str:
    """``5 s``, ``0.5 s``, ``5.5 min``, ``2.1 h``: a sampling interval or a log's length, to two figures."""
    if seconds < 120:
        return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}".removesuffix(".0") + " min"
    return f"{seconds / 3600:.1f} h"


def _rate(bytes_per: float) -> str:
    if abs(bytes_per) >= MIB:
        return f"{bytes_per / MIB:.2f} MiB"
    # Three significant digits below a MiB: a 40-byte-per-step leak is "40 B", not "0.0 KiB".
    return human_precise(bytes_per)


def _size(n: float) -> str:
    if abs(n) >= 1024 * MIB:
        return f"{n / (1024 * MIB):.2f} GiB"
    if abs(n) >= MIB:
        return f"{n / MIB:.0f} MiB"
    return human_precise(n)  # "+0 MiB so far" would hide a small leak's growth


def _token_array(tokens: Sequence[int | None] | np.ndarray) -> np.ndarray:
    """Token counts as floats, NaN where unknown."""
    if isinstance(tokens, np.ndarray):
        return tokens.astype(np.float64)
    return np.array([math.nan if t is None else float(t) for t in tokens], dtype=np.float64)


def _follows_longest_batch(series: _Ordered, tokens: np.ndarray, start: float) -> tuple[int, int] | None:
    """(tokens at the start, tokens now) of the longest batch so far, when it explains the growth.

    Since ``start``, memory is fitted once against the step and once against the longest batch seen
    so far; when the batch fits about as well (the two are confounded in a length curriculum), the
    growth is given to the batches, because memory that follows them stops when they stop.
    """
    n = len(tokens)
    counted = ~np.isnan(tokens)
    if not n or not counted[int(np.argmax(counted))] or start != start:  # no count at all, or no start (NaN)
        return None
    known_from = int(np.argmax(counted))
    if series.increasing:
        # x rises from row to row: the rows from the start on are a tail, found by bisection (no arange of them).
        begin = max(known_from, int(np.searchsorted(series.xs, start, side="left")))
        if n - begin < 8:
            return None
        picks = begin + np.asarray(thin_positions(n - begin, 120), dtype=np.int64)
        ends = (begin, n - 1)
    else:
        after = np.flatnonzero(series.xs >= start)
        since = after[after >= known_from]
        if len(since) < 8:
            return None
        picks = since[np.asarray(thin_positions(len(since), 120), dtype=np.int64)]
        ends = (int(since[0]), int(since[-1]))
    # The longest batch seen up to each row (NaN: none yet), at the rows read: the largest of each stretch up to
    # the next row read, then their running largest (no running array of every row).
    at = np.unique(np.concatenate((picks, ends)))
    running_at = np.fmax.accumulate(np.fmax.reduceat(tokens[: int(at[-1]) + 1], np.concatenate(([0], at[:-1] + 1))))
    running = dict(zip(at.tolist(), running_at.tolist(), strict=True))
    first, last = int(running[ends[0]]), int(running[ends[1]])
    if last < 1.1 * first:
        return None  # the batches stopped growing before the memory did
    xs = series.xs[picks].tolist()
    ys = series.ys[picks].tolist()
    ms = [running[p] for p in picks.tolist()]
    by_step = _segment_cost(xs, ys)[0]
    by_batch, fit = _segment_cost(ms, ys)
    if fit.slope > 0 and by_batch <= 1.1 * by_step:
        return first, last
    return None


def first_detection(
    xs: Sequence[float] | np.ndarray,
    ys: Sequence[float] | np.ndarray,
    every: float = 5,
    config: LeakConfig = DEFAULT_CONFIG,
    after: float | None = None,
    tokens: Sequence[int | None] | np.ndarray | None = None,
) -> tuple[float | None, LeakResult | None]:
    """Replay a series as a live monitor sees it: test each prefix ending every ``every`` x.

    Returns the first x at which the test fires, with its result, or ``(None, None)``. ``after``
    skips the prefixes ending before it (to ask "when was this leak, which began at x, caught").
    """
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    toks = _token_array(tokens) if tokens is not None else None
    order = _order(x, y)
    if order is not None:
        x, y = x[order], y[order]
        toks = toks[order] if toks is not None else None
    n = len(x)
    if not n:
        return None, None
    end = float(x[-1])
    t = float(x[0]) + every
    count = 0
    while t <= end + every:
        count = int(np.searchsorted(x, t, side="right"))  # the points up to t
        if after is None or t >= after:
            result = detect_leak(x[:count], y[:count], config, tokens=toks[:count] if toks is not None else None)
            if result.detected:
                return min(t, end), result
        if count >= n:
            break
        t += every
    return None, None
