"""What ``vramscope report --json`` prints: the summary of one log, or of several with their comparison.

The JSON edge of the report: the one place where its typed objects (:class:`~vramscope.report.model.LogReport`:
the analysis, the advice, the parallelism check, the breakdown) become dicts, with the schema version on top
so that a consumer can tell which shape it reads. Nothing here judges: the verdicts are the ones the terminal
and the page show (the analysis' own fields, read through :mod:`vramscope.report.figures`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vramscope.analysis.results import SCHEMA_VERSION, DeviceAnalysis
from vramscope.report.charts import DeviceView
from vramscope.report.compare import compare
from vramscope.report.figures import duration_shown, oom_severity
from vramscope.report.model import LogReport

__all__ = ["SCHEMA_VERSION", "json_document", "summary_of"]


def json_document(reports: Sequence[LogReport]) -> dict[str, Any]:
    """``{"schema_version": 1, **summary}`` for one log; ``{"schema_version", "logs", "comparison"}`` for several."""
    if len(reports) == 1:
        return {"schema_version": SCHEMA_VERSION, **summary_of(reports[0])}
    return {"schema_version": SCHEMA_VERSION, "logs": [summary_of(r) for r in reports],
            "comparison": [row.to_json() for row in compare(reports)]}


def summary_of(report: LogReport) -> dict[str, Any]:
    """One log's summary as ``--json`` writes it (docs/leak-detection.md describes its keys)."""
    result = report.result
    steps_logged = result.steps.logged
    log: dict[str, Any] = {
        "path": report.path,
        "format": report.log_format,
        "rows": result.rows,
        "start": result.start,
        "duration_s": duration_shown(result),
        "devices": result.keys,
        "steps": result.steps.to_json(),
        "phases": sorted(result.phases),
    }
    if report.read_as is not None:
        log["columns"] = report.read_as
    severity = oom_severity(result)
    summary: dict[str, Any] = {
        "log": log,
        "devices": {view.key: _device(result.device(view.key), view, steps_logged) for view in report.devices},
        "leak": result.leak.to_json(),
        "peak": result.peak.to_json(),
        "forecast": result.forecast.to_json(),
        "warnings": list(result.warnings),
        "oom_severity": None if severity is None else severity.to_json(),
    }
    if result.ranks is not None:
        summary["ranks"] = [r.to_json() for r in result.ranks.ranks]
        summary["imbalance_metric"], summary["imbalance"] = result.ranks.metric, result.ranks.imbalance
    summary["recommendations"] = [a.to_dict() for a in report.advice]
    if report.parallelism is not None:
        summary["parallelism"] = report.parallelism.to_json()
    if report.breakdown is not None:
        summary["breakdown"] = report.breakdown.to_dict()
    safe: dict[str, Any] = _json_safe(summary)
    return safe


def _device(dev: DeviceAnalysis, view: DeviceView, steps_logged: int | None) -> dict[str, Any]:
    detail = dev.detail
    severity = dev.forecast.severity
    return {
        "title": detail.title,
        "gpu": detail.gpu,
        "rows": detail.rows,
        "idle": view.idle,
        "peaks": {m: p.report_json() for m, p in detail.peaks.items()},
        "phases": {label: p.report_json() for label, p in detail.phases.items()},
        **detail.headroom.to_json(),
        "capacity_source": view.timeline.capacity_source,
        "oom_severity": None if severity is None else severity.to_json(),
        "fragmentation": None if detail.fragmentation is None else detail.fragmentation.to_json(),
        "longest_batches": [b.to_json() for b in detail.longest_batches],
        "longest_batches_note": detail.batches_note,
    }


def _json_safe(value: Any) -> Any:
    """Plain JSON: tuples become lists, NaN and infinities become null (json would write invalid NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
