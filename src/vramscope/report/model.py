"""What a report says about one log, as data: the summary (JSON-ready) and the series to draw.

:func:`build_report` reads nothing and renders nothing: it takes a :class:`~vramscope.logfile.LogTable`,
runs :func:`vramscope.analysis.summary.analyze` on it (leak verdict, OOM forecast, peaks), adds what a
reader of the log asks next (peaks per GPU and per phase with their step and time, headroom to the
GPU's capacity, allocated against reserved memory and its trend, the longest batches), and thins the
series to draw with min/max buckets. The terminal, HTML and PNG renderers only format this.

Cost matters: a day at 10 Hz is a million rows, so per-row work is done with builtins over whole
columns (``max``, slicing, ``list.index``, ``itertools.groupby``) rather than Python loops.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from operator import eq, is_not, itemgetter
from typing import Any

from vramscope.analysis.summary import analyze
from vramscope.logfile import LogTable
from vramscope.report.advice import RunSettings, advise, planner_advice
from vramscope.report.downsample import DEFAULT_BUCKETS, minmax_indices

# Memory columns a report looks at, with the names people read.
METRICS: dict[str, str] = {
    "device_used_bytes": "device used",
    "reserved_bytes": "reserved",
    "allocated_bytes": "allocated",
    "peak_allocated_bytes": "peak allocated",
    "process_bytes": "process",
    "host_rss_bytes": "host RSS",
}
TIMELINE_METRICS = ("device_used_bytes", "reserved_bytes", "allocated_bytes", "process_bytes")
# Drawn in this order: the per-step peak last, on top, because it is what runs out.
STEP_METRICS = ("device_used_bytes", "reserved_bytes", "allocated_bytes", "peak_allocated_bytes")
TRAIN = "train"
LONGEST_BATCHES = 5
TREND_POINTS = 4000  # points used to place the leak trend line (an intercept is a median: cheap and robust)

Selector = slice | list[int]


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
    """A stretch of one phase (eval, say) along the x axis."""

    start: float
    end: float
    phase: str


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
    note: str | None = None  # the OOM forecast or the leak verdict, printed on the chart

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


@dataclass
class LogReport:
    """One log's report: ``summary`` is what ``--json`` prints; ``devices`` is what is drawn."""

    path: str
    summary: dict[str, Any]
    devices: list[DeviceView]


class EmptyLogError(ValueError):
    """The log has a header but no rows to report on."""


def build_report(table: LogTable, buckets: int = DEFAULT_BUCKETS, settings: RunSettings | None = None) -> LogReport:
    """Analyse one log and prepare everything the renderers show.

    Args:
        table: a log from :func:`vramscope.logfile.read_log`.
        buckets: min/max buckets per drawn series (two points each).
        settings: what ran (model, batch); adds the planner's recommendations with predicted savings.

    Raises:
        EmptyLogError: the log has no rows, or no memory column with a value.
        vramscope.planner.PlanInputError: ``settings`` the planner cannot use (unknown model, say).
    """
    n = len(table)
    if n == 0:
        raise EmptyLogError(f"log {table.path} has no rows yet; was the run still starting?")
    if not any(table.has(m) for m in METRICS):
        raise EmptyLogError(f"log {table.path} has no memory readings in any row; is it a memory log?")
    analysis = analyze(table)
    cols = _Columns(table)
    devices: list[DeviceView] = []
    device_summaries: dict[str, dict[str, Any]] = {}
    for key, sel in _device_rows(cols.gpu).items():
        dev = _Device(key, sel, cols)
        device_summaries[key] = dev.summary(analysis)
        devices.append(dev.view(analysis, buckets))

    steps = [s for s in (analysis.get("steps") or {}).values()]
    summary: dict[str, Any] = {
        "log": {
            "path": table.path,
            "format": table.kind,
            "rows": n,
            "start": cols.first_time,
            "duration_s": _round(cols.duration_s(), 3),
            "devices": list(device_summaries),
            "steps": analysis.get("steps") if any(s is not None for s in steps) else None,
            "phases": sorted({p for p in cols.phase_set() if p}),
        },
        "devices": device_summaries,
        "leak": analysis["leak"],
        "peak": analysis["peak"],
        "forecast": analysis["forecast"],
        "warnings": analysis.get("warnings", []),
    }
    ranks = _rank_peaks(cols)
    if ranks is not None:
        summary["ranks"], summary["imbalance_metric"], summary["imbalance"] = ranks
    advice = advise(summary)
    if settings is not None:
        # What is urgent in the log (a leak, a batch that will not fit) stays first; then the planner's
        # changes, priced for this model and batch; then the rest of what the log shows.
        urgent = [a for a in advice if a["urgent"]]
        advice = urgent + planner_advice(summary, settings) + [a for a in advice if not a["urgent"]]
    summary["recommendations"] = advice
    return LogReport(table.path, _json_safe(summary), devices)


# -- columns -----------------------------------------------------------------------------------------


class _Columns:
    """Typed columns of the table, converted once (the analysis converts the same ones; both share the cache)."""

    def __init__(self, table: LogTable) -> None:
        self.table = table
        self.n = len(table)
        self.gpu = table.ints("gpu")
        self.step = table.ints("step")
        self.phase = table.strings("phase")
        self.time_raw = table.raw.get("time") or [""] * self.n
        self.elapsed = table.floats("elapsed_s")
        self.first_time = next((t for t in self.time_raw if t), None)
        self.origin = _parse_time(self.first_time or "")
        self._seconds: dict[int, float | None] = {}

    def ints(self, name: str) -> list[int | None]:
        return self.table.ints(name)

    def phase_set(self) -> set[str | None]:
        return set(self.phase)

    def seconds(self, i: int) -> float | None:
        """Seconds since the log's first row at row ``i``: from the wall clock, so rows of two writers agree."""
        if i not in self._seconds:
            stamp = _parse_time(self.time_raw[i])
            if stamp is not None and self.origin is not None:
                self._seconds[i] = stamp - self.origin
            else:
                self._seconds[i] = self.elapsed[i]
        return self._seconds[i]

    def duration_s(self) -> float | None:
        last = next((i for i in range(self.n - 1, -1, -1) if self.time_raw[i]), None)
        first = next((i for i in range(self.n) if self.time_raw[i]), None)
        if first is not None and last is not None:
            a, b = self.seconds(first), self.seconds(last)
            if a is not None and b is not None:
                return b - a
        known = [e for e in (self.elapsed[0], self.elapsed[-1]) if e is not None]
        return known[-1] - known[0] if len(known) == 2 else None


RANK_PEAKS = ("peak_allocated_bytes", "reserved_bytes", "device_used_bytes", "host_rss_bytes")
# Which peak the imbalance compares: the allocator's (what the model itself needs) when known.
IMBALANCE_ORDER = ("peak_allocated_bytes", "device_used_bytes", "host_rss_bytes")


def _rank_peaks(cols: _Columns) -> tuple[list[dict[str, Any]], str, float | None] | None:
    """Each rank's peaks and ``max/min - 1`` of one peak across ranks, for a log with several ranks
    (rank 0's log of a distributed run gathers every rank); None otherwise."""
    ranks = cols.ints("rank")
    distinct = sorted({r for r in ranks if r is not None})
    if len(distinct) < 2:
        return None
    rows: dict[int, list[int]] = {r: [] for r in distinct}
    for i, r in enumerate(ranks):
        if r is not None:
            rows[r].append(i)
    columns = {m: cols.ints(m) for m in RANK_PEAKS}
    gpus, steps = cols.gpu, cols.step
    entries: list[dict[str, Any]] = []
    for r in distinct:
        entry: dict[str, Any] = {"rank": r, "rows": len(rows[r]),
                                 "gpus": sorted({g for g in (gpus[i] for i in rows[r]) if g is not None})}
        for m in RANK_PEAKS:
            best = _argmax([columns[m][i] for i in rows[r]])
            name = m if m.startswith("peak_") else f"peak_{m}"
            entry[name] = None if best is None else best[1]
            if m == "peak_allocated_bytes":
                entry["peak_step"] = None if best is None else steps[rows[r][best[0]]]
        entries.append(entry)
    for m in IMBALANCE_ORDER:
        name = m if m.startswith("peak_") else f"peak_{m}"
        values = [e[name] for e in entries]
        if all(v is not None for v in values):
            low = min(values)
            return entries, name, (_round(max(values) / low - 1, 4) if low > 0 else None)
    return entries, "", None


def _parse_time(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _device_rows(gpus: list[int | None]) -> dict[str, Selector]:
    """Rows of each device: a slice when the rows interleave regularly (the usual case), else positions."""
    distinct = list(dict.fromkeys(gpus))
    keys = ["host" if g is None else str(g) for g in distinct]
    if len(distinct) == 1:
        return {keys[0]: slice(None)}
    k = len(distinct)
    if all(gpus[j::k].count(g) == len(gpus[j::k]) for j, g in enumerate(distinct)):
        return {key: slice(j, None, k) for j, key in enumerate(keys)}
    rows: dict[str, list[int]] = {key: [] for key in keys}
    lookup = dict(zip(distinct, keys, strict=False))
    for i, g in enumerate(gpus):
        rows[lookup[g]].append(i)
    return dict(rows)


def _pick(values: list[Any], sel: Selector) -> list[Any]:
    """The device's cells of a column. All rows: the column itself (callers only read it), not a copy."""
    if isinstance(sel, slice):
        return values if sel == slice(None) else values[sel]
    if not sel:
        return []
    if len(sel) == 1:
        return [values[sel[0]]]
    return list(itemgetter(*sel)(values))


def _row_of(sel: Selector, j: int) -> int:
    """The table row of the device's ``j``-th row."""
    if isinstance(sel, slice):
        return (sel.start or 0) + j * (sel.step or 1)
    return sel[j]


_known = partial(is_not, None)  # a C-level "is not None" for filter()


def _min_known(values: Sequence[int | None]) -> int:
    """The smallest known value of a list that has one."""
    try:
        low = min(values)  # type: ignore[type-var]
    except TypeError:
        low = None
    return low if low is not None else min(filter(_known, values))  # type: ignore[type-var,return-value]


def _argmax(values: Sequence[int | None]) -> tuple[int, int] | None:
    """(position, value) of the largest known value, first occurrence; None when nothing is known."""
    if not values:
        return None
    try:
        top = max(values)  # type: ignore[type-var]  # one C pass when the column has no gap (the usual case)
    except TypeError:  # a None among numbers: compare the known values only
        top = max(filter(_known, values), default=None)  # type: ignore[type-var]
    if top is None:
        top = max(filter(_known, values), default=None)  # type: ignore[type-var]  # [None] or [None, 5]
        if top is None:
            return None
    return values.index(top), top  # type: ignore[return-value]


# -- one device --------------------------------------------------------------------------------------


class _Device:
    def __init__(self, key: str, sel: Selector, cols: _Columns) -> None:
        self.key = key
        self.sel = sel
        self.cols = cols
        self.values: dict[str, list[int | None]] = {}
        for metric in METRICS:
            # An absent column stays an empty list: nothing to draw, nothing to pick through.
            self.values[metric] = _pick(cols.ints(metric), sel) if cols.table.has(metric) else []
        self.total = _pick(cols.ints("device_total_bytes"), sel)
        self.step = _pick(cols.step, sel)
        self.phase = _pick(cols.phase, sel)
        self.tokens = _pick(cols.ints("tokens"), sel) if cols.table.has("tokens") else []
        self.n = len(self.step)
        self.title = "host (no GPU in the log)" if key == "host" else f"GPU {key}"
        self.capacity = next((t for t in reversed(self.total) if t is not None), None)
        top = _argmax(self.step)
        self.step_range: tuple[int, int] | None = None if top is None else (_min_known(self.step), top[1])
        self._runs: list[tuple[str, int, int]] | None = None
        self._labels: list[str] | None = None
        self._argmaxes: dict[str, tuple[int, int] | None] = {}
        self._thinned: dict[tuple[str, int], list[int]] = {}

    # ---- summary ----
    def _where(self, j: int, value: int) -> dict[str, Any]:
        row = _row_of(self.sel, j)
        return {
            "bytes": value,
            "step": self.step[j],
            "phase": self.labels()[j],
            "time": self.cols.time_raw[row] or None,
            "elapsed_s": _round(self.cols.seconds(row), 3),
        }

    def labels(self) -> list[str]:
        """Each row's phase as people name it: the logged phase, else "train" on step rows, else "run"."""
        if self._labels is None:
            if not any(self.phase):
                default = TRAIN if self.step_range is not None else "run"
                self._labels = [default] * self.n
            elif None not in self.phase:
                self._labels = self.phase  # type: ignore[assignment]  # every row has its phase: no copy
            else:
                self._labels = [
                    p if p else (TRAIN if s is not None else "run") for p, s in zip(self.phase, self.step, strict=True)
                ]
        return self._labels

    def peaks(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for metric in self.values:
            found = self._argmax(metric)
            if found is not None:
                out[metric] = self._where(*found)
        return out

    def phase_peaks(self) -> dict[str, dict[str, Any]]:
        """Peaks within each phase. A phase's rows are picked with C-level ``compress`` (eval runs can be
        hundreds of short stretches; slicing each would cost a copy per stretch per measure)."""
        labels = self.labels()
        out: dict[str, dict[str, Any]] = {}
        for label in dict.fromkeys(labels):
            mask = list(map(eq, labels, itertools.repeat(label)))
            positions = list(itertools.compress(range(self.n), mask))
            entry: dict[str, Any] = {"rows": len(positions)}
            for metric, values in self.values.items():
                if not values:
                    continue
                # The phase of the run's peak has that peak as its own (an equal one earlier in the
                # phase would be earlier in the run): no pass over its rows (training: most of them).
                top = self._argmax(metric)
                if top is not None and labels[top[0]] == label:
                    entry[metric] = self._where(*top)
                    continue
                found = _argmax(values if len(positions) == self.n else list(itertools.compress(values, mask)))
                if found is not None:
                    entry[metric] = self._where(positions[found[0]], found[1])
            out[label] = entry
        return out

    def _argmax(self, metric: str) -> tuple[int, int] | None:
        """:func:`_argmax` of one metric's column, computed once (the peaks and the phases' peaks share it)."""
        if metric not in self._argmaxes:
            values = self.values[metric]
            self._argmaxes[metric] = _argmax(values) if values else None
        return self._argmaxes[metric]

    def _minmax(self, metric: str, values: list[int | None], buckets: int) -> list[int]:
        """:func:`minmax_indices` of a metric's column, computed once: on a log with a step on every row,
        the timeline and the step chart thin the same column."""
        if values is not self.values.get(metric):
            return minmax_indices(values, buckets)
        key = (metric, buckets)
        if key not in self._thinned:
            self._thinned[key] = minmax_indices(values, buckets)
        return self._thinned[key]

    def headroom(self, peaks: dict[str, Any]) -> dict[str, Any]:
        used = peaks.get("device_used_bytes", {}).get("bytes")
        if self.capacity is None or used is None:
            return {"capacity_bytes": self.capacity, "peak_used_bytes": used, "headroom_bytes": None,
                    "headroom_fraction": None}
        room = self.capacity - used
        return {"capacity_bytes": self.capacity, "peak_used_bytes": used, "headroom_bytes": room,
                "headroom_fraction": _round(room / self.capacity, 4) if self.capacity else None}

    def fragmentation(self) -> dict[str, Any] | None:
        """Reserved memory that no tensor used: the allocator's cache beyond demand, partly split and unusable.

        Measured against the per-step peak when the log has it: after a step, the activations' memory
        sits free in the cache on purpose (the next step reuses it), so only what even the peak did not
        use is overhead. Without per-step peaks, against what was allocated at the reading.
        """
        reserved = self.values["reserved_bytes"]
        demand_metric = "peak_allocated_bytes" if self.values["peak_allocated_bytes"] else "allocated_bytes"
        demand = self.values[demand_metric]
        if not reserved or not demand:
            return None
        if None in reserved or None in demand:
            both = [r is not None and a is not None for r, a in zip(reserved, demand, strict=True)]
            idx = list(itertools.compress(range(self.n), both))
            if not idx:
                return None
            res: list[int] = list(itertools.compress(reserved, both))  # type: ignore[arg-type]
            used: list[int] = list(itertools.compress(demand, both))  # type: ignore[arg-type]
        else:
            idx = list(range(self.n))
            res, used = reserved, demand  # type: ignore[assignment]
        top = max(res)
        at = res.index(top)
        top_demand = max(used)
        xs, x_unit = self._trend_axis(idx)
        slope = _gap_slope(xs, res, used) if xs is not None else None
        # A trend is only worth stating over a span long enough to hold one: a 26-second run says
        # nothing about the next hour. At least 200 steps, or 10 minutes of samples.
        if xs is not None and slope is not None and (max(xs) - min(xs)) < (200 if x_unit == "step" else 600):
            slope = None
        total_res = sum(res)
        out: dict[str, Any] = {
            "measured_against": demand_metric,
            "at_peak_reserved": {
                "reserved_bytes": top,
                "demand_bytes": top_demand,
                "unused_bytes": top - top_demand,
                "unused_fraction": _round((top - top_demand) / top, 4) if top else None,
                "step": self.step[idx[at]],
            },
            "demand_over_reserved": _round(sum(used) / total_res, 4) if total_res else None,
            "unused_trend_bytes_per": x_unit,
            "unused_trend": _round(slope, 1),
        }
        if self.cols.table.has("inactive_split_bytes"):
            split = _pick(self.cols.ints("inactive_split_bytes"), self.sel)
            found = _argmax(split)
            out["inactive_split_max_bytes"] = found[1] if found else None
            out["inactive_split_last_bytes"] = next((v for v in reversed(split) if v is not None), None)
        for column, key in (("num_alloc_retries", "alloc_retries"), ("num_ooms", "ooms")):
            out[key] = self._counter_max(column)
        out["verdict"] = _fragmentation_verdict(out)
        return out

    def _counter_max(self, column: str) -> int | None:
        """The largest value of one of torch's counters (cumulative); None when the log lacks it."""
        raw = self.cols.table.raw.get(column)
        if raw is None or not any(raw):
            return None
        if set(raw) <= {"", "0"}:  # the usual case, read without converting a million cells
            return 0
        found = _argmax(_pick(self.cols.ints(column), self.sel))
        return found[1] if found else None

    def _trend_axis(self, idx: list[int]) -> tuple[list[float] | None, str]:
        steps = self.step if len(idx) == self.n else [self.step[j] for j in idx]
        if None not in steps and len(set(steps[:: max(1, len(steps) // 64)])) > 1:
            return steps, "step"  # type: ignore[return-value]
        # Time-based log: elapsed seconds at bucket granularity are enough for a slope.
        xs = [self.cols.elapsed[_row_of(self.sel, j)] for j in idx]
        if None in xs:
            return None, "s"
        return xs, "s"  # type: ignore[return-value]

    def longest_batches(self) -> list[dict[str, Any]]:
        """The batches with the most tokens (one row per step), the highest peak first among equals."""
        if not self.tokens:
            return []
        known = set(self.tokens)
        known.discard(None)
        if not known:
            return []
        peak = self.values["peak_allocated_bytes"] or self.values["allocated_bytes"] or [None] * self.n
        # Rows of the longest lengths first, one length at a time (C-level), until enough distinct steps:
        # batches padded to max_length can make one length hold most of the run.
        rows: list[int] = []
        for length in sorted(known, reverse=True)[: LONGEST_BATCHES * 10]:  # type: ignore[type-var]
            rows.extend(itertools.compress(range(self.n), map(eq, self.tokens, itertools.repeat(length))))
            batches = {j if self.step[j] is None else -1 - self.step[j] for j in rows[: LONGEST_BATCHES * 64]}  # type: ignore[operator]
            if len(batches) >= LONGEST_BATCHES:
                break
        # Many rows can share the longest length (batches padded to max_length): rank them with C-level tuple
        # comparisons on a bounded heap instead of sorting them all. A step logged twice counts once.
        ranked = heapq.nlargest(
            LONGEST_BATCHES * 8,
            zip([self.tokens[j] for j in rows], [-1 if peak[j] is None else peak[j] for j in rows], rows, strict=True),
        )
        out: list[dict[str, Any]] = []
        seen_steps: set[int] = set()
        for tokens, _peak, j in ranked:
            step = self.step[j]
            if step is not None:
                if step in seen_steps:
                    continue
                seen_steps.add(step)
            row = _row_of(self.sel, j)
            out.append({"step": step, "tokens": tokens, "peak_allocated_bytes": peak[j],
                        "phase": self.labels()[j], "elapsed_s": _round(self.cols.seconds(row), 3)})
            if len(out) == LONGEST_BATCHES:
                break
        return out

    def summary(self, analysis: dict[str, Any]) -> dict[str, Any]:
        peaks = self.peaks()
        self._peaks = peaks
        self._batches = self.longest_batches()
        return {
            "title": self.title,
            "gpu": None if self.key == "host" else int(self.key),
            "rows": self.n,
            "peaks": peaks,
            "phases": self.phase_peaks(),
            **self.headroom(peaks),
            "fragmentation": self.fragmentation(),
            "longest_batches": self._batches,
        }

    # ---- what is drawn ----
    def view(self, analysis: dict[str, Any], buckets: int) -> DeviceView:
        return DeviceView(self.key, self.title, self._timeline(buckets), self._step_chart(analysis, buckets))

    def _timeline(self, buckets: int) -> Chart:
        chart = Chart(title=f"{self.title}: memory over time", x_label="time", capacity_bytes=self.capacity)
        for metric in TIMELINE_METRICS:
            values = self.values.get(metric) or []
            if not values:
                continue
            keep = self._minmax(metric, values, buckets)
            xs, ys = self._at(keep, values, self._x_time)
            chart.lines.append(Line(metric, METRICS[metric], xs, ys))
        # Host-only logs: the host RSS is the memory there is.
        if not chart.lines and self.values.get("host_rss_bytes"):
            values = self.values["host_rss_bytes"]
            xs, ys = self._at(minmax_indices(values, buckets), values, self._x_time)
            chart.lines.append(Line("host_rss_bytes", METRICS["host_rss_bytes"], xs, ys))
        chart.spans = self._spans(self._x_time)
        peak_line = next((line for line in chart.lines if line.ys), None)
        if peak_line is not None:
            found = self._argmax(peak_line.metric)
            if found is not None:
                x = self._x_time(found[0])
                if x is not None:
                    chart.marks.append(Mark(x, found[1], f"peak {peak_line.label}", "peak"))
        return chart

    def _step_chart(self, analysis: dict[str, Any], buckets: int) -> Chart | None:
        if self.step_range is None:
            return None
        rows = list(range(self.n)) if None not in self.step else [j for j, s in enumerate(self.step) if s is not None]
        chart = Chart(title=f"{self.title}: memory per training step", x_label="step", capacity_bytes=None)
        for metric in STEP_METRICS:
            values = self.values.get(metric) or []
            if not values:
                continue
            mine = [values[j] for j in rows] if len(rows) != self.n else values
            keep = self._minmax(metric, mine, buckets)
            chart.lines.append(Line(metric, METRICS[metric], [float(self.step[rows[k]]) for k in keep],  # type: ignore[arg-type]
                                    [float(mine[k]) for k in keep]))  # type: ignore[arg-type]
        if not chart.lines:
            return None
        chart.spans = self._spans(lambda j: float(self.step[j]) if self.step[j] is not None else None)
        for batch in self._batches:
            if batch["step"] is not None and batch["peak_allocated_bytes"] is not None:
                chart.marks.append(Mark(float(batch["step"]), float(batch["peak_allocated_bytes"]),
                                        f"{batch['tokens']} tokens", "batch"))
        self._add_trend(chart, analysis, rows)
        return chart

    def _add_trend(self, chart: Chart, analysis: dict[str, Any], rows: list[int]) -> None:
        leak = ((analysis.get("leak") or {}).get("devices") or {}).get(self.key) or {}
        forecast = ((analysis.get("forecast") or {}).get("devices") or {}).get(self.key) or {}
        chart.capacity_bytes = forecast.get("capacity_bytes") or self.capacity
        slope = leak.get("slope_bytes_per_step")
        start = leak.get("start_step")
        signal = leak.get("signal")
        notes = [str(leak["verdict"])] if leak.get("verdict") else []
        if leak.get("detected") and slope is not None and start is not None and signal in self.values:
            values = self.values[signal]
            picked = [j for j in rows[:: max(1, len(rows) // TREND_POINTS)]
                      if self.step[j] is not None and self.step[j] >= start and values[j] is not None]  # type: ignore[operator]
            if picked:
                intercept = _median([values[j] - slope * self.step[j] for j in picked])  # type: ignore[operator]
                x0, x1 = float(start), float(max(self.step[j] for j in picked))  # type: ignore[type-var]
                chart.lines.append(Line("trend", f"leak trend ({signal.replace('_bytes', '').replace('_', ' ')})",
                                        [x0, x1], [intercept + slope * x0, intercept + slope * x1], dashed=True))
        steps_to_oom = forecast.get("steps_to_oom")
        current = forecast.get("current_peak_bytes")
        capacity = forecast.get("capacity_bytes")
        last_step = self.step_range[1] if self.step_range is not None else None
        if steps_to_oom is not None and current is not None and capacity is not None and last_step is not None:
            when = f"~{steps_to_oom:,.0f} steps"
            if forecast.get("seconds_to_oom") is not None:
                when += f" ({duration(forecast['seconds_to_oom'])})"
            notes.append(f"OOM forecast: out of memory at step ~{last_step + steps_to_oom:,.0f}, in {when}")
            first_step = self.step_range[0] if self.step_range is not None else last_step
            span = max(1, last_step - first_step)
            if steps_to_oom <= 2 * span:  # a projection far beyond the run would squash the chart
                chart.lines.append(Line("forecast", "OOM forecast", [float(last_step), last_step + steps_to_oom],
                                        [float(current), float(capacity)], dashed=True))
        elif forecast.get("reason"):
            notes.append(f"OOM forecast: {forecast['reason']}")
        lb = forecast.get("longest_batch") or {}
        if lb.get("warning"):
            notes.append(str(lb["warning"]))
        chart.note = " · ".join(notes) if notes else None

    def _x_time(self, j: int) -> float | None:
        return self.cols.seconds(_row_of(self.sel, j))

    def _at(
        self, keep: list[int], values: list[int | None], x_of: Callable[[int], float | None]
    ) -> tuple[list[float], list[float]]:
        xs: list[float] = []
        ys: list[float] = []
        for j in keep:
            x = x_of(j)
            v = values[j]
            if x is not None and v is not None:
                xs.append(x)
                ys.append(float(v))
        return xs, ys

    def runs(self) -> list[tuple[str, int, int]]:
        """Stretches of consecutive rows of one phase: (label, first row, row after the last)."""
        if self._runs is None:
            self._runs = []
            start = 0
            for label, group in itertools.groupby(self.labels()):
                length = len(list(group))
                self._runs.append((label, start, start + length))
                start += length
        return self._runs

    def _spans(self, x_of: Callable[[int], float | None]) -> list[Span]:
        """Runs of rows of a phase other than training, along x (eval bands)."""
        if not any(self.phase):
            return []
        spans: list[Span] = []
        for label, start, end in self.runs():
            if label not in (TRAIN, "run"):
                a, b = x_of(start), x_of(end - 1)
                if a is not None and b is not None:
                    if spans and spans[-1].phase == label and a - spans[-1].end <= 0:
                        spans[-1].end = b
                    else:
                        spans.append(Span(a, b, label))
        return spans


# -- helpers -----------------------------------------------------------------------------------------


def _gap_slope(xs: Sequence[float], reserved: list[int], demand: list[int], buckets: int = 64) -> float | None:
    """Trend of reserved memory beyond the largest demand so far, per unit of x, in a few C passes.

    Per bucket of consecutive rows: its largest reserved value less the largest demand up to its end
    (the pool is sized by the largest demand seen); then a least-squares slope over the buckets' mean x.
    """
    n = len(xs)
    if n < 2:
        return None
    b = min(buckets, n)
    mx: list[float] = []
    my: list[float] = []
    demand_so_far = 0
    for k in range(b):
        lo, hi = k * n // b, (k + 1) * n // b
        if hi > lo:
            demand_so_far = max(demand_so_far, max(demand[lo:hi]))
            mx.append(sum(xs[lo:hi]) / (hi - lo))
            my.append(max(reserved[lo:hi]) - demand_so_far)
    ax, ay = sum(mx) / len(mx), sum(my) / len(my)
    sxx = sum((x - ax) ** 2 for x in mx)
    if sxx == 0:
        return None
    return sum((x - ax) * (y - ay) for x, y in zip(mx, my, strict=False)) / sxx


def _fragmentation_verdict(f: dict[str, Any]) -> str:
    at = f["at_peak_reserved"]
    unused, share = at["unused_bytes"], at["unused_fraction"] or 0.0
    demand = "the largest per-step peak" if f["measured_against"] == "peak_allocated_bytes" else "what was allocated"
    text = f"the allocator reserved {_gib(at['reserved_bytes'])}, {_gib(unused)} ({share:.0%}) more than {demand}"
    trend, unit = f.get("unused_trend"), f.get("unused_trend_bytes_per")
    if trend is not None:
        per = 1000 if unit == "step" else 3600
        change = trend * per
        label = "1000 steps" if unit == "step" else "hour"
        if abs(change) >= 64 * 1024**2:
            text += f"; the gap {'grows' if change > 0 else 'shrinks'} {_gib(abs(change))} per {label}"
        else:
            text += "; the gap is steady"
    if f.get("inactive_split_max_bytes"):
        text += f"; split blocks that no allocation can use reached {_gib(f['inactive_split_max_bytes'])}"
    if f.get("alloc_retries"):
        text += f"; the allocator had to free its cache and retry {f['alloc_retries']} times (close to OOM)"
    if f.get("ooms"):
        text += f"; torch counted {f['ooms']} out-of-memory errors"
    return text


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def duration(seconds: float) -> str:
    """A span of time for people: ``45 s``, ``18 min``, ``5.2 h``, ``3.1 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _json_safe(value: Any) -> Any:
    """Plain JSON: tuples become lists, NaN and infinities become null (json would write invalid NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
