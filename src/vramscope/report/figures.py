"""What the terminal, the HTML page and the comparison read of a report's typed analysis, read one way.

The renderers only format; these pick a figure out of :class:`~vramscope.analysis.results.AnalysisResult`
(the leak's words, the forecast that runs out first and how urgent it is) so that every renderer says
the same thing about the same log.
"""

from __future__ import annotations

from vramscope.analysis.results import (
    AnalysisResult,
    BatchPeak,
    DeviceDetail,
    LeakSummary,
    OomForecast,
    PeakAt,
    Severity,
)
from vramscope.report.charts import DeviceView
from vramscope.report.model import LogReport

NO_ROWS = "the log has no rows"


def leak_kind(leak: LeakSummary) -> str:
    """``leak``, ``none``, ``caching``, ``fragmentation``, ``insufficient``, ...: of the most telling device."""
    return "insufficient" if leak.worst is None else leak.worst.shown_kind


def leak_verdict(leak: LeakSummary) -> str:
    """The leak test's verdict in words, of the most telling device."""
    return NO_ROWS if leak.worst is None else leak.worst.shown_verdict


def soonest_oom(result: AnalysisResult) -> OomForecast | None:
    """The OOM forecast of the device that runs out first (None for a log without rows)."""
    return None if result.forecast.soonest is None else result.forecast.soonest.oom


def oom_severity(result: AnalysisResult) -> Severity | None:
    """How urgent the soonest OOM forecast is; None without a time to OOM."""
    return None if result.forecast.soonest is None else result.forecast.soonest.severity


def no_forecast_reason(result: AnalysisResult) -> str | None:
    """Why the soonest device has no OOM forecast (the analysis names ``--gpu-memory`` when it is unknown)."""
    oom = soonest_oom(result)
    return None if oom is None else oom.reason


def duration_shown(result: AnalysisResult) -> float | None:
    """The log's length by the clock, in seconds, as ``--json`` writes it (to the ms)."""
    return None if result.clock_duration_s is None else round(result.clock_duration_s, 3)


def devices_of(report: LogReport) -> list[tuple[DeviceView, DeviceDetail]]:
    """Each device as drawn (title, charts, idle) with what the analysis found on it, in the log's order."""
    return [(view, detail_of(report.result, view.key)) for view in report.devices]


def detail_of(result: AnalysisResult, key: str) -> DeviceDetail:
    """The analysis' detail of device ``key`` (its peaks, phases, headroom, batches)."""
    detail = result.device(key).detail
    if detail is None:
        raise ValueError(f"the analysis has no detail of device {key}")
    return detail


def seconds_shown(at: PeakAt | BatchPeak) -> float | None:
    """When a peak (or a batch) was, in seconds since the log began, as ``--json`` writes it (to the ms)."""
    return None if at.since_start_s is None else round(at.since_start_s, 3)
