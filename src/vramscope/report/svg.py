"""Charts as inline SVG text: no script, no network, nothing to install.

One function, :func:`chart_svg`, draws a :class:`~vramscope.report.model.Chart`: lines of memory over
time or steps, phase bands, the GPU's capacity, marked peaks and long batches, a legend. Every piece
of text goes through :func:`html.escape`, because phase names and paths come from the log.
Values on hover come from SVG ``<title>`` elements, which browsers show without any script.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from vramscope.report.model import Chart, Line

GIB = 1024**3

COLORS: dict[str, str] = {
    "device_used_bytes": "#4e79a7",
    "reserved_bytes": "#f28e2b",
    "allocated_bytes": "#59a14f",
    "peak_allocated_bytes": "#e15759",
    "process_bytes": "#76b7b2",
    "host_rss_bytes": "#b07aa1",
    "trend": "#333333",
    "forecast": "#c0392b",
}
CAPACITY_COLOR = "#c0392b"
PHASE_COLORS = ("#f6d55c", "#a0cbe8", "#d4a6c8", "#b6e3a8")
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif"


def color_of(line: Line) -> str:
    return COLORS.get(line.metric, "#555555")


def phase_color(phase: str, phases: Sequence[str]) -> str:
    order = sorted(set(phases))
    return PHASE_COLORS[order.index(phase) % len(PHASE_COLORS)] if phase in order else PHASE_COLORS[0]


def nice_step(span: float, target: int) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``target`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target)
    power = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 5, 10):
        if raw <= mult * power:
            return float(mult * power)
    return float(10 * power)


def time_step(span_s: float, target: int) -> float:
    """A tick step in seconds that reads well on a clock (10 s, 15 min, 6 h, ...), about ``target`` ticks."""
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if span_s / step <= target:
            return float(step)
    return nice_step(span_s / 86400, target) * 86400


def format_seconds(s: float) -> str:
    """``0:00``, ``12:30``, ``3:05:00``, ``2d 04:00``: elapsed time on an axis."""
    total = round(s)
    sign = "-" if total < 0 else ""
    total = abs(total)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{sign}{days}d {hours:02d}:{minutes:02d}"
    if hours:
        return f"{sign}{hours}:{minutes:02d}:{seconds:02d}"
    return f"{sign}{minutes}:{seconds:02d}"


def format_gib(v: float, step: float) -> str:
    digits = 0 if step >= 1 else (1 if step >= 0.1 else 2)
    return f"{v:.{digits}f}"


def chart_svg(chart: Chart, width: int = 960, height: int = 300, y_max_bytes: float | None = None) -> str:
    """The chart as an ``<svg>`` element.

    Args:
        chart: what to draw.
        width: pixels.
        height: pixels.
        y_max_bytes: top of the y axis; give the same value to charts that should compare by eye
            (several logs side by side). Default: the chart's own maximum, and the capacity when it is
            close enough to be worth showing.
    """
    left, right, top, bottom = 62, 18, 46, 38
    pw, ph = width - left - right, height - top - bottom
    lines = [line for line in chart.lines if line.xs]
    xs_all = [x for line in lines for x in (line.xs[0], line.xs[-1])]
    xs_all += [x for s in chart.spans for x in (s.start, s.end)]
    data_max = max((max(line.ys) for line in lines if line.metric != "forecast"), default=0.0)
    capacity = chart.capacity_bytes
    forecast = any(ln.metric == "forecast" for ln in lines)
    # A capacity far above the data would flatten every line; it is then named, not drawn.
    show_capacity = capacity is not None and (capacity <= 2.2 * data_max or forecast)
    top_value = y_max_bytes if y_max_bytes else max(data_max, capacity if show_capacity and capacity else 0.0) * 1.06
    top_value = top_value or 1.0
    x_lo = min(xs_all, default=0.0)
    x_hi = max(xs_all, default=1.0)
    for line in lines:  # the forecast may run past the log
        x_hi = max(x_hi, max(line.xs))
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * pw

    def sy(y: float) -> float:
        return top + ph - min(y, top_value * 1.02) / top_value * ph

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(chart.title)}" style="{FONT};font-size:12px;background:#fff">',
        f'<text x="{left}" y="18" style="font-size:14px;font-weight:600" fill="#222">{escape(chart.title)}</text>',
    ]
    # Phase bands under everything else.
    phases = [s.phase for s in chart.spans]
    for span in chart.spans:
        x0, x1 = sx(span.start), sx(span.end)
        out.append(
            f'<rect class="band" x="{x0:.1f}" y="{top}" width="{max(1.0, x1 - x0):.1f}" height="{ph}" '
            f'fill="{phase_color(span.phase, phases)}" fill-opacity="0.35"><title>{escape(span.phase)}: '
            f"{escape(_x_text(chart, span.start))} to {escape(_x_text(chart, span.end))}</title></rect>"
        )
    # Grid and axes.
    y_step_gib = nice_step(top_value / GIB, 5)
    tick = 0.0
    while tick * GIB <= top_value * 1.0001:
        y = sy(tick * GIB)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">'
                   f"{format_gib(tick, y_step_gib)}</text>")
        tick += y_step_gib
    out.append(f'<text x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
               f'text-anchor="middle" fill="#555">GiB</text>')
    x_step = time_step(x_hi - x_lo, 8) if chart.x_label == "time" else max(1.0, nice_step(x_hi - x_lo, 8))
    tick = math.ceil(x_lo / x_step) * x_step
    while tick <= x_hi + 1e-9:
        x = sx(tick)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 17}" text-anchor="middle" fill="#555">'
                   f"{format_seconds(tick) if chart.x_label == 'time' else f'{tick:,.0f}'}</text>")
        tick += x_step
    axis_name = "elapsed time (h:mm:ss)" if chart.x_label == "time" else "training step"
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 4}" text-anchor="middle" fill="#555">{axis_name}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    # Capacity: the line the peak must stay under.
    if show_capacity and capacity is not None:
        y = sy(capacity)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{CAPACITY_COLOR}" '
                   f'stroke-width="1.5"/>')
        out.append(f'<text x="{left + pw - 4}" y="{y - 5:.1f}" text-anchor="end" fill="{CAPACITY_COLOR}">'
                   f"capacity {capacity / GIB:.1f} GiB</text>")
    elif capacity is not None:
        out.append(f'<text x="{left + pw - 4}" y="{top + 14}" text-anchor="end" fill="{CAPACITY_COLOR}">'
                   f"capacity {capacity / GIB:.1f} GiB (above the chart)</text>")
    # The series.
    for line in lines:
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(line.xs, line.ys, strict=False))
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        width_px = "2" if line.metric in ("trend", "forecast") else "1.4"
        out.append(f'<polyline class="series" data-metric="{escape(line.metric)}" fill="none" '
                   f'stroke="{color_of(line)}" stroke-width="{width_px}"{dash} stroke-linejoin="round" '
                   f'points="{points}"><title>{escape(line.label)}</title></polyline>')
    # Marks: the peak, the longest batches.
    for mark in chart.marks:
        x, y = sx(mark.x), sy(mark.y)
        tip = f"{mark.label}: {mark.y / GIB:.2f} GiB at {_x_text(chart, mark.x)}"
        if mark.kind == "peak":
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="#fff" stroke="#c0392b" stroke-width="2">'
                       f"<title>{escape(tip)}</title></circle>")
            anchor = "end" if x > left + pw * 0.8 else "start"
            dx = -8 if anchor == "end" else 8
            out.append(f'<text x="{x + dx:.1f}" y="{max(top + 12, y - 6):.1f}" text-anchor="{anchor}" fill="#c0392b" '
                       f'style="font-weight:600">{escape(f"{mark.label} {mark.y / GIB:.2f} GiB")}</text>')
        else:
            out.append(f'<path d="M{x:.1f},{y - 9:.1f} l-5,-8 h10 z" fill="#7b3294">'
                       f"<title>{escape(tip)}</title></path>")
    # Legend along the top.
    x = float(left)
    entries: list[tuple[str, str, bool | None]] = [(line.label, color_of(line), line.dashed) for line in lines]
    entries += [(p, phase_color(p, phases), None) for p in sorted(set(phases))]
    if any(m.kind == "batch" for m in chart.marks):
        entries.append(("longest batches", "#7b3294", None))
    for label, color, dashed in entries:
        if dashed is None:
            out.append(f'<rect x="{x:.0f}" y="27" width="12" height="10" fill="{color}" fill-opacity="0.7"/>')
        else:
            dash = ' stroke-dasharray="4 3"' if dashed else ""
            out.append(f'<line x1="{x:.0f}" x2="{x + 14:.0f}" y1="32" y2="32" stroke="{color}" '
                       f'stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{x + 18:.0f}" y="36" fill="#333">{escape(label)}</text>')
        x += 30 + 6.6 * len(label)
    out.append("</svg>")
    return "".join(out)


def _x_text(chart: Chart, x: float) -> str:
    return format_seconds(x) if chart.x_label == "time" else f"step {x:,.0f}"
