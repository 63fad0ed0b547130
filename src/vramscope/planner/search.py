"""The one search the planner's "largest batch / longest sequence / largest micro-batch" answers share, and the
two of one step that the plan and its micro-batch recommendation both ask."""

from __future__ import annotations

from collections.abc import Callable

from vramscope.planner.memory import Hardware, estimate
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

MAX_BATCH = 1 << 16
MAX_SEQ = 1 << 20


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


def max_batch_size(shape: ModelShape, spec: QLoraSpec, seq_len: int, capacity: int, hw: Hardware | None = None) -> int:
    """The largest micro-batch whose predicted peak fits in ``capacity`` bytes (0 if none does)."""
    return largest_fitting(lambda b: estimate(shape, spec, b, seq_len, hw).device_bytes <= capacity, MAX_BATCH)


def max_seq_len(shape: ModelShape, spec: QLoraSpec, batch_size: int, capacity: int, hw: Hardware | None = None,
                limit: int | None = None) -> int:
    """The longest sequence whose predicted peak fits in ``capacity`` bytes at ``batch_size`` (0 if none),
    at most ``limit`` (the model's context, ``max_position_embeddings``, when given)."""
    top = min(MAX_SEQ, limit) if limit else MAX_SEQ
    return largest_fitting(lambda s: estimate(shape, spec, batch_size, s, hw).device_bytes <= capacity, top)
