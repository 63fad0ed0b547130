"""One log file to one report: what ``vramscope report`` does per log, and what bench/report_speed.py times."""

from __future__ import annotations

import os

from vramscope.logfile import gc_paused, read_log
from vramscope.report.advice import RunSettings
from vramscope.report.model import LogReport, build_report


def report_file(path: str | os.PathLike[str], settings: RunSettings | None = None) -> LogReport:
    """Read the log at ``path`` and build its report (see :func:`vramscope.logfile.gc_paused` for why the GC pauses).

    Raises:
        LogFormatError: the file cannot be read as a log.
        EmptyLogError: the log holds no memory readings.
    """
    with gc_paused():
        return build_report(read_log(path), settings=settings)
