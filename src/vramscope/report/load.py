"""One log file to one report: what ``vramscope report`` does per log, and what bench/report_speed.py times."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from vramscope.advice.log import RunSettings
from vramscope.analysis.columns import ANALYSED_COLUMNS
from vramscope.logs.imports import ImportedTable
from vramscope.logs.inputfile import read_json_file
from vramscope.logs.mapping import ColumnSpec
from vramscope.logs.reader import read_any_log
from vramscope.output.names import BREAKDOWN_SUFFIX, sibling
from vramscope.report.model import LogReport, build_report
from vramscope.report.plan_check import SavedPlan, check, strategy_beside
from vramscope.types import MemoryBreakdown

MAX_BREAKDOWN_BYTES = 1 << 20


def report_file(path: str | os.PathLike[str], settings: RunSettings | None = None,
                capacity_bytes: int | None = None, columns: Sequence[ColumnSpec] | None = None,
                plan: SavedPlan | None = None) -> LogReport:
    """Read the log at ``path`` and build its report.

    ``columns`` reads any CSV through that mapping (``--columns``); without it, any format
    :func:`vramscope.logs.reader.read_any_log` knows. A log read through a mapping, given or guessed,
    says which in ``read_as``.
    A memory breakdown beside the log (``<stem>.breakdown.json``) is the report's ``breakdown``.
    ``capacity_bytes`` (``--gpu-memory``) replaces the log's GPU total: see :func:`build_report`.
    The strategy the monitor recorded beside the log, and each rank against ``plan`` (``--plan``, from
    :func:`vramscope.report.plan_check.read_plan`) when one is given, are its ``parallelism``.

    Raises:
        LogFormatError: the file cannot be read as a log.
        EmptyLogError: the log holds no memory readings.
    """
    # The log is read into numpy columns: nothing for the garbage collector to walk, so no pause for it.
    # Only the columns the analysis reads: the others (the GPU's UUID, free memory, utilization) cost a
    # vramscope CSV's reading a fifth more time and memory, for nothing the report shows.
    table = read_any_log(path, columns, only=ANALYSED_COLUMNS)
    report = build_report(table, settings=settings, capacity_bytes=capacity_bytes)
    seen = strategy_beside(path)
    return dataclasses.replace(
        report, read_as=table.read_as if isinstance(table, ImportedTable) else None, breakdown=read_breakdown(path),
        parallelism=check(report.result, plan, seen) if seen is not None or plan is not None else None)


def read_breakdown(log_path: str | os.PathLike[str]) -> MemoryBreakdown | None:
    """The breakdown written beside ``log_path``; None when there is none or it cannot be read (the report
    goes on without it: it is an extra, not the log)."""
    try:
        # Bounded as every side file is: a FIFO or a device of that name is passed over, never read or waited on.
        data = read_json_file(sibling(log_path, suffix=BREAKDOWN_SUFFIX), "a breakdown file", MAX_BREAKDOWN_BYTES)
        return MemoryBreakdown.from_dict(data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError, RecursionError):
        return None
