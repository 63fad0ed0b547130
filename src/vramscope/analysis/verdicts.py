"""The analysis' judgements of a device, computed once into its typed results, which every renderer only draws:

* :func:`forecast_severity`: how urgent an OOM forecast is, from the time left (not from the word "OOM"):
  a forecast of four thousand days is not an alarm;
* :func:`oom_outlook`: what the log says of running out of memory, in the words the page, the terminal and
  ``--json`` all show: a capacity below what the log holds, an OOM in steps or (a log without steps) in time,
  a longest batch at risk, or nothing ahead;
* :func:`device_idle`: a GPU this run did not use (no step, nothing beyond a CUDA context), which gets
  no advice;
* :func:`batches_note`: why the longest batches have no peak, instead of a bare "?";
* :func:`leak_trend`: where a leak's trend line lies on the signal's readings;
* :func:`headroom_level`: how tight the headroom at the peak is;
* :func:`imbalance_notable`: whether the ranks' peaks differ enough to look at.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vramscope.analysis.devices import DeviceRows
from vramscope.analysis.forecast import SAFETY_FRACTION
from vramscope.analysis.leak import median
from vramscope.analysis.results import (
    BatchPeak,
    DeviceLeak,
    LongestBatch,
    OomForecast,
    OomOutlook,
    PeakAt,
    Severity,
    TrendLine,
)
from vramscope.units import GIB, MIB, human_precise

# A forecast closer than this is red: it can hit before anyone looks again (tonight's run).
HIGH_SECONDS = 4 * 3600
# Closer than this is amber: a run of a day or more reaches it.
MEDIUM_SECONDS = 24 * 3600
# Without a step time, the steps left are held against the steps logged so far.
HIGH_RUN_RATIO = 1.0
MEDIUM_RUN_RATIO = 10.0
# What a CUDA context and the libraries' workspaces hold on a GPU that runs nothing (0.3-1.5 GiB
# depending on the GPU and the libraries loaded): a run at or below it did no work there.
IDLE_ALLOWANCE = 1536 * MIB
# Memory of this run on a device, in the order the log knows it best.
OWN_METRICS = ("process_bytes", "reserved_bytes", "peak_allocated_bytes", "allocated_bytes")
TREND_POINTS = 4000  # readings used to place the leak trend line (an intercept is a median: cheap and robust)

SEVERITIES = ("high", "medium", "low")

# Headroom at the peak under this fraction of the capacity is "high" (red): the next longer batch or a fragmented
# cache can fail; under the next, "medium" (amber).
HEADROOM_HIGH = 0.05
HEADROOM_MEDIUM = 0.10
# Ranks whose peaks differ by this fraction or more hold unequal shares: worth a look (a rank 0 that also evaluates,
# uneven sequence lengths, a split that is not even).
IMBALANCE_NOTABLE = 0.10


def headroom_level(headroom_bytes: int | None, fraction: float | None) -> str | None:
    """How tight the headroom at the peak is, one of :data:`SEVERITIES`; None when there is no headroom to judge.

    A headroom without a fraction (a capacity of 0) or below zero (a capacity given below the log's peak) is "high".
    """
    if headroom_bytes is None:
        return None
    room = fraction if fraction is not None and headroom_bytes >= 0 else 0.0
    return "high" if room < HEADROOM_HIGH else "medium" if room < HEADROOM_MEDIUM else "low"


def imbalance_notable(imbalance: float | None) -> bool:
    """Whether the ranks' peaks (``max/min - 1``) differ by :data:`IMBALANCE_NOTABLE` or more."""
    return imbalance is not None and imbalance >= IMBALANCE_NOTABLE


def forecast_severity(oom: OomForecast | None, steps_logged: int | None) -> Severity | None:
    """How urgent ``oom`` is; None for a forecast without a time to OOM (or no forecast).

    From the seconds left when the log has a step time (red under HIGH_SECONDS, amber under
    MEDIUM_SECONDS), else from the steps left against the steps logged so far.
    """
    if oom is None:
        return None
    return _severity(oom.steps_to_oom, oom.seconds_to_oom, steps_logged)


def _severity(steps: float | None, seconds: float | None, steps_logged: int | None) -> Severity | None:
    if steps is None and seconds is None:
        return None
    if (steps is not None and steps <= 0) or (seconds is not None and seconds <= 0):
        return Severity("high", "the peak is already at the capacity")
    if seconds is not None:
        level = "high" if seconds < HIGH_SECONDS else "medium" if seconds < MEDIUM_SECONDS else "low"
        return Severity(level, f"about {duration(seconds)} left (red under {HIGH_SECONDS // 3600} h, "
                        f"amber under {MEDIUM_SECONDS // 3600} h)")
    if steps is None or not steps_logged:
        return Severity("medium", "no step time in the log to tell how soon")
    ratio = steps / steps_logged
    level = "high" if ratio <= HIGH_RUN_RATIO else "medium" if ratio <= MEDIUM_RUN_RATIO else "low"
    return Severity(level, f"{steps:,.0f} steps left, {ratio:.1f} times the {steps_logged:,} logged "
                    "(no step time in the log)")


def oom_outlook(where: str, oom: OomForecast, batch: LongestBatch, severity: Severity | None, leak: DeviceLeak,
                held_bytes: int | None, capacity_given: str | None, key: str | None = None) -> OomOutlook:
    """What to say of running out of memory on one device (``where``: "GPU 0"), judged once for every renderer.

    Args:
        oom: the device's forecast; batch: its longest-batch forecast; severity: how urgent ``oom`` is.
        leak: the device's leak verdict (a forecast of a log too short to test says so, not "not growing").
        held_bytes: the most the log shows this device holding (its peak).
        capacity_given: how the capacity was given, for people (``--gpu-memory 8.00 GiB``), when it was given
            rather than logged; None: the GPU's logged total.
    """
    level = None if severity is None else severity.level
    cap = oom.capacity_bytes
    if cap is not None and held_bytes is not None and held_bytes > cap and capacity_given is not None:
        return OomOutlook("over_capacity", "does not fit the capacity given",
                          f"{capacity_given} is below the {held_bytes / GIB:.1f} GiB this log already holds on {where}",
                          "high", key)
    if oom.headroom_bytes is not None and oom.headroom_bytes <= 0 and cap is not None:
        peak = oom.current_peak_bytes or 0
        return OomOutlook("at_capacity", "at the capacity now",
                          f"{where}: the peak of {peak / GIB:.2f} GiB is within the {SAFETY_FRACTION:.0%} the "
                          f"allocator needs free of the {cap / GIB:.2f} GiB it can use", "high", key)
    if cap is None:
        return OomOutlook("unknown", "no forecast", oom.reason, None, key)
    if oom.steps_to_oom is not None:
        when = f"~{oom.steps_to_oom:,.0f} steps"
        if oom.seconds_to_oom is not None:
            when += f" (about {duration(oom.seconds_to_oom)})"
        rate = "" if oom.slope_bytes_per_step is None else f" of {human_precise(oom.slope_bytes_per_step)}/step"
        why = "" if severity is None else f"; {severity.why}"
        return OomOutlook("leak", f"out of memory in {when}",
                          f"{where}: the leak's growth{rate} reaches the capacity{why}", level, key)
    if oom.seconds_to_oom is not None:
        rate = "" if oom.slope_bytes_per_second is None else f" of {human_precise(oom.slope_bytes_per_second)}/s"
        return OomOutlook("leak", f"out of memory in about {duration(oom.seconds_to_oom)}",
                          f"{where}: at the growth{rate}, the peak reaches the {cap / GIB:.2f} GiB capacity "
                          f"(less the {SAFETY_FRACTION:.0%} the allocator keeps free)", level, key)
    if batch.at_risk:
        return OomOutlook("longest_batch", "longest batch at risk", f"{where}: {batch.warning}", "high", key)
    if oom.current_peak_bytes is None:
        return OomOutlook("unknown", "no forecast", oom.reason, None, key)
    if leak.kind == "insufficient":
        return OomOutlook("unknown", "no forecast yet",
                          f"{where}: the log is too short to tell whether memory grows (see the leak test)", None, key)
    return OomOutlook("none", "no OOM ahead", f"{where}: {oom.reason}", None, key)


def device_idle(key: str, peaks: Mapping[str, PeakAt], has_steps: bool) -> str | None:
    """Why a GPU counts as idle for this run, or None when the run used it.

    Idle: no training step logged on it, and this run held no more than a CUDA context there (its
    processes' memory, or the allocator's, or, in a log with neither, the device's used memory).
    """
    if key == "host" or has_steps:
        return None
    used = _bytes(peaks, "device_used_bytes")
    known = [v for v in (_bytes(peaks, m) for m in OWN_METRICS) if v is not None]
    mine = max(known) if known else used
    if mine is None or mine > IDLE_ALLOWANCE:
        return None
    if not known:
        return f"idle: no training step, and at most {human_precise(mine)} in use (a CUDA context at most)"
    held = "no memory" if mine == 0 else f"at most {human_precise(mine)} (a CUDA context at most)"
    text = f"idle: no training step, and this run held {held} on it"
    if used is not None and used - mine >= GIB:
        text += f"; the {human_precise(used)} in use there belong to other processes"
    return text


def _bytes(peaks: Mapping[str, PeakAt], metric: str) -> int | None:
    found = peaks.get(metric)
    return None if found is None else found.bytes


def batches_note(peak_metric: str | None, batches: Sequence[BatchPeak]) -> str | None:
    """Why some of the longest batches have no peak; None when every one has it."""
    peaks = [b.peak_allocated_bytes for b in batches]
    if not peaks or all(p is not None for p in peaks):
        return None
    if peak_metric is None:
        return "peaks unknown: the log has no allocator readings (a CPU run, or a log of NVML alone)"
    return f"a peak is unknown where no {peak_metric} was logged at that step"


def leak_trend(dev: DeviceRows, leak: DeviceLeak) -> TrendLine | None:
    """The trend line of a leak found over steps, from its start to the last step: its slope, through the median
    of the readings less the slope (on at most about :data:`TREND_POINTS` of the rows with a step); None for
    no leak, or one over time."""
    slope, start, signal = leak.slope_bytes_per_step, leak.start_step, leak.signal
    if not leak.detected or slope is None or start is None or signal is None:
        return None
    step, col = dev.column("step"), dev.column(signal)
    rows = np.flatnonzero(step.known)
    sampled = rows[:: max(1, len(rows) // TREND_POINTS)]
    picked = sampled[(step.values[sampled] >= start) & col.known[sampled]]
    if not len(picked):
        return None
    steps = step.values[picked]
    intercept = median(col.values[picked] - slope * steps)
    x0, x1 = float(start), float(steps.max())
    return TrendLine(signal, x0, x1, intercept + slope * x0, intercept + slope * x1)


def duration(seconds: float) -> str:
    """A span of time for people: ``45 s``, ``18 min``, ``5.2 h``, ``3.1 days``, ``6.9 years``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 365 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / (365.25 * 86400):.1f} years"
