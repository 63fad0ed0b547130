"""Charts as inline SVG text: no script, no network, nothing to install.

One function, :func:`chart_svg`, draws a :class:`~vramscope.report.model.Chart`: lines of memory over
time or steps, phase bands, the GPU's capacity, marked peaks and long batches, a legend. Every piece
of text goes through :func:`html.escape`, because phase names and paths come from the log.
Values on hover come from SVG ``<title>`` elements, which browsers show without any script.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from vramscope.analysis.verdicts import duration
from vramscope.report.charts import Chart, Line, Span
from vramscope.report.hover import Hover
from vramscope.units import GIB, gib, human_precise

MIN_BAND_PX = 4.0  # an eval of one row is a band of no width: drawn this wide, centred on when it was
CHAR_PX = 6.7  # width of a character of the 12 px font, to keep labels from covering each other
Box = tuple[float, float, float, float]  # x0, y0, x1, y1 of a label on the page

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
    # A y scale shared across logs can stop below the capacity: then the line would lie on the legend.
    show_capacity = show_capacity and capacity is not None and capacity <= top_value
    x_lo = min(xs_all, default=0.0)
    x_hi = max(xs_all, default=1.0)
    for line in lines:  # the forecast may run past the log
        x_hi = max(x_hi, max(line.xs))
    if x_hi <= x_lo:  # one x: a unit wide, or one float step where x + 1.0 is x again (x near 2**53)
        x_hi = max(x_lo + 1.0, math.nextafter(x_lo, math.inf))

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
        if x1 - x0 < MIN_BAND_PX:  # widened about its middle, kept inside the plot
            middle = min(max((x0 + x1) / 2, left + MIN_BAND_PX / 2), left + pw - MIN_BAND_PX / 2)
            x0, x1 = middle - MIN_BAND_PX / 2, middle + MIN_BAND_PX / 2
        out.append(
            f'<rect class="band" x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{ph}" '
            f'fill="{phase_color(span.phase, phases)}" fill-opacity="0.35"><title>{escape(span_text(span))}'
            "</title></rect>"
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
        if tick + x_step == tick:  # a step below the float spacing at x (x near 2**53): one tick is all there is
            break
        tick += x_step
    axis_name = "elapsed time (h:mm:ss)" if chart.x_label == "time" else "training step"
    out.append(f'<text x="{left + pw / 2:.0f}" y="{height - 4}" text-anchor="middle" fill="#555">{axis_name}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#bbb"/>')
    # Capacity: the line the peak must stay under, named with where its number comes from.
    taken: list[Box] = []  # labels placed so far: none is drawn over another
    plot: Box = (left, top, left + pw, top + ph)
    if capacity is not None:
        name = f"capacity {gib(capacity, 1)}"
        if chart.capacity_source:
            name += f" ({chart.capacity_source})"
        if show_capacity:
            y = sy(capacity)
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{CAPACITY_COLOR}" '
                       f'stroke-width="1.5"/>')
            # At the left: memory grows to the right, and the forecast runs to the line there.
            spot = _place(name, [(left + 4, y - 5, "start"), (left + 4, y + 15, "start")], taken, plot)
            taken.append((left, y - 1.5, left + pw, y + 1.5))  # the line itself: no label across it
        else:  # named in the title's row, right-aligned: over the plot it would sit on the highest line
            name += ", above the chart"
            spot = (left + pw, 18.0, "end")
        out.append(_label(spot, name, CAPACITY_COLOR))
    # The series.
    for line in lines:
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(line.xs, line.ys, strict=False))
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        width_px = "2" if line.metric in ("trend", "forecast") else "1.4"
        out.append(f'<polyline class="series" data-metric="{escape(line.metric)}" fill="none" '
                   f'stroke="{color_of(line)}" stroke-width="{width_px}"{dash} stroke-linejoin="round" '
                   f'points="{points}"><title>{escape(line.label)}</title></polyline>')
    # Values on hover: a transparent column per stretch of x, over the lines and under the marks.
    out.extend(_hover_columns(chart, chart.hover, sx, top, ph, left, left + pw))
    # Marks: the peak, the longest batches.
    for mark in chart.marks:
        x, y = sx(mark.x), sy(mark.y)
        tip = f"{mark.label}: {gib(mark.y)} at {_x_text(chart, mark.x)}"
        if mark.kind == "peak":
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="#fff" stroke="#c0392b" stroke-width="2">'
                       f"<title>{escape(tip)}</title></circle>")
            taken.append((x - 6, y - 6, x + 6, y + 6))
            text = f"{mark.label} {gib(mark.y)}"
            # Beside the point, above it first; the first spot that covers no other label and stays in the plot.
            spots = [(x + dx, y + dy, anchor) for dy in (-8, 18, -24, 34, -40)
                     for dx, anchor in ((-9, "end"), (9, "start"))]
            if x < left + pw * 0.5:
                spots = [(sx_, sy_, a) for sx_, sy_, a in spots if a == "start"] + spots
            out.append(_label(_place(text, spots, taken, plot, bold=True), text, "#c0392b", bold=True))
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


def clock(s: float) -> str:
    """Elapsed time with tenths of a second under an hour: ``0:19.6``, ``12:30.0``, ``3:05:00``."""
    if abs(s) >= 3600:
        return format_seconds(s)
    minutes, seconds = divmod(abs(s), 60)
    if round(seconds, 1) >= 60:
        minutes, seconds = minutes + 1, 0.0
    return f"{'-' if s < 0 else ''}{minutes:.0f}:{seconds:04.1f}"


def span_text(span: Span) -> str:
    """A band's tooltip: when the phase ran, for how long, after which steps, how many rows."""
    parts = [span.phase]
    if span.start_s is not None and span.end_s is not None:
        parts.append(f"{clock(span.start_s)} to {clock(span.end_s)} ({_length(span.end_s - span.start_s)})")
    if span.first_step is not None:
        steps = (f"after step {span.first_step:,}" if span.last_step in (None, span.first_step)
                 else f"steps {span.first_step:,} to {span.last_step:,}")
        parts.append(steps)
    parts.append(f"{span.rows:,} row{'s' if span.rows != 1 else ''}")
    return ": ".join(parts[:1]) + ": " + ", ".join(parts[1:])


def _length(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else duration(seconds)


def _hover_columns(chart: Chart, hovers: Sequence[Hover], sx: Callable[[float], float], top: float, ph: float,
                   lo: float, hi: float) -> list[str]:
    out: list[str] = []
    for h in hovers:
        x0, x1 = max(lo, sx(h.x0)), min(hi, sx(h.x1))
        if x1 <= x0:
            continue
        if chart.x_label == "time":
            lines = [f"{clock(h.x0)} to {clock(h.x1)}"]
        else:
            a, b = math.ceil(h.x0), math.ceil(h.x1) - 1
            lines = [f"step {a:,}" if b <= a else f"steps {a:,} to {b:,}"]
        for label, low, high in h.values:
            value = _amount(high) if _amount(high) == _amount(low) else f"{_amount(low)} to {_amount(high)}"
            lines.append(f"{label}: {value}")
        lines += [span_text(chart.spans[k]) for k in h.spans]
        out.append(f'<rect class="hover" x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{ph}" fill="#000" '
                   f'fill-opacity="0"><title>{escape(chr(10).join(lines))}</title></rect>')
    return out


def _amount(n: float) -> str:
    """Bytes as the page's tables write them (GiB with two decimals), keeping small amounts readable."""
    return gib(n) if abs(n) >= GIB else human_precise(n)


def _place(text: str, spots: Sequence[tuple[float, float, str]], taken: list[Box], plot: Box,
           bold: bool = False) -> tuple[float, float, str]:
    """The first spot (x, baseline y, anchor) where ``text`` fits in the plot over no label placed so far
    (the first spot when none does); its box is added to ``taken``."""
    width = len(text) * CHAR_PX * (1.15 if bold else 1.0)
    chosen, box = spots[0], _box(spots[0], width)
    for spot in spots:
        candidate = _box(spot, width)
        inside = (candidate[0] >= plot[0] and candidate[2] <= plot[2] and candidate[1] >= plot[1]
                  and candidate[3] <= plot[3])
        if inside and not any(_overlap(candidate, other) for other in taken):
            chosen, box = spot, candidate
            break
    taken.append(box)
    return chosen


def _box(spot: tuple[float, float, str], width: float) -> Box:
    x, y, anchor = spot
    x0 = x - width if anchor == "end" else x
    return (x0, y - 11, x0 + width, y + 3)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label(spot: tuple[float, float, str], text: str, color: str, bold: bool = False) -> str:
    x, y, anchor = spot
    weight = ' style="font-weight:600"' if bold else ""
    return (f'<text class="label" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}"{weight}>'
            f"{escape(text)}</text>")
