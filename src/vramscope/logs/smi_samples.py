"""Which rows of an nvidia-smi CSV make one sample, when it was not asked for the GPU index.

``nvidia-smi --query-gpu=timestamp,... -l 1`` writes one line per GPU per sample, GPUs in index order,
and stamps each line when it reads that GPU: on a real multi-GPU host the lines of one sample are a
few milliseconds apart, not byte-identical. A row's GPU is then its place among the rows of its sample.

A new sample starts where the gap to the row before is larger than the gaps within a sample. Those are
found in the gaps themselves: sorted, the distinct positive gaps jump from the few milliseconds
between the GPUs of a sample to the sampling interval. The split is kept only when it gives samples
of one size (at least 90% of the rows), more GPUs than identical stamps alone give, and no more than
:data:`MAX_GPUS`; otherwise rows group by identical stamps, as before (a single GPU whose interval
jitters, or that stalled once, stays a single GPU). Pure functions: ``logfile`` runs them over lists,
``fastcsv`` over numpy arrays, and both give the same positions.
"""

from __future__ import annotations

from collections import Counter
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


def positions(millis: Sequence[int | None]) -> list[int]:
    """Each row's place in its sample (its GPU), from the rows' stamps in ms (None: unknown, a sample alone)."""
    n = len(millis)
    if n == 0:
        return []
    gaps = [None if a is None or b is None else b - a for a, b in pairwise(millis)]
    known = [g for g in gaps if g is not None and g > 0]
    tolerance = None
    if known and max(known) >= MIN_JUMP * min(known):
        tolerance = within_sample_tolerance(sorted(set(known)))
    exact = [g != 0 for g in gaps]  # a new sample at row i + 1 (None != 0: an unknown stamp starts one)
    starts = exact
    if tolerance is not None:
        tolerant = [g is None or not 0 <= g <= tolerance for g in gaps]
        if tolerance_is_better(sample_sizes(exact, n), sample_sizes(tolerant, n)):
            starts = tolerant
    out = [0] * n
    for i, new in enumerate(starts, start=1):
        out[i] = 0 if new else out[i - 1] + 1
    return out


def sample_sizes(starts: Sequence[bool], n: int) -> Counter[int]:
    """{size: samples} of ``n`` rows where ``starts[i]`` says row i + 1 begins a new sample."""
    begins = [0] + [i for i, new in enumerate(starts, start=1) if new] + [n]
    return Counter(b - a for a, b in pairwise(begins))
