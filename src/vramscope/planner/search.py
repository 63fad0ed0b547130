"""The one search the planner's "largest batch / longest sequence / largest micro-batch" answers share."""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(fits: Callable[[int], bool], hi: int) -> int:
    """Largest n in [1, hi] with ``fits(n)`` true (``fits`` is monotone), or 0 when even 1 does not fit.

    Doubling then bisection: O(log hi) calls, so a huge upper bound costs nothing.
    """
    if not fits(1):
        return 0
    lo, n = 1, 2
    while n <= hi and fits(n):
        lo, n = n, n * 2
    top = min(n, hi + 1)
    while top - lo > 1:
        mid = (lo + top) // 2
        if fits(mid):
            lo = mid
        else:
            top = mid
    return lo
