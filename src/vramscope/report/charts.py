"""The charts of one device, renderer-neutral: the analysis' typed results and the log's columns turned
into lines (min/max buckets of each memory column), phase bands, marks and notes. Nothing here finds a
number of its own: devices, phases, peaks, the longest batches and the verdicts come from the analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from vramscope.analysis.columns import Clock, LogColumns
from vramscope.analysis.details import METRICS
from vramscope.analysis.devices import RUN, TRAIN
from vramscope.analysis.results import DeviceAnalysis
from vramscope.analysis.verdicts import duration
from vramscope.logs.cells import Column
from vramscope.report.captions import forecast_limit_note
from vramscope.report.downsample import minmax_positions
from vramscope.report.hover import Hover, hover_buckets

TIMELINE_METRICS = ("device_used_bytes", "reserved_bytes", "allocated_bytes", "process_bytes")
# Drawn in this order: the per-step peak last, on top, because it is what runs out.
STEP_METRICS = ("device_used_bytes", "reserved_bytes", "allocated_bytes", "peak_allocated_bytes")


@dataclass
class Line:
    """One series to draw: x (seconds since the log began, or steps) against bytes."""

    metric: str
    label: str
    xs: list[float]
    ys: list[float]
    dashed: bool = False


@dataclass
class Span:
    """A stretch of one phase (eval, say) along the x axis.

    A row is written when its phase's work is done, so a stretch runs from the row before it (the end
    of the previous phase) to its last row: ``start_s``/``end_s`` in seconds since the log began and
    ``first_step``/``last_step`` (the training step the phase came after) say when it really was.
    """

    start: float
    end: float
    phase: str
    rows: int = 0
    start_s: float | None = None
    end_s: float | None = None
    first_step: int | None = None
    last_step: int | None = None


@dataclass
class Mark:
    """A point worth pointing at: a peak, a long batch."""

    x: float
    y: float
    label: str
    kind: str  # "peak", "batch"


@dataclass
class Chart:
    """One chart's content, renderer-neutral."""

    title: str
    x_label: str  # "time" (seconds) or "step"
    lines: list[Line] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    capacity_bytes: int | None = None
    capacity_source: str | None = None  # "GPU total, NVML", "--gpu-memory": the same on every chart of a device
    note: str | None = None  # the OOM forecast or the leak verdict, printed on the chart
    hover: list[Hover] = field(default_factory=list)  # the values under the pointer, per stretch of x

    @property
    def empty(self) -> bool:
        return not any(line.xs for line in self.lines)


@dataclass
class DeviceView:
    """What is drawn for one GPU (or the host, for a log without GPUs)."""

    key: str
    title: str
    timeline: Chart
    steps: Chart | None
    idle: str | None = None  # why this run counts the GPU as idle (then nothing is drawn and nothing advised)


def device_view(dev: DeviceAnalysis, cols: LogColumns, clock: Clock, buckets: int, source: str | None) -> DeviceView:
    """The charts of one device of the analysis (``dev``), drawn from the log's columns."""
    drawer = _Drawer(dev, cols, clock, buckets)
    timeline = drawer.timeline()
    steps = drawer.step_chart()
    for chart in (timeline, steps):
        if chart is not None:
            chart.capacity_source = source
            chart.hover = hover_buckets(chart.lines, chart.spans)
    return DeviceView(dev.key, dev.detail.title, timeline, steps, idle=dev.detail.idle)


def row_positions(n: int, rows: slice | np.ndarray) -> np.ndarray:
    """``np.arange(n)[rows]``, without the arange of every row (a slice picks an interleave of them)."""
    if isinstance(rows, slice):
        return np.arange(*rows.indices(n), dtype=np.int64)
    positions: np.ndarray = np.arange(n)[rows]
    return positions


class _Drawer:
    """One device's columns (its rows of the log) and what the analysis found on them."""

    def __init__(self, dev: DeviceAnalysis, cols: LogColumns, clock: Clock, buckets: int) -> None:
        self.dev = dev
        self.detail = dev.detail
        self.cols = cols
        self.clock = clock
        self.buckets = buckets
        self.positions = row_positions(cols.n, self.detail.table_rows)
        self.every = len(self.positions) == cols.n
        self.step = self.column("step")

    def column(self, name: str) -> Column:
        whole = self.cols.column(name)
        if self.every:
            return whole
        sel = self.detail.table_rows
        return Column(whole.values[sel], whole.known[sel])

    def _seconds(self, js: np.ndarray) -> np.ndarray:
        return self.clock.seconds(self.positions[js])

    def _line(self, metric: str, rows: np.ndarray | None, x_of: Callable[[np.ndarray], np.ndarray]) -> Line:
        col = self.column(metric)
        values, known = (col.values, col.known) if rows is None else (col.values[rows], col.known[rows])
        keep = minmax_positions(values, known, self.buckets)
        js = keep if rows is None else rows[keep]
        xs = x_of(js)
        drawn = ~np.isnan(xs)
        return Line(metric, METRICS[metric], xs[drawn].tolist(), values[keep][drawn].astype(np.float64).tolist())

    def timeline(self) -> Chart:
        chart = Chart(title=f"{self.detail.title}: memory over time", x_label="time",
                      capacity_bytes=self.detail.capacity_bytes)
        for metric in TIMELINE_METRICS:
            if self.cols.filled(metric):
                chart.lines.append(self._line(metric, None, self._seconds))
        # Host-only logs: the host RSS is the memory there is.
        if not chart.lines and self.cols.filled("host_rss_bytes"):
            chart.lines.append(self._line("host_rss_bytes", None, self._seconds))
        chart.spans = self._spans(lambda j: self.clock.at(int(self.positions[j])))
        peak_line = next((line for line in chart.lines if line.ys), None)
        if peak_line is not None:
            found = self.detail.peaks.get(peak_line.metric)
            if found is not None and found.since_start_s is not None:
                chart.marks.append(Mark(found.since_start_s, float(found.bytes), f"peak {peak_line.label}", "peak"))
        return chart

    def step_chart(self) -> Chart | None:
        if self.detail.step_range is None:
            return None
        # Every row has a step, as a rule: the columns themselves, not a copy of them through every row's position.
        rows = None if self.step.known.all() else np.flatnonzero(self.step.known)
        chart = Chart(title=f"{self.detail.title}: memory per training step", x_label="step", capacity_bytes=None)
        for metric in STEP_METRICS:
            if self.cols.filled(metric):
                chart.lines.append(self._line(metric, rows, lambda js: self.step.values[js].astype(np.float64)))
        if not chart.lines:
            return None
        chart.spans = self._spans(lambda j: float(self.step.values[j]) if self.step.known[j] else None)
        for batch in self.detail.longest_batches:
            if batch.step is not None and batch.peak_allocated_bytes is not None:
                chart.marks.append(Mark(float(batch.step), float(batch.peak_allocated_bytes),
                                        f"{batch.tokens} tokens", "batch"))
        self._add_trend(chart)
        return chart

    def _add_trend(self, chart: Chart) -> None:
        leak, forecast = self.dev.leak, self.dev.forecast.oom
        chart.capacity_bytes = self.detail.capacity_bytes  # the forecast's own limit (torch's reach) is in the note
        notes = [leak.shown_verdict] if leak.shown_verdict else []
        trend = leak.trend
        if trend is not None:
            chart.lines.append(Line("trend", f"leak trend ({trend.signal.replace('_bytes', '').replace('_', ' ')})",
                                    [trend.x0, trend.x1], [trend.y0, trend.y1], dashed=True))
        steps_to_oom, current, capacity = forecast.steps_to_oom, forecast.current_peak_bytes, forecast.capacity_bytes
        step_range = self.detail.step_range
        if steps_to_oom is not None and current is not None and capacity is not None and step_range is not None:
            first_step, last_step = step_range
            when = f"~{steps_to_oom:,.0f} steps"
            if forecast.seconds_to_oom is not None:
                when += f" ({duration(forecast.seconds_to_oom)})"
            notes.append(f"OOM forecast: out of memory at step ~{last_step + steps_to_oom:,.0f}, in {when}")
            if steps_to_oom <= 2 * max(1, last_step - first_step):  # a projection far beyond would squash the chart
                chart.lines.append(Line("forecast", "OOM forecast", [float(last_step), last_step + steps_to_oom],
                                        [float(current), float(capacity)], dashed=True))
            limit = forecast_limit_note(capacity, self.detail.capacity_bytes)
            if limit:
                notes.append(limit)
        elif forecast.reason:
            notes.append(f"OOM forecast: {forecast.reason}")
        warning = self.dev.forecast.longest_batch.warning
        if warning:
            notes.append(warning)
        chart.note = " · ".join(notes) if notes else None

    def _spans(self, x_of: Callable[[int], float | None]) -> list[Span]:
        """Stretches of rows of a phase other than training, along x (eval bands), from the row before each
        stretch (when its work began) to its last row."""
        if not (self.cols.labels("phase").codes[self.detail.table_rows] >= 0).any():
            return []
        step = self.step

        def step_at(j: int) -> int | None:
            return int(step.values[j]) if step.known[j] else None

        def seconds_at(j: int) -> float | None:
            return self.clock.at(int(self.positions[j]))

        spans: list[Span] = []
        for stretch in self.detail.stretches:
            if stretch.phase in (TRAIN, RUN):
                continue
            start, end = stretch.start, stretch.end
            begin = start - 1 if start > 0 else start
            a, b = x_of(begin), x_of(end - 1)
            if a is None:
                a, begin = x_of(start), start
            if a is None or b is None:
                continue
            t0, t1 = seconds_at(begin), seconds_at(end - 1)
            if spans and spans[-1].phase == stretch.phase and a - spans[-1].end <= 0:
                last = spans[-1]
                last.end, last.end_s, last.rows = b, t1, last.rows + end - start
                last.last_step = step_at(end - 1)
            else:
                spans.append(Span(a, b, stretch.phase, rows=end - start, start_s=t0, end_s=t1,
                                  first_step=step_at(start), last_step=step_at(end - 1)))
        return spans
