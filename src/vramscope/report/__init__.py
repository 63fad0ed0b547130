"""Reports: a memory log turned into answers (terminal, JSON, HTML with inline SVG, PNG).

:func:`build_report` analyses a log once (typed results from :mod:`vramscope.analysis`);
:func:`render_html`, :func:`vramscope.report.terminal.print_report` and
:func:`vramscope.report.png.render_png` only draw them (:mod:`vramscope.report.figures` reads each
figure one way for all of them). Never imports a backend: a report reads logs. matplotlib is imported
only by the PNG renderer, when it runs.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from vramscope.report.compare import compare
from vramscope.report.html import render_html
from vramscope.report.model import EmptyLogError, LogReport, build_report

__all__ = ["EmptyLogError", "LogReport", "build_report", "compare", "render_html", "report"]


def report(path: str | os.PathLike[str], **options: Any) -> LogReport:
    """The typed report of the log at ``path`` (``vramscope.report("mem.csv")``): its ``result`` is the analysis,
    and a notebook shows it as the report's page. ``options``: :func:`vramscope.report.load.report_file`'s."""
    from vramscope.report.load import report_file

    return report_file(path, **options)


def _notebook_html(self: LogReport) -> str:
    """How a notebook shows a report: the same page as ``report --html``, in a frame of its own (its styles and
    scripts stay inside it)."""
    from html import escape

    page = escape(render_html([self]), quote=True)
    return f'<iframe srcdoc="{page}" style="width:100%;height:900px;border:0" title="vramscope report"></iframe>'


# Set here, where the page's renderer is imported, so that the report's model never imports what draws it.
LogReport._repr_html_ = _notebook_html  # type: ignore[attr-defined]


class _CallableModule(types.ModuleType):
    """``vramscope.report`` is this package and also the function people call: ``vramscope.report(path)``."""

    def __call__(self, path: str | os.PathLike[str], **options: Any) -> LogReport:
        return report(path, **options)


sys.modules[__name__].__class__ = _CallableModule
