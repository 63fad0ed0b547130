"""Thin a long series for plotting without losing its peaks.

A day of samples at 10 Hz is a million points; a chart a thousand pixels wide shows at most a few
thousand. Averaging or taking every n-th point would hide the short spikes that cause an OOM, so the
series is cut into equal buckets of consecutive points and each bucket keeps its minimum and its
maximum, in the order they occur: the drawn line still touches every peak and every trough.

Works on plain lists with builtins (``max``, ``min``, ``list.index`` run in C), so a million points
cost a few C passes, not a Python loop per point.
"""

from __future__ import annotations

from collections.abc import Sequence

from vramscope.analysis.peaks import Stretch, combine, regroup, stretch_extremes

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
    if buckets < 1:
        raise ValueError(f"buckets must be at least 1, got {buckets}")
    n = len(values)
    if n <= 2 * buckets:
        return [i for i, v in enumerate(values) if v is not None]
    cuts = bucket_cuts(n, buckets)
    return minmax_from_stretches(values, buckets, cuts, stretch_extremes(values, cuts)[0])


def bucket_cuts(n: int, buckets: int) -> list[int]:
    """Where each of ``buckets`` equal buckets of ``n`` points begins, and ``n``: ascending, no repeats
    when ``n >= buckets``."""
    return [b * n // buckets for b in range(buckets + 1)]


def minmax_from_stretches(
    values: Sequence[float | None], buckets: int, cuts: Sequence[int], stretches: Sequence[Stretch | None]
) -> list[int]:
    """:func:`minmax_indices` from the extremes of stretches of the series (see
    :func:`~vramscope.analysis.peaks.stretch_extremes`), cut at ``cuts``: at least at every bucket's start.

    A caller that cuts the series finer for its own reasons (a chart's phases) reads it once for both.
    Of int series only, when a bucket is cut in several stretches: a NaN has no place in their order.
    """
    n = len(values)
    if n <= 2 * buckets:
        return [i for i, v in enumerate(values) if v is not None]
    keep: list[int] = []
    for part in regroup(stretches, cuts, bucket_cuts(n, buckets)):
        found = combine(part)
        if found is None:
            continue
        _, i_low, _, i_high = found
        if i_low == i_high:
            keep.append(i_low)
        else:
            keep.extend((i_low, i_high) if i_low < i_high else (i_high, i_low))
    # The ends anchor the line to the start and end of the run.
    first = next((i for i, v in enumerate(values) if v is not None), None)
    last = next((i for i in range(n - 1, -1, -1) if values[i] is not None), None)
    if first is not None and (not keep or keep[0] != first):
        keep.insert(0, first)
    if last is not None and keep[-1] != last:
        keep.append(last)
    return keep


def minmax_downsample(
    xs: Sequence[float], ys: Sequence[float | None], buckets: int = DEFAULT_BUCKETS
) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` thinned by :func:`minmax_indices` on ``ys`` (points where ``ys`` is None are dropped)."""
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} and {len(ys)})")
    index = minmax_indices(ys, buckets)
    return [xs[i] for i in index], [ys[i] for i in index]  # type: ignore[misc]
