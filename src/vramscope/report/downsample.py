"""Thin a long series for plotting without losing its peaks.

A day of samples at 10 Hz is a million points; a chart a thousand pixels wide shows at most a few
thousand. Averaging or taking every n-th point would hide the short spikes that cause an OOM, so the
series is cut into equal buckets of consecutive points and each bucket keeps its minimum and its
maximum (the first of equals), in the order they occur: the drawn line still touches every peak and
every trough. Whole-array numpy work: a few passes over the series, whatever its length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Two points per bucket: 1500 buckets keep a 3000-point line, finer than any chart is drawn.
DEFAULT_BUCKETS = 1500


def minmax_indices(values: Sequence[float | None], buckets: int = DEFAULT_BUCKETS) -> list[int]:
    """Positions of the points to keep: each bucket's minimum and maximum, plus the first and last point.

    Args:
        values: the series; ``None`` (unknown) is skipped, never kept.
        buckets: how many equal runs of consecutive points to cut the series into (at least 1).

    Returns:
        Ascending positions into ``values``. When there are no more than ``2 * buckets`` known points,
        every known point is kept.
    """
    known = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    numbers = np.fromiter((0.0 if v is None else v for v in values), dtype=np.float64, count=len(values))
    return [int(i) for i in minmax_positions(numbers, known, buckets)]


def minmax_positions(values: np.ndarray, known: np.ndarray, buckets: int = DEFAULT_BUCKETS) -> np.ndarray:
    """:func:`minmax_indices` of a numpy series with its known-mask."""
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    n = len(values)
    if n <= 2 * buckets:
        return np.flatnonzero(known)
    starts = bucket_cuts(n, buckets)[:-1]
    every = bool(known.all())
    if every:
        high_side, low_side = values, values
    else:
        if not known.any():
            return np.zeros(0, np.int64)
        low_fill = np.iinfo(values.dtype).max if values.dtype.kind == "i" else np.inf
        high_fill = np.iinfo(values.dtype).min if values.dtype.kind == "i" else -np.inf
        high_side = np.where(known, values, high_fill)
        low_side = np.where(known, values, low_fill)
    highs = _first_extreme(high_side, starts, np.maximum)
    lows = _first_extreme(low_side, starts, np.minimum)
    if not every:
        has = np.logical_or.reduceat(known, starts)
        highs, lows = highs[has], lows[has]
    keep = np.unique(np.concatenate((highs, lows)))
    # The ends anchor the line to the start and end of the run.
    ends = np.array([0, n - 1] if every else [int(np.argmax(known)), n - 1 - int(np.argmax(known[::-1]))])
    return np.unique(np.concatenate((keep, ends)))


def _first_extreme(values: np.ndarray, starts: np.ndarray, extreme: np.ufunc) -> np.ndarray:
    """Each bucket's first position of its extreme value (``np.maximum`` or ``np.minimum``)."""
    n = len(values)
    if values.dtype.kind in "iu":
        # Integers (the memory columns): argmax/argmin of each bucket's slice, the first of equals, reading the
        # series once; a third of the time of the whole-series passes below, which make two arrays of its length.
        first_of = np.ndarray.argmax if extreme is np.maximum else np.ndarray.argmin
        ends = [*starts[1:].tolist(), n]
        return np.array([s + int(first_of(values[s:e])) for s, e in zip(starts.tolist(), ends, strict=True)],
                        dtype=np.int64)
    # Floats: a NaN is no extreme (the bucket then has none, n), where argmax would pick it.
    tops = extreme.reduceat(values, starts)
    sizes = np.diff(np.append(starts, n))
    hits = np.flatnonzero(values == np.repeat(tops, sizes))
    # The first hit at or after a bucket's start, when it is in that bucket (it is, unless the extreme is NaN);
    # else n, as where no value equals it.
    first = np.append(hits, n)[np.searchsorted(hits, starts)]
    inside: np.ndarray = np.where(first < starts + sizes, first, n)
    return inside


def bucket_cuts(n: int, buckets: int) -> np.ndarray:
    """Where each of ``buckets`` equal buckets of ``n`` points begins, and ``n``: ascending, no repeats
    when ``n >= buckets``."""
    return np.arange(buckets + 1, dtype=np.int64) * n // buckets


def minmax_downsample(
    xs: Sequence[float], ys: Sequence[float | None], buckets: int = DEFAULT_BUCKETS
) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` thinned by :func:`minmax_indices` on ``ys`` (points where ``ys`` is None are dropped)."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} and {len(ys)})")
    index = minmax_indices(ys, buckets)
    return [xs[i] for i in index], [y for y in (ys[i] for i in index) if y is not None]
