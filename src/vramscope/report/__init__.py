"""Reports: a memory log turned into answers (terminal, JSON, HTML with inline SVG, PNG).

:func:`build_report` does the work once per log; :func:`render_html`, :func:`print_report` and
:func:`vramscope.report.png.render_png` only format it. Never imports a backend: a report reads logs.
matplotlib is imported only by the PNG renderer, when it runs.
"""

from __future__ import annotations

from vramscope.report.compare import compare
from vramscope.report.html import render_html
from vramscope.report.model import EmptyLogError, LogReport, build_report

__all__ = ["EmptyLogError", "LogReport", "build_report", "compare", "render_html"]
