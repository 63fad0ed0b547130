"""What a report says about one log, as data: the summary (JSON-ready) and the series to draw.

:func:`build_report` reads nothing and renders nothing: it takes a :class:`~vramscope.logs.table.LogTable`,
runs :func:`vramscope.analysis.summary.analyze` on it once (devices, phases, peaks, leak verdict, OOM
forecast, fragmentation, longest batches: typed results), and turns those results and the log's
columns into what the renderers draw (:mod:`vramscope.report.charts`) and the summary ``--json``
prints. The terminal, HTML and PNG renderers only format this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vramscope.advice.log import RunSettings, advise_run_result
from vramscope.analysis.columns import Clock, LogColumns
from vramscope.analysis.details import LONGEST_BATCHES, METRICS
from vramscope.analysis.results import AnalysisResult, DeviceAnalysis
from vramscope.analysis.summary import analyze
from vramscope.logs.table import LogTable
from vramscope.report.charts import Chart, DeviceView, Line, Mark, Span, device_view
from vramscope.report.downsample import DEFAULT_BUCKETS
from vramscope.report.verdicts import batch_peak_note, capacity_source, idle_reason, oom_severity
from vramscope.types import MemoryBreakdown

__all__ = [
    "LONGEST_BATCHES",
    "METRICS",
    "Chart",
    "DeviceView",
    "EmptyLogError",
    "Line",
    "LogReport",
    "Mark",
    "Span",
    "build_report",
]

# What the forecast says when the log has no capacity: the report can be told it, so it names the option.
CAPACITY_HINT = "capacity unknown (no GPU total in the log): give it with --capacity, e.g. --capacity 24GiB"


@dataclass
class LogReport:
    """One log's report: ``summary`` is what ``--json`` prints; ``devices`` is what is drawn."""

    path: str
    summary: dict[str, Any]
    devices: list[DeviceView]
    breakdown: MemoryBreakdown | None = None  # what held memory, from the monitor's file beside the log
    result: AnalysisResult | None = None  # the analysis, typed: what the renderers read
    # ``result.to_json()``, for the renderers that still read dicts: it goes once they read ``result``.
    analysis: dict[str, Any] = field(default_factory=dict)


class EmptyLogError(ValueError):
    """The log has a header but no rows to report on."""


def build_report(table: LogTable, buckets: int = DEFAULT_BUCKETS, settings: RunSettings | None = None,
                 capacity_bytes: int | None = None) -> LogReport:
    """Analyse one log and prepare everything the renderers show.

    Args:
        table: a log from :func:`vramscope.logs.reader.read_log`.
        buckets: min/max buckets per drawn series (two points each).
        settings: what ran (model, batch); adds the planner's recommendations with predicted savings.
        capacity_bytes: the memory each GPU is held against (``--capacity``), in place of the log's
            GPU total: the headroom, the OOM forecast and the charts' capacity line use it.

    Raises:
        EmptyLogError: the log has no rows, or no memory column with a value.
        vramscope.planner.PlanInputError: ``settings`` the planner cannot use (unknown model, say).
    """
    n = len(table)
    if n == 0:
        raise EmptyLogError(f"log {table.path} has no rows yet; was the run still starting?")
    cols = LogColumns.from_table(table)
    if not any(cols.filled(m) for m in METRICS):
        raise EmptyLogError(f"log {table.path} has no memory readings in any row; is it a memory log?")
    result = analyze(table, capacity_bytes=capacity_bytes, capacity_hint=CAPACITY_HINT, columns=cols)
    analysis = result.to_json()
    steps_logged = result.steps.logged
    clock = Clock(cols)
    devices: list[DeviceView] = []
    device_summaries: dict[str, dict[str, Any]] = {}
    for dev in result.devices:
        source = capacity_source(dev.detail.capacity_given, table.kind, dev.detail.total_logged)
        summary_of = _device_summary(dev, source, steps_logged)
        device_summaries[dev.key] = summary_of
        devices.append(device_view(dev, cols, clock, buckets, source, summary_of["idle"]))
    summary: dict[str, Any] = {
        "log": {
            "path": table.path,
            "format": table.kind,
            "rows": n,
            "start": result.start,
            "duration_s": _round(result.clock_duration_s, 3),
            "devices": list(device_summaries),
            "steps": analysis["steps"],
            "phases": sorted(result.phases),
        },
        "devices": device_summaries,
        "leak": analysis["leak"],
        "peak": analysis["peak"],
        "forecast": analysis["forecast"],
        "warnings": analysis["warnings"],
        "oom_severity": oom_severity(analysis["forecast"], steps_logged),
    }
    if result.ranks is not None:
        summary["ranks"] = [r.to_json() for r in result.ranks.ranks]
        summary["imbalance_metric"], summary["imbalance"] = result.ranks.metric, result.ranks.imbalance
    # One Advice type, built from the typed analysis (urgent first, then the planner's priced changes, then the rest).
    idle = {key for key, d in device_summaries.items() if d["idle"]}
    summary["recommendations"] = [a.to_dict() for a in advise_run_result(result, settings, idle)]
    return LogReport(table.path, _json_safe(summary), devices, result=result, analysis=analysis)


def _device_summary(dev: DeviceAnalysis, source: str | None, steps_logged: int | None) -> dict[str, Any]:
    detail = dev.detail
    peaks = {m: p.report_json() for m, p in detail.peaks.items()}
    batches = [b.to_json() for b in detail.longest_batches]
    return {
        "title": detail.title,
        "gpu": detail.gpu,
        "rows": detail.rows,
        "idle": idle_reason(dev.key, peaks, detail.step_range is not None),
        "peaks": peaks,
        "phases": {label: p.report_json() for label, p in detail.phases.items()},
        **detail.headroom.to_json(),
        "capacity_source": source,
        "oom_severity": oom_severity(dev.forecast.to_json(), steps_logged),
        "fragmentation": None if detail.fragmentation is None else detail.fragmentation.to_json(),
        "longest_batches": batches,
        "longest_batches_note": batch_peak_note(detail.batch_metric, batches),
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _json_safe(value: Any) -> Any:
    """Plain JSON: tuples become lists, NaN and infinities become null (json would write invalid NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
