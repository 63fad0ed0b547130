"""OOM forecast: how long until a growing run runs out of memory, and whether its longest batch fits.

Two risks, two forecasts:

* a leak: with the slope from :mod:`vramscope.analysis.leak` and the room left between the recent
  per-step peak and what the allocator can get, the steps (and, from the step rate, the seconds)
  until the peak reaches the capacity;
* the longest batch: a step's peak follows the number of tokens in its batch (activations, logits
  and the cross-entropy scale with it). A robust line of peak against tokens predicts the peak of the
  longest batch the run can see, and the largest batch that still fits, before that batch arrives.

Pure functions over numpy arrays (or lists) of numbers; the results are the frozen types of
:mod:`vramscope.analysis.results`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from vramscope.analysis.leak import median, thin_positions, trend
from vramscope.analysis.results import LongestBatch, OomForecast
from vramscope.units import GIB

# Under this share of the capacity left free, a predicted peak counts as an OOM risk: the allocator
# needs some slack (rounding to blocks, fragmentation) beyond the bytes it hands out.
SAFETY_FRACTION = 0.03
# How many of the newest rows each estimate reads: the step time, and the fit of peak against tokens
# (so that a leak's drift weighs less on it). A caller with a day of rows passes only these.
RECENT_STEP_TIMES = 200
RECENT_BATCHES = 400


def allocator_capacity(
    total_bytes: int | None, device_used_bytes: int | None, reserved_bytes: int | None
) -> int | None:
    """What torch's allocator can reach on a GPU: its total minus what others hold there.

    ``device_used - reserved`` is the CUDA context, libraries' workspaces and other processes; they
    are not the allocator's to use. Without ``reserved`` (no allocator readings), the total.
    """
    if total_bytes is None:
        return None
    if device_used_bytes is None or reserved_bytes is None:
        return total_bytes
    others = max(0, device_used_bytes - reserved_bytes)
    return total_bytes - others


Numbers = Sequence[float] | np.ndarray


def seconds_per_step(steps: Numbers, elapsed_s: Numbers, recent: int = RECENT_STEP_TIMES) -> float | None:
    """The recent step time: Theil-Sen slope of elapsed seconds over steps (robust to eval pauses)."""
    xs, ys = _recent(steps, elapsed_s, recent)
    if len(xs) < 3 or xs[-1] == xs[0]:
        return None
    picks = np.asarray(thin_positions(len(xs), 80), dtype=np.int64)
    slope = trend(xs[picks], ys[picks]).slope
    return slope if slope > 0 else None


def _recent(a: Numbers, b: Numbers, recent: int) -> tuple[np.ndarray, np.ndarray]:
    """The newest ``recent`` of two series of equal length, as float arrays: a day of rows needs none of the rest."""
    if len(a) != len(b):
        raise ValueError(f"the two series differ in length ({len(a)} and {len(b)})")
    return np.asarray(a[-recent:], dtype=np.float64), np.asarray(b[-recent:], dtype=np.float64)


def forecast_oom(
    slope_bytes_per_step: float | None,
    current_peak_bytes: int | None,
    capacity_bytes: int | None,
    step_seconds: float | None = None,
) -> OomForecast:
    """Steps (and seconds) until ``current_peak + slope * steps`` reaches the capacity (less a margin)."""

    def out(steps: float | None, reason: str, headroom: int | None = None) -> OomForecast:
        seconds = steps * step_seconds if steps is not None and step_seconds is not None else None
        return OomForecast(steps, seconds, capacity_bytes, current_peak_bytes, headroom, slope_bytes_per_step,
                           step_seconds, reason)

    if capacity_bytes is None:
        return out(None, "capacity unknown (no GPU total in the log; pass the capacity to forecast)")
    if current_peak_bytes is None:
        return out(None, "no peak readings")
    usable = int(capacity_bytes * (1 - SAFETY_FRACTION))
    headroom = usable - current_peak_bytes
    if headroom <= 0:
        return out(0.0, "the peak is already at the capacity", headroom)
    if slope_bytes_per_step is None or slope_bytes_per_step <= 0:
        return out(None, "memory is not growing", headroom)
    return out(headroom / slope_bytes_per_step, "the leak's growth reaches the capacity", headroom)


def longest_batch(
    tokens: Sequence[int] | np.ndarray,
    peaks: Sequence[int] | np.ndarray,
    capacity_bytes: int | None,
    max_tokens: int | None = None,
    recent: int = RECENT_BATCHES,
) -> LongestBatch:
    """Fit peak = base + bytes_per_token * tokens and predict the peak of the longest batch.

    Args:
        tokens: tokens of each step's batch (the largest forward since the previous logged row).
        peaks: each step's peak bytes.
        capacity_bytes: what the allocator can reach (see :func:`allocator_capacity`).
        max_tokens: the longest batch the run can see (batch size times the maximum sequence
            length); None uses the longest seen so far.
        recent: only the newest rows count, so that a leak's drift weighs less on the fit.
    """
    if len(tokens) != len(peaks):
        raise ValueError(f"the two series differ in length ({len(tokens)} and {len(peaks)})")
    toks = np.asarray(tokens[-recent:], dtype=np.int64)
    tops = np.asarray(peaks[-recent:], dtype=np.int64)
    if not len(toks):
        return LongestBatch(False, "no step has both a token count and a peak reading")
    seen_max = int(toks.max())
    peak_at_max = int(tops[toks == seen_max].max())
    target = max_tokens if max_tokens is not None else seen_max
    result = LongestBatch(
        available=False,
        reason="",
        points=len(toks),
        tokens_seen_max=seen_max,
        peak_at_seen_max_bytes=peak_at_max,
        max_tokens=target,
        capacity_bytes=capacity_bytes,
    )
    if len(np.unique(toks)) < 3:
        # One batch shape: its peak is known, a slope is not.
        return _judged(replace(
            result,
            reason="every batch had the same size; the peak does not depend on tokens in this run",
            predicted_peak_bytes=float(peak_at_max) if target == seen_max else None,
            available=target == seen_max,
        ))
    order = np.lexsort((tops, toks))  # by tokens, then peak
    picks = order[np.asarray(thin_positions(len(order), 150), dtype=np.int64)]
    xs, ys = toks[picks].astype(np.float64), tops[picks].astype(np.float64)
    fit = trend(xs, ys)
    slope = max(0.0, fit.slope)
    # The line through the medians (Theil-Sen's intercept) sits in the middle of the cloud; memory
    # risk is about the top of it, so shift it up by the typical excess of the points above the line.
    above = ys - (fit.intercept + slope * xs)
    upper = above[above > 0]
    lift = median(upper) if len(upper) else 0.0
    base = fit.intercept + lift
    predicted = base + slope * target
    # Never predict less than what was measured for the longest batch already seen.
    if target >= seen_max:
        predicted = max(predicted, float(peak_at_max))
    fits = None
    if capacity_bytes is not None and slope > 0:
        room = capacity_bytes * (1 - SAFETY_FRACTION) - base
        fits = max(0, math.floor(room / slope))
    return _judged(replace(result, available=True, reason="fitted", bytes_per_token=slope, base_bytes=base,
                           predicted_peak_bytes=predicted, max_tokens_that_fit=fits))


def _judged(result: LongestBatch) -> LongestBatch:
    """``result`` with ``at_risk`` and its warning set when the longest batch would not fit."""
    if result.capacity_bytes is None or result.predicted_peak_bytes is None or result.max_tokens is None:
        return result
    usable = result.capacity_bytes * (1 - SAFETY_FRACTION)
    if result.predicted_peak_bytes < usable:
        return result
    fit = f"; about {result.max_tokens_that_fit} tokens fit" if result.max_tokens_that_fit is not None else ""
    return replace(result, at_risk=True, warning=(
        f"a batch of {result.max_tokens} tokens would peak at about {result.predicted_peak_bytes / GIB:.1f} GiB, "
        f"over the {result.capacity_bytes / GIB:.1f} GiB the allocator can use{fit}: "
        "cap the sequence length or lower the batch size before it arrives"
    ))
