"""What a monitor tells from its analysis: throttled warnings, numbers for a trainer's logs, and Prometheus."""

from __future__ import annotations

import contextlib
from typing import Any

from vramscope.analysis.alerts import Alerts
from vramscope.types import HostReading, Sample
from vramscope.units import GIB, MIB

LEAK_HINT = (
    "look for tensors kept across steps: losses summed without .item(), lists of outputs, eval that keeps logits"
)


def raise_warnings(alerts: Alerts, result: dict[str, Any], step: int | None, total_steps: int | None) -> None:
    """Warn (or clear the warnings) about leaks, caching, a coming OOM and the longest batch, from ``result``.

    Args:
        alerts: where the warnings go (throttled, saved beside the log).
        result: the analysis dict (:func:`vramscope.analysis.summary.analyze_columns`).
        step: the last step seen, for the warnings' step and the OOM's step.
        total_steps: the run's last step when known: an OOM forecast beyond it is not a warning.
    """
    leak = result["leak"]
    where = "" if leak.get("key") in (None, "host") else f"GPU {leak['key']}: "
    if leak["detected"]:
        alerts.warn("leak", f"{where}{leak['verdict']}; {LEAK_HINT}", step)
    else:
        alerts.clear("leak")
    if leak["kind"] in ("caching", "fragmentation"):
        alerts.warn("caching", f"{where}{leak['verdict']}", step)
    fc = result["forecast"]
    steps_to_oom = fc.get("steps_to_oom")
    remaining = None if total_steps is None or step is None else total_steps - step
    if leak["detected"] and steps_to_oom is not None and (remaining is None or steps_to_oom <= remaining):
        when = f" (~{fc['seconds_to_oom'] / 60:.0f} min)" if fc.get("seconds_to_oom") is not None else ""
        at = f", around step {step + int(steps_to_oom)}" if step is not None else ""
        alerts.warn("oom", f"{where}at this rate memory runs out in ~{steps_to_oom:.0f} steps{when}{at}",
                    step, urgency=steps_to_oom)
    else:
        alerts.clear("oom")
    lb = fc.get("longest_batch") or {}
    if lb.get("at_risk") and lb.get("warning"):
        alerts.warn("longest_batch", lb["warning"], step)


def trainer_figures(sample: Sample | None, peak: int | None, analysis: dict[str, Any] | None) -> dict[str, float]:
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
    if analysis is not None:
        leak = analysis["leak"]
        if leak["detected"] and leak["slope_bytes_per_step"] is not None:
            out["mem/leak_mib_per_step"] = round(leak["slope_bytes_per_step"] / MIB, 4)
            steps = analysis["forecast"].get("steps_to_oom")
            if steps is not None:
                out["mem/steps_to_oom"] = float(round(steps))
    return out


def export_analysis(sink: Any, result: dict[str, Any]) -> None:
    """Hand each device's leak slope and steps-to-OOM to a Prometheus sink (withdrawn when no leak is seen).

    Never raises: the exporter is an extra, the analysis and the training go on without it.
    """
    for key, lk in result["leak"]["devices"].items():
        fc = result["forecast"]["devices"].get(key, {})
        gpu = None if key == "host" else int(key)
        slope = lk["slope_bytes_per_step"] if lk["detected"] else None
        oom = fc.get("steps_to_oom") if lk["detected"] else None
        with contextlib.suppress(Exception):
            sink.set_analysis(slope, oom, gpu)
