"""Which rows of an nvidia-smi CSV make one sample, when it was not asked for the GPU index.

``nvidia-smi --query-gpu=timestamp,... -l 1`` writes one line per GPU per sample, GPUs in index order,
and stamps each line when it reads that GPU: on a real multi-GPU host the lines of one sample are a
few milliseconds apart, not byte-identical. A row's GPU is then its place among the rows of its sample.

A new sample starts where the gap to the row before is larger than the gaps within a sample. Those are
found in the gaps themselves: sorted, the distinct positive gaps jump from the few milliseconds
between the GPUs of a sample to the sampling interval. The split is kept only when it gives samples
of one size (at least 90% of the rows), more GPUs than identical stamps alone give, and no more than
:data:`MAX_GPUS`; otherwise rows group by identical stamps, as before (a single GPU whose interval
jitters, or that stalled once, stays a single GPU). Pure functions of the gaps, which
:func:`vramscope.logs.smi_reader.tick_positions` applies to the whole column at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

MAX_GPUS = 64
# The GPUs of one sample are read within this much of each other (8 GPUs take ~40 ms).
MAX_WITHIN_SAMPLE_MS = 1000
# The sampling interval is at least this many times the largest gap within a sample.
MIN_JUMP = 4
# A split is believed when this share of the rows falls in samples of the most common size.
REGULAR_SHARE = 0.9


def within_sample_tolerance(distinct_gaps: Sequence[int]) -> int | None:
    """The largest gap (ms) still within one sample, from the sorted distinct positive gaps; None if none stands out.

    That is the gap below the largest relative jump (at least :data:`MIN_JUMP` times) among gaps up to
    :data:`MAX_WITHIN_SAMPLE_MS`.
    """
    best: int | None = None
    best_jump = float(MIN_JUMP)
    for low, high in pairwise(distinct_gaps):
        if low > MAX_WITHIN_SAMPLE_MS:
            break
        if low > 0 and high / low >= best_jump:
            best, best_jump = low, high / low
    return best


def usual_size(sizes: Mapping[int, int]) -> tuple[int, float]:
    """(the most common sample size, the share of rows in samples of that size) from {size: samples}."""
    rows = sum(size * count for size, count in sizes.items())
    if not rows:
        return 0, 0.0
    size = max(sizes, key=lambda s: (s * sizes[s], s))
    return size, size * sizes[size] / rows


def tolerance_is_better(exact: Mapping[int, int], tolerant: Mapping[int, int]) -> bool:
    """Whether grouping within the tolerance (sample sizes ``tolerant``) beats identical stamps (``exact``)."""
    size, share = usual_size(tolerant)
    return usual_size(exact)[0] < size <= MAX_GPUS and share >= REGULAR_SHARE
