"""Reports: a memory log turned into answers (terminal, JSON, HTML with inline SVG, PNG).

:func:`build_report` analyses a log once (typed results from :mod:`vramscope.analysis`);
:func:`render_html`, :func:`vramscope.report.terminal.print_report` and
:func:`vramscope.report.png.render_png` only draw them (:mod:`vramscope.report.figures` reads each
figure one way for all of them). Never imports a backend: a report reads logs. matplotlib is imported
only by the PNG renderer, when it runs.
"""

from __future__ import annotations

from vramscope.report.compare import compare
from vramscope.report.html import render_html
from vramscope.report.model import EmptyLogError, LogReport, build_report

__all__ = ["EmptyLogError", "LogReport", "build_report", "compare", "render_html"]
