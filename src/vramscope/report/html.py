"""The report as one self-contained HTML page: inline SVG charts and CSS, no script, no network.

Everything that comes from a log (paths, phase names, verdicts that quote them) is escaped with
:func:`html.escape`: a log is data from a process, and a process can write markup into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from html import escape

from vramscope import __version__
from vramscope.advice.types import Advice
from vramscope.analysis.details import METRICS
from vramscope.analysis.results import DeviceDetail, PeakAt
from vramscope.planner.run_types import PHASE_WORDS
from vramscope.report.charts import Chart
from vramscope.report.compare import change_tone, compare, format_change, format_value
from vramscope.report.figures import (
    devices_of,
    duration_shown,
    leak_kind,
    leak_verdict,
    oom_severity,
    seconds_shown,
)
from vramscope.report.model import LogReport
from vramscope.report.plan_check import ParallelismCheck
from vramscope.report.svg import chart_svg
from vramscope.types import MemoryBreakdown
from vramscope.units import gib

CSS = """
:root{--ink:#1d2430;--muted:#5b6472;--line:#e3e6ea;--bad:#c0392b;--good:#2e7d32;--warn:#b26a00}
*{box-sizing:border-box}
body{margin:0;padding:24px 28px 40px;color:var(--ink);background:#f6f7f9;
 font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:26px 0 10px}h3{font-size:15px;margin:18px 0 8px}
.sub{color:var(--muted);margin:0 0 14px;overflow-wrap:anywhere}
.logs{display:grid;gap:20px;grid-template-columns:repeat(var(--n),minmax(0,1fr))}
.log{background:#fff;border:1px solid var(--line);border-radius:8px;padding:16px 18px}
.log>h2{margin-top:0;overflow-wrap:anywhere}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px;margin:8px 0 14px}
.card{border:1px solid var(--line);border-radius:6px;padding:10px 12px;background:#fbfbfc}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:20px;font-weight:650;margin-top:2px}
.card .d{color:var(--muted);font-size:12px;margin-top:2px;overflow-wrap:anywhere}
.card.bad{border-color:#e9b3ad;background:#fdf3f2}.card.bad .v{color:var(--bad)}
.card.good .v{color:var(--good)}.card.warn{border-color:#f0d7a8;background:#fff9ef}.card.warn .v{color:var(--warn)}
figure{margin:10px 0 4px}figure svg{width:100%;height:auto;display:block;border:1px solid var(--line);border-radius:6px}
figcaption,.note{color:var(--muted);font-size:13px;margin:4px 2px 10px}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px;min-width:50%}
th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{color:var(--muted);font-weight:600}
caption{text-align:left;font-weight:650;padding:4px 8px;color:var(--ink)}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
span.good{color:var(--good)}span.bad{color:var(--bad)}
.scroll{overflow-x:auto}
ol.advice li{margin:0 0 8px}ol.advice .t{font-weight:600}.urgent{color:var(--bad);font-weight:600}
ul.warnings li{color:var(--warn)}
footer{color:var(--muted);font-size:12px;margin-top:26px}
"""


def render_html(reports: Sequence[LogReport]) -> str:
    """The whole page for one log or several side by side."""
    names = ", ".join(r.path for r in reports)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{escape(f'vramscope report: {names}')}</title>",
        f"<style>{CSS}</style></head><body>",
        "<header><h1>GPU memory report</h1>",
        f'<p class="sub">{escape(names)}</p></header>',
    ]
    if len(reports) > 1:
        parts.append(_comparison(reports))
    y_max = _shared_y_max(reports) if len(reports) > 1 else {}
    parts.append(f'<div class="logs" style="--n:{min(len(reports), 3)}">')
    for report in reports:
        parts.append(_log_section(report, y_max))
    parts.append("</div>")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<footer>vramscope {escape(__version__)} · generated {stamp} · "
                 "peaks are kept when thinning (each bucket's min and max are drawn)</footer>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _shared_y_max(reports: Sequence[LogReport]) -> dict[tuple[str, str], float]:
    """One y scale per device and chart kind across logs, so that side-by-side charts compare by eye."""
    tops: dict[tuple[str, str], float] = {}
    for report in reports:
        for dev in report.devices:
            for kind, chart in (("time", dev.timeline), ("step", dev.steps)):
                if chart is None:
                    continue
                top = max((max(line.ys) for line in chart.lines if line.ys and line.metric != "forecast"), default=0.0)
                capacity = chart.capacity_bytes or 0
                if capacity <= 2.2 * top or any(line.metric == "forecast" for line in chart.lines):
                    top = max(top, capacity)  # the capacity drawn on each chart, as a chart alone draws it
                key = (dev.key, kind)
                tops[key] = max(tops.get(key, 0.0), top * 1.06)
    return tops


def _comparison(reports: Sequence[LogReport]) -> str:
    rows = compare(reports)
    head = "".join(f"<th>{escape(r.path)}</th>" for r in reports)
    body = []
    for row in rows:
        cells = []
        for value, change in zip(row.values, row.changes, strict=True):
            text = escape(format_value(value, row.unit))
            if change:
                tone = change_tone(change, row.better)
                cls = f' class="{tone}"' if tone else ""
                text += f" <span{cls}>({escape(format_change(change))})</span>"
            cells.append(f'<td class="n">{text}</td>')
        body.append(f"<tr><th>{escape(row.figure)}</th>{''.join(cells)}</tr>")
    return (f'<section class="log"><h2>Side by side</h2><p class="note">Changes are against the first log, '
            f"{escape(reports[0].path)}.</p><table><tr><th></th>{head}</tr>{''.join(body)}</table></section>")


def _log_section(report: LogReport, y_max: dict[tuple[str, str], float]) -> str:
    result = report.result
    steps, seconds = result.steps, duration_shown(result)
    facts = [f"{result.rows:,} rows", f"format {report.log_format}"]
    if seconds is not None:
        facts.append(f"{format_value(seconds, 's')} long")
    if steps.count:
        facts.append(f"steps {steps.first} to {steps.last}")
    if result.start:
        facts.append(f"started {result.start}")
    out = [f'<section class="log"><h2>{escape(report.path)}</h2>', f'<p class="sub">{escape(" · ".join(facts))}</p>']
    out.append(_cards(report))
    for dev, detail in devices_of(report):
        if dev.idle:  # nothing of this run's to draw: say so in a line
            out.append(f'<h3>{escape(dev.title)} (idle)</h3><p class="note idle">{escape(dev.idle)}.</p>')
            continue
        out.append(f"<h3>{escape(dev.title)}</h3>")
        out.append(_figure(dev.timeline, y_max.get((dev.key, "time"))))
        if dev.steps is not None:
            out.append(_figure(dev.steps, y_max.get((dev.key, "step"))))
        out.append(_device_tables(detail))
    if report.breakdown is not None:
        out.append(_breakdown(report.breakdown))
    if report.parallelism is not None and report.parallelism.plan is not None:
        out.append(_against_plan(report.parallelism))
    out.append(_advice(report.advice))
    warnings = report.result.warnings
    if warnings:
        items = "".join(f"<li>{escape(w)}</li>" for w in warnings)
        out.append(f'<h3>Warnings</h3><ul class="warnings">{items}</ul>')
    out.append("</section>")
    return "".join(out)


def _figure(chart: Chart, y_max: float | None) -> str:
    if chart.empty:
        return f'<p class="note">{escape(chart.title)}: nothing to draw.</p>'
    caption = f"<figcaption>{escape(chart.note)}</figcaption>" if chart.note else ""
    return f"<figure>{chart_svg(chart, y_max_bytes=y_max)}{caption}</figure>"


# The card's tone for each level the analysis judges a headroom at (analysis.verdicts.headroom_level).
HEADROOM_TONES = {"high": "bad", "medium": "warn", "low": "good"}


def _card(label: str, value: str, detail: str = "", tone: str = "", level: str = "") -> str:
    cls = f"card {tone}".strip()
    data = f' data-severity="{escape(level)}"' if level else ""
    return (f'<div class="{cls}"{data}><div class="k">{escape(label)}</div><div class="v">{escape(value)}</div>'
            f'<div class="d">{escape(detail)}</div></div>')


def _cards(report: LogReport) -> str:
    cards = []
    used = [(view.title, detail) for view, detail in devices_of(report) if not view.idle]
    peaks = [(title, *found) for title, detail in used if (found := _peak_of(detail)) is not None]
    if peaks:
        title, metric, at = max(peaks, key=lambda p: p[2].bytes)  # the first of equals
        detail = f"{METRICS[metric]} on {title}"
        if at.step is not None:
            detail += f", step {at.step}"
        if at.phase:
            detail += f" ({at.phase})"
        cards.append(_card("peak", gib(at.bytes), detail))
    rooms = [(title, d.headroom, left) for title, d in used if (left := d.headroom.headroom_bytes) is not None]
    if rooms:
        title, room, left = min(rooms, key=lambda r: r[2])
        fraction = room.headroom_fraction or 0.0
        tone = HEADROOM_TONES.get(room.level or "", "")
        if left < 0:  # a capacity given below what the log holds
            cards.append(_card("over the capacity", gib(-left), f"at the peak, over {gib(room.capacity_bytes)} "
                               f"on {title}", tone))
        else:
            cards.append(_card("headroom at the peak", gib(left),
                               f"{fraction:.0%} of {gib(room.capacity_bytes)} on {title}", tone))
    result = report.result
    kind = leak_kind(result.leak)
    detected = result.leak.detected
    value = "leak" if detected else ("caching" if kind in ("caching", "fragmentation") else "no leak")
    severity = oom_severity(result)
    level = severity.level if severity is not None else ""
    # A leak that runs out of memory only in days or years is amber: real, but no alarm.
    far = level in ("medium", "low")
    tone = ("warn" if far else "bad") if detected else "warn" if value == "caching" else "good"
    if kind == "insufficient":
        value, tone = "not enough data", ""
    cards.append(_card("leak", value, leak_verdict(result.leak), tone))
    outlook = result.forecast.outlook
    # The colour says how soon, not that an OOM was named: red within hours, amber within a day.
    tone = {"high": "bad", "medium": "warn"}.get(outlook.level or "", "")
    cards.append(_card("OOM forecast", outlook.headline, outlook.detail, tone, level=outlook.level or ""))
    return f'<div class="cards">{"".join(cards)}</div>'


# The peak a card shows: what the device held, else the best the log knows of it.
CARD_PEAK_ORDER = ("device_used_bytes", "peak_allocated_bytes", "reserved_bytes", "allocated_bytes",
                   "process_bytes", "host_rss_bytes")


def _peak_of(detail: DeviceDetail) -> tuple[str, PeakAt] | None:
    """The device's peak in the first memory measure of CARD_PEAK_ORDER the log has; None without one."""
    return next(((m, detail.peaks[m]) for m in CARD_PEAK_ORDER if m in detail.peaks), None)


def _device_tables(d: DeviceDetail) -> str:
    out = []
    phases = d.phases
    metrics = [m for m in METRICS if any(m in p.peaks for p in phases.values())]
    if phases and metrics:
        head = "".join(f"<th>{escape(METRICS[m])}</th>" for m in metrics)
        rows = []
        for name, entry in phases.items():
            cells = []
            for m in metrics:
                where = entry.peaks.get(m)
                if where is None:
                    cells.append('<td class="n">-</td>')
                    continue
                seconds = seconds_shown(where)
                at = f" @ step {where.step}" if where.step is not None else (
                    f" @ {format_value(seconds, 's')}" if seconds is not None else "")
                cells.append(f'<td class="n">{escape(gib(where.bytes) + at)}</td>')
            rows.append(f'<tr><th>{escape(name)}</th><td class="n">{entry.rows:,}</td>{"".join(cells)}</tr>')
        out.append(f"<table><caption>peaks by phase</caption><tr><th>phase</th><th>rows</th>{head}</tr>"
                   f"{''.join(rows)}</table>")
    if d.fragmentation is not None:
        out.append(f'<p class="note"><b>Allocator cache:</b> {escape(d.fragmentation.verdict)}.</p>')
    batches = d.longest_batches
    if batches:
        lines = "".join(
            f'<tr><td class="n">{escape(str(b.step))}</td><td class="n">{b.tokens:,}</td>'
            f'<td class="n">{escape(gib(b.peak_allocated_bytes, unknown="unknown"))}</td>'
            f"<td>{escape(b.phase)}</td></tr>"
            for b in batches
        )
        note = d.batches_note
        why = f'<p class="note">{escape(note)}.</p>' if note else ""
        out.append("<table><caption>longest batches</caption><tr><th>step</th><th>tokens</th><th>peak allocated</th>"
                   f"<th>phase</th></tr>{lines}</table>{why}")
    return f'<div class="scroll">{"".join(out)}</div>'


def _breakdown(b: MemoryBreakdown) -> str:
    rows = "".join(f"<tr><td>{escape(label)}</td><td class=\"num\">{gib(v, unknown='unknown')}</td></tr>"
                   for label, v in b.rows())
    return (f"<h3>What held memory on {escape(b.device)} at the run's peak</h3>"
            f"<table><tr><th>part</th><th>memory</th></tr>{rows}</table>")


def _against_plan(check: ParallelismCheck) -> str:
    """Each rank's (or GPU's) peaks beside the plan's, as the terminal's lines: the whole log against the plan's
    whole run, each with the phase that sets it, and the steps against the plan's step."""
    def cell(measured: int | None, phase: str | None) -> str:
        at = "" if phase is None or measured is None else f" at {phase}"
        return f'<td class="n">{escape(gib(measured, unknown="-") + at)}</td>'

    def error(value: float | None) -> str:
        return f'<td class="n">{"-" if value is None else f"{value * 100:+.1f}%"}</td>'

    def planned(value: int | None, phase: str | None) -> str:
        return cell(value, None if phase is None else PHASE_WORDS.get(phase, phase))

    rows = []
    for r in check.ranks:
        who = escape(f"{r.kind if r.kind == 'rank' else 'GPU'} {r.index}")
        rows.append(f"<tr><th>{who}</th><td>whole log</td>"
                    f"{cell(r.measured_peak_allocated_bytes, r.measured_peak_phase)}"
                    f"{planned(r.planned_peak_allocated_bytes, r.planned_peak_phase)}{error(r.allocated_error)}"
                    f"{cell(r.measured_device_bytes, r.measured_device_phase)}"
                    f"{planned(r.planned_process_bytes, r.planned_process_phase)}{error(r.device_error)}</tr>")
        if r.measured_step_peak_allocated_bytes is not None or r.measured_step_device_bytes is not None:
            rows.append(f"<tr><th>{who}</th><td>steps</td>"
                        f"{cell(r.measured_step_peak_allocated_bytes, None)}"
                        f"{planned(r.planned_step_peak_allocated_bytes, 'train')}{error(r.step_allocated_error)}"
                        f"{cell(r.measured_step_device_bytes, None)}"
                        f"{planned(r.planned_step_process_bytes, 'train')}{error(r.step_device_error)}</tr>")
    plan = check.plan
    strategy = "" if plan is None else f" ({plan.strategy})"
    note = f'<p class="note"><b>Note:</b> {escape(check.note)}.</p>' if check.note else ""
    return (f'<div class="scroll"><table><caption>Against the plan{escape(strategy)}</caption>'
            "<tr><th></th><th>rows</th><th>peak allocated</th><th>plan</th><th>error</th><th>device</th>"
            f"<th>plan</th><th>error</th></tr>{''.join(rows)}</table>{note}</div>")


def _advice(advice: Sequence[Advice]) -> str:
    if not advice:
        return '<h3>Recommendations</h3><p class="note">Nothing to change: no leak, no tight spot, no waste seen.</p>'
    lis = []
    for item in advice:
        saves = f" (up to {gib(item.saves_bytes)})" if item.saves_bytes else ""
        urgent = '<span class="urgent">urgent: </span>' if item.urgent else ""
        lis.append(f'<li>{urgent}<span class="t">{escape(item.title)}{escape(saves)}</span>. '
                   f"{escape(item.detail)}</li>")
    return f'<h3>Recommendations</h3><ol class="advice">{"".join(lis)}</ol>'
