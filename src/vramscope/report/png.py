"""The report's charts as one PNG (matplotlib), for issues and papers.

matplotlib is the ``plot`` extra: it is imported here, inside :func:`render_png`, and nowhere else,
so the rest of vramscope never pays its import time. The figure is drawn with the Agg canvas on a
``Figure`` object (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Sequence
from typing import Any

from vramscope.output.safetext import printable
from vramscope.report.charts import Chart
from vramscope.report.model import LogReport
from vramscope.report.svg import COLORS, PHASE_COLORS, format_seconds, time_step
from vramscope.units import GIB, gib

MIN_BAND_SHARE = 0.004  # of the x range: about 4 px of a 1000 px chart, as the HTML draws them


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def render_png(reports: Sequence[LogReport], dpi: int = 110) -> bytes:
    """Every log's charts, one row per chart, logs side by side in columns; returns the PNG's bytes.

    Raises:
        PlotUnavailableError: matplotlib is missing, with the command that installs it.
    """
    if not plot_available():
        raise PlotUnavailableError("--png needs matplotlib; install it with: pip install 'vramscope[plot]'")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator, MultipleLocator

    columns: list[list[Chart]] = []
    for report in reports:
        charts: list[Chart] = []
        for dev in report.devices:
            if dev.idle:  # the run did not use it: the HTML and terminal reports say so in a line
                continue
            charts.append(dev.timeline)
            if dev.steps is not None:
                charts.append(dev.steps)
        columns.append(charts)
    rows = max(len(c) for c in columns)
    if rows == 0:  # every device of every log idle: a picture that says so, as the page says it in a line
        return _nothing_drawn(reports, dpi, Figure, FigureCanvasAgg)
    fig = Figure(figsize=(9.5 * len(columns), 3.3 * rows + 0.6), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, len(columns), squeeze=False)
    ticks = {"fmt": FuncFormatter, "y": MaxNLocator, "every": MultipleLocator}
    for col, (report, charts) in enumerate(zip(reports, columns, strict=False)):
        for row in range(rows):
            ax: Any = axes[row][col]
            if row >= len(charts):
                ax.set_visible(False)
                continue
            _draw(ax, charts[row], ticks)
            if row == 0 and len(reports) > 1:
                ax.set_title(_plain(f"{report.path}\n{charts[row].title}"), fontsize=10, loc="left")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _nothing_drawn(reports: Sequence[LogReport], dpi: int, figure: Any, canvas: Any) -> bytes:
    fig = figure(figsize=(9.5, 1.2), dpi=dpi)
    canvas(fig)
    names = ", ".join(report.path for report in reports)
    fig.text(0.02, 0.5, _plain(f"{names}: nothing to draw; the run used no GPU of the log (each is idle)"),
             fontsize=10, va="center")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _draw(ax: Any, chart: Chart, ticks: dict[str, Any]) -> None:
    # Plotted in GiB (not bytes) so that matplotlib's tick locator picks round GiB values.
    ax.set_title(_plain(chart.title), fontsize=10, loc="left")
    phases = sorted({s.phase for s in chart.spans})
    labelled: set[str] = set()
    xs = [x for line in chart.lines for x in (line.xs[:1] + line.xs[-1:])]
    least = (max(xs) - min(xs)) * MIN_BAND_SHARE if xs else 0.0  # an eval of one row has no width of its own
    for span in chart.spans:
        color = PHASE_COLORS[phases.index(span.phase) % len(PHASE_COLORS)]
        label = _plain(span.phase) if span.phase not in labelled else None
        labelled.add(span.phase)
        middle, half = (span.start + span.end) / 2, max(span.end - span.start, least) / 2
        ax.axvspan(middle - half, middle + half, color=color, alpha=0.35, lw=0, label=label)
    data_max = 0.0
    for line in chart.lines:
        if not line.xs:
            continue
        ax.plot(line.xs, [y / GIB for y in line.ys], color=COLORS.get(line.metric, "#555555"),
                lw=1.8 if line.dashed else 1.1, ls="--" if line.dashed else "-", label=_plain(line.label))
        if line.metric != "forecast":
            data_max = max(data_max, max(line.ys))
    capacity = chart.capacity_bytes
    if capacity is not None and (capacity <= 2.2 * data_max or any(ln.metric == "forecast" for ln in chart.lines)):
        source = f" ({chart.capacity_source})" if chart.capacity_source else ""
        ax.axhline(capacity / GIB, color="#c0392b", lw=1.2, label=_plain(f"capacity {gib(capacity, 1)}{source}"))
    for mark in chart.marks:
        if mark.kind == "peak":
            ax.plot([mark.x], [mark.y / GIB], "o", mfc="white", mec="#c0392b", mew=1.8, ms=6)
            ax.annotate(_plain(f"{mark.label} {gib(mark.y)}"), (mark.x, mark.y / GIB),
                        textcoords="offset points", xytext=(6, 5), fontsize=8, color="#c0392b")
        else:
            ax.plot([mark.x], [mark.y / GIB], "v", color="#7b3294", ms=6)
    if any(m.kind == "batch" for m in chart.marks):
        ax.plot([], [], "v", color="#7b3294", label="longest batches")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(ticks["y"](nbins=6, steps=[1, 2, 2.5, 5, 10]))
    ax.set_ylabel("GiB")
    if chart.x_label == "time":
        xs = [x for line in chart.lines for x in line.xs[:1] + line.xs[-1:]]
        if xs:
            seconds = max(xs) - min(xs)
            if seconds <= 0:  # one x: matplotlib widens the axis around it (by a share of x), so tick that width
                low, high = ax.get_xlim()
                seconds = high - low
            ax.xaxis.set_major_locator(ticks["every"](time_step(seconds, 8)))
        ax.xaxis.set_major_formatter(ticks["fmt"](lambda v, _pos: format_seconds(v)))
        ax.set_xlabel("elapsed time (h:mm:ss)")
    else:
        ax.set_xlabel("training step")
    ax.grid(True, color="#e4e4e4", lw=0.6)
    ax.legend(loc="lower right", fontsize=7, ncols=3, framealpha=0.85)
    if chart.note:
        ax.text(0.01, 0.98, _plain(_wrap(chart.note, 120)), transform=ax.transAxes, fontsize=7, va="top",
                color="#333", bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})


def _plain(text: str) -> str:
    # matplotlib reads $...$ as math; a phase name or a path from the log must print as written. A control
    # character has no glyph: matplotlib would warn on stderr with the raw character in it (an ESC reaches
    # the terminal), so it is drawn as its escape, as the terminal report shows it. The lines the report
    # breaks itself (a title under the path, a wrapped note) stay lines.
    return "\n".join(printable(line) for line in text.split("\n")).replace("$", r"\$")


def _wrap(text: str, width: int) -> str:
    words, lines, current = text.split(), [], ""
    for word in words:
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    if current:
        lines.append(current)
    return "\n".join(lines[:3])
