"""What a report says about one log, typed: the analysis, the advice and the series to draw.

:func:`build_report` reads nothing and renders nothing: it takes a :class:`~vramscope.logs.table.LogTable`,
runs :func:`vramscope.analysis.summary.analyze` on it once (devices, phases, peaks, leak verdict, OOM
forecast, fragmentation, longest batches: typed results), and turns those results and the log's
columns into what the renderers draw (:mod:`vramscope.report.charts`). The terminal, HTML and PNG
renderers only format this; ``--json``'s dict is made from it at the edge (:mod:`vramscope.report.json_output`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramscope.advice.log import RunSettings, advise_run_result
from vramscope.advice.types import Advice
from vramscope.analysis.columns import Clock, LogColumns
from vramscope.analysis.details import LONGEST_BATCHES, METRICS
from vramscope.analysis.results import AnalysisResult
from vramscope.analysis.summary import analyze
from vramscope.logs.formats import OWN_CSV
from vramscope.logs.table import LogTable
from vramscope.report.captions import capacity_source
from vramscope.report.charts import Chart, DeviceView, Line, Mark, Span, device_view
from vramscope.report.downsample import DEFAULT_BUCKETS
from vramscope.report.plan_check import ParallelismCheck
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
CAPACITY_OPTION = "--gpu-memory"  # how the report's given capacity is named in its verdicts
CAPACITY_HINT = f"capacity unknown (no GPU total in the log): give it with {CAPACITY_OPTION}, e.g. " \
    f"{CAPACITY_OPTION} 24GiB"


@dataclass
class LogReport:
    """One log's report, typed: what the renderers draw and what ``--json`` writes
    (:func:`vramscope.report.json_output.summary_of`)."""

    path: str
    result: AnalysisResult  # the analysis of the log
    devices: list[DeviceView]  # what is drawn of each device, in the log's order
    log_format: str  # "vramscope", "nvidia-smi", "hand-written", ...: its format's name (LogFormat.kind)
    advice: list[Advice] = field(default_factory=list)  # urgent first, then the planner's priced changes, then the rest
    read_as: str | None = None  # the --columns mapping a log was read through, given or guessed
    breakdown: MemoryBreakdown | None = None  # what held memory, from the monitor's file beside the log
    parallelism: ParallelismCheck | None = None  # the strategy beside the log, and each rank against --plan



class EmptyLogError(ValueError):
    """The log has a header but no rows to report on."""


def build_report(table: LogTable, buckets: int = DEFAULT_BUCKETS, settings: RunSettings | None = None,
                 capacity_bytes: int | None = None) -> LogReport:
    """Analyse one log and prepare everything the renderers show.

    Args:
        table: a log from :func:`vramscope.logs.reader.read_log`.
        buckets: min/max buckets per drawn series (two points each).
        settings: what ran (model, batch); adds the planner's recommendations with predicted savings.
        capacity_bytes: the memory each GPU is held against (``--gpu-memory``), in place of the log's
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
    result = analyze(table, capacity_bytes=capacity_bytes, capacity_hint=CAPACITY_HINT, columns=cols,
                     capacity_option=CAPACITY_OPTION)
    clock = Clock(cols)
    # A table made in memory (not read from a file) holds vramscope's own columns.
    log_format = table.log_format if table.log_format is not None else OWN_CSV
    devices: list[DeviceView] = []
    for dev in result.devices:
        source = capacity_source(dev.detail.capacity_given, log_format, dev.detail.total_logged)
        devices.append(device_view(dev, cols, clock, buckets, source))
    idle = {d.key for d in result.devices if d.detail.idle}
    return LogReport(table.path, result, devices, log_format.kind, advise_run_result(result, settings, idle))
