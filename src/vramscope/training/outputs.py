"""What a monitor tells from its analysis: throttled warnings, numbers for a trainer's logs, and Prometheus."""

from __future__ import annotations

import contextlib
from typing import Any

from vramscope.analysis.alerts import Alerts
from vramscope.analysis.results import AnalysisResult
from vramscope.types import HostReading, Sample
from vramscope.units import GIB, MIB

LEAK_HINT = (
    "look for tensors kept across steps: losses summed without .item(), lists of outputs, eval that keeps logits"
)


def raise_warnings(alerts: Alerts, result: AnalysisResult, step: int | None, total_steps: int | None) -> None:
    """Warn (or clear the warnings) about leaks, caching, a coming OOM and the longest batch, from ``result``.

    Args:
        alerts: where the warnings go (throttled, saved beside the log).
        result: the live analysis (:func:`vramscope.analysis.summary.analyze_columns`).
        step: the last step seen, for the warnings' step and the OOM's step.
        total_steps: the run's last step when known: an OOM forecast beyond it is not a warning.
    """
    worst = result.leak.worst  # None: the rows are none yet, so no leak and no OOM ahead
    detected = worst is not None and worst.detected
    where = "" if worst is None or worst.key == "host" else f"GPU {worst.key}: "
    if worst is not None and detected:
        alerts.warn("leak", f"{where}{worst.shown_verdict}; {LEAK_HINT}", step)
    else:
        alerts.clear("leak")
    if worst is not None and worst.shown_kind in ("caching", "fragmentation"):
        alerts.warn("caching", f"{where}{worst.shown_verdict}", step)
    soonest = result.forecast.soonest
    steps_to_oom = None if soonest is None else soonest.oom.steps_to_oom
    remaining = None if total_steps is None or step is None else total_steps - step
    if detected and soonest is not None and steps_to_oom is not None and (
            remaining is None or steps_to_oom <= remaining):
        seconds = soonest.oom.seconds_to_oom
        when = f" (~{seconds / 60:.0f} min)" if seconds is not None else ""
        at = f", around step {step + int(steps_to_oom)}" if step is not None else ""
        alerts.warn("oom", f"{where}at this rate memory runs out in ~{steps_to_oom:.0f} steps{when}{at}",
                    step, urgency=steps_to_oom)
    else:
        alerts.clear("oom")
    batch = result.forecast.longest_batch
    if batch.at_risk and batch.warning:
        alerts.warn("longest_batch", batch.warning, step)


def trainer_figures(sample: Sample | None, peak: int | None, analysis: AnalysisResult | None) -> dict[str, float]:
    """Numbers for a trainer's logs: ``mem/peak_allocated_gib`` (``peak``: since the last call) and others.

    Only known values are returned (missing means absent, not 0).
    """
    out: dict[str, float] = {}
    if sample is None:
        return out
    if sample.allocator:
        if peak is not None:  # no row since the last call: no peak to report (never a made-up 0)
            out["mem/peak_allocated_gib"] = round(peak / GIB, 4)
        out["mem/allocated_gib"] = round(sum(r.allocated_bytes for r in sample.allocator) / GIB, 4)
        out["mem/reserved_gib"] = round(sum(r.reserved_bytes for r in sample.allocator) / GIB, 4)
    elif peak is not None:
        out["mem/peak_rss_gib"] = round(peak / GIB, 4)
    host: HostReading = sample.host
    if host.rss_bytes is not None:
        out["mem/host_rss_gib"] = round(host.rss_bytes / GIB, 4)
    used = [g.used_bytes for g in sample.gpus if g.used_bytes is not None]
    if used:
        out["mem/device_used_gib"] = round(max(used) / GIB, 4)
    worst = None if analysis is None else analysis.leak.worst
    if analysis is not None and worst is not None and worst.detected and worst.slope_bytes_per_step is not None:
        out["mem/leak_mib_per_step"] = round(worst.slope_bytes_per_step / MIB, 4)
        soonest = analysis.forecast.soonest
        steps = None if soonest is None else soonest.oom.steps_to_oom
        if steps is not None:
            out["mem/steps_to_oom"] = float(round(steps))
    return out


def export_analysis(sink: Any, result: AnalysisResult) -> None:
    """Hand each device's leak slope and steps-to-OOM to an exporter (withdrawn when no leak is seen).

    Never raises: the exporter is an extra, the analysis and the training go on without it.
    """
    for key, lk in result.leak.devices.items():
        fc = result.forecast.devices.get(key)
        slope = lk.slope_bytes_per_step if lk.detected else None
        oom = fc.oom.steps_to_oom if lk.detected and fc is not None else None
        with contextlib.suppress(Exception):
            sink.set_analysis(slope, oom, lk.gpu)
