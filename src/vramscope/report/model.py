"""What a report says about one log, as data: the summary (JSON-ready) and the series to draw.

:func:`build_report` reads nothing and renders nothing: it takes a :class:`~vramscope.logfile.LogTable`,
runs :func:`vramscope.analysis.summary.analyze` on it (leak verdict, OOM forecast, peaks), adds what a
reader of the log asks next (peaks per GPU and per phase with their step and time, headroom to the
GPU's capacity, allocated against reserved memory and its trend, the longest batches), and thins the
series to draw with min/max buckets. The terminal, HTML and PNG renderers only format this.

Cost matters: a day at 10 Hz is a million rows, so per-row work is done with builtins over whole
columns (``max``, slicing, ``list.index``, ``itertools.groupby``) rather than Python loops, and each
memory column is read once, a cache-sized stretch at a time (:mod:`vramscope.analysis.peaks`): the
chart's buckets, the phases' peaks and the run's peak all come out of that one read.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from operator import eq, ge, is_not, itemgetter
from typing import Any

from vramscope.analysis.peaks import ColumnFacts, Stretch, combine, has_known, regroup, top_and_gap
from vramscope.analysis.results import AnalysisResult
from vramscope.analysis.summary import analyze
from vramscope.logfile import LogTable
from vramscope.report.advice import RunSettings, advise, planner_advice
from vramscope.report.downsample import DEFAULT_BUCKETS, bucket_cuts, minmax_from_stretches, minmax_indices
from vramscope.report.hover import Hover, hover_buckets
from vramscope.report.verdicts import (
    batch_peak_note,
    capacity_source,
    duration,
    forecast_limit_note,
    idle_reason,
    oom_severity,
)
from vramscope.types import MemoryBreakdown

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
GAP_BUCKETS = 64  # buckets of the trend of reserved memory beyond demand
# A column is read a stretch of one phase at a time; a phase that changes more often than every
# MIN_RUN_ROWS rows (on average) makes that many stretches that one C pass per phase costs less.
MIN_RUN_ROWS = 16
# The longest batches are ranked on a bounded heap in Python; past this many rows of one length, the
# rows that cannot rank are dropped first with C passes, below a floor set by the maxima of chunks of
# RANK_CHUNK rows (see _largest).
RANK_CUT_ROWS = 4096
RANK_CHUNK = 64

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
    capacity_source: str | None = None  # "GPU total, NVML", "--capacity": the same on every chart of a device
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


@dataclass
class LogReport:
    """One log's report: ``summary`` is what ``--json`` prints; ``devices`` is what is drawn."""

    path: str
    summary: dict[str, Any]
    devices: list[DeviceView]
    breakdown: MemoryBreakdown | None = None  # what held memory, from the monitor's file beside the log
    result: AnalysisResult | None = None  # the analysis, typed: what the renderers read
    # ``result.to_json()``, for the renderers that still read dicts: it goes once they read ``result``.
    analysis: dict[str, Any] = field(default_factory=dict)


class EmptyLogError(ValueError):
    """The log has a header but no rows to report on."""


def build_report(table: LogTable, buckets: int = DEFAULT_BUCKETS, settings: RunSettings | None = None,
                 capacity_bytes: int | None = None) -> LogReport:
    """Analyse one log and prepare everything the renderers show.

    Args:
        table: a log from :func:`vramscope.logfile.read_log`.
        buckets: min/max buckets per drawn series (two points each).
        settings: what ran (model, batch); adds the planner's recommendations with predicted savings.
        capacity_bytes: the memory each GPU is held against (``--capacity``), in place of the log's
            GPU total: the headroom, the OOM forecast and the charts' capacity line use it.

    Raises:
        EmptyLogError: the log has no rows, or no memory column with a value.
        vramscope.planner.PlanInputError: ``settings`` the planner cannot use (unknown model, say).
    """
    n = len(table)
    if n == 0:
        raise EmptyLogError(f"log {table.path} has no rows yet; was the run still starting?")
    if not any(table.has(m) for m in METRICS):
        raise EmptyLogError(f"log {table.path} has no memory readings in any row; is it a memory log?")
    cols = _Columns(table)
    facts = ColumnFacts()
    per_device = [_Device(key, sel, cols, buckets, facts, capacity_bytes)
                  for key, sel in _device_rows(cols.gpu).items()]
    for dev in per_device:
        dev.read()  # before the analysis, which then finds what it asks of these columns known
    result = analyze(table, facts=facts, capacity_bytes=capacity_bytes)
    analysis = result.to_json()
    _name_the_capacity_flag(analysis)
    devices: list[DeviceView] = []
    device_summaries: dict[str, dict[str, Any]] = {}
    for dev in per_device:
        device_summaries[dev.key] = dev.summary(analysis)
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
        "oom_severity": oom_severity(analysis["forecast"], _steps_logged(analysis)),
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
    return LogReport(table.path, _json_safe(summary), devices, result=result, analysis=analysis)


def _name_the_capacity_flag(analysis: dict[str, Any]) -> None:
    """The analysis says the capacity is unknown; the report can be told it: name the option."""
    forecast = analysis.get("forecast") or {}
    for fc in [forecast, *(forecast.get("devices") or {}).values()]:
        if str(fc.get("reason") or "").startswith("capacity unknown"):
            fc["reason"] = "capacity unknown (no GPU total in the log): give it with --capacity, e.g. --capacity 24GiB"


def _steps_logged(analysis: dict[str, Any]) -> int | None:
    steps = analysis.get("steps") or {}
    first, last = steps.get("first"), steps.get("last")
    return None if first is None or last is None else max(1, last - first + 1)


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

    def filled(self, name: str) -> bool:
        """``table.has(name)``: some cell of the column is not empty. A known value proves it, found at once
        as a rule (the first or the last row), without a look through the table's cells."""
        return has_known(self.ints(name)) or self.table.has(name)

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
    if not cols.table.has("rank"):  # a log of one process: no rank column to convert
        return None
    ranks = cols.ints("rank")
    distinct = sorted({r for r in set(ranks) if r is not None})  # set() first: a few ranks, not a million rows
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
    if gpus.count(gpus[0]) == len(gpus):  # one device, as a rule: no dict built over a million rows
        return {"host" if gpus[0] is None else str(gpus[0]): slice(None)}
    distinct = list(dict.fromkeys(gpus))
    keys = ["host" if g is None else str(g) for g in distinct]
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
    def __init__(self, key: str, sel: Selector, cols: _Columns, buckets: int, facts: ColumnFacts,
                 capacity_bytes: int | None = None) -> None:
        self.key = key
        self.sel = sel
        self.cols = cols
        self.buckets = buckets
        self.facts = facts
        self.values: dict[str, list[int | None]] = {}
        for metric in METRICS:
            # An absent column stays an empty list: nothing to draw, nothing to pick through.
            self.values[metric] = _pick(cols.ints(metric), sel) if cols.filled(metric) else []
        self.total = _pick(cols.ints("device_total_bytes"), sel)
        self.step = _pick(cols.step, sel)
        self.phase = _pick(cols.phase, sel)
        self.tokens = _pick(cols.ints("tokens"), sel) if cols.filled("tokens") else []
        self.n = len(self.step)
        self.title = "host (no GPU in the log)" if key == "host" else f"GPU {key}"
        logged_total = next((t for t in reversed(self.total) if t is not None), None)
        # One capacity per device, said with its source, on every chart and in the headroom.
        self.capacity = capacity_bytes if capacity_bytes is not None else logged_total
        self.capacity_source = capacity_source(capacity_bytes is not None, cols.table.kind, logged_total is not None)
        facts.rising(self.step)  # as a rule: then the first and the last step are the range, with no pass
        top = facts.top(self.step)
        self.step_gap = facts.gap(self.step)  # known from that same pass
        self.step_range: tuple[int, int] | None = None if top is None else (facts.low(self.step), top)
        self._runs: list[tuple[str, int, int]] | None = None
        self._labels: list[str] | None = None
        self._argmaxes: dict[str, tuple[int, int] | None] = {}
        self._thinned: dict[tuple[str, int], list[int]] = {}
        self._cuts: list[int] | None = None

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
            elif all(self.phase) or None not in self.phase:  # all(): a cheaper C pass that settles it as a rule
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
        """Peaks within each phase, each with its first row (the first of equals), from the columns' scans."""
        cuts = self._scan_cuts()
        if cuts is None:
            return self._phase_peaks_by_mask()
        labels = self.labels()
        rows: dict[str, int] = {}  # each phase's row count, in order of its first row
        for label, start, end in self.runs():
            rows[label] = rows.get(label, 0) + end - start
        by_phase: dict[str, dict[str, Any]] = {label: {"rows": count} for label, count in rows.items()}
        for metric in self.values:
            best: dict[str, Stretch] = {}
            for lo, found in zip(cuts, self._scan(metric) or [], strict=False):  # a stretch starts at each cut
                if found is not None:
                    label = labels[lo]  # a stretch never crosses a phase's edge
                    mine = best.get(label)
                    if mine is None or found[2] > mine[2]:  # strict: the first of equals
                        best[label] = found
            for label, found in best.items():
                by_phase[label][metric] = self._where(found[3], found[2])
        return by_phase

    def _phase_peaks_by_mask(self) -> dict[str, dict[str, Any]]:
        """:meth:`phase_peaks` of a phase that changes every few rows: a phase's rows are picked with C-level
        ``compress`` (slicing each of its many short stretches would cost a copy per stretch per measure)."""
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
            scan = self._scan(metric)
            if scan is not None:
                found = combine(scan)
                self._argmaxes[metric] = None if found is None else (found[3], found[2])
            else:
                self._argmaxes[metric] = _argmax(values) if values else None
        return self._argmaxes[metric]

    def _minmax(self, metric: str, values: list[int | None], buckets: int) -> list[int]:
        """:func:`minmax_indices` of a metric's column, computed once: on a log with a step on every row,
        the timeline and the step chart thin the same column."""
        if values is not self.values.get(metric):
            return minmax_indices(values, buckets)
        key = (metric, buckets)
        if key not in self._thinned:
            # A bucket count other than the scan's (or none at all: minmax_indices says why) is thinned apart.
            scan = self._scan(metric) if buckets == self.buckets and buckets >= 1 else None
            cuts = self._scan_cuts()
            if scan is None or cuts is None:
                self._thinned[key] = minmax_indices(values, buckets)
            else:
                self._thinned[key] = minmax_from_stretches(values, buckets, cuts, scan)
        return self._thinned[key]

    def _scan_cuts(self) -> list[int] | None:
        """Where a column is cut to be read (:meth:`_scan`): at every chart bucket, every bucket of the
        fragmentation trend and every stretch of a phase, so that a stretch lies within one of each.
        None when the phase changes so often that one pass per phase costs less."""
        if self._cuts is None:
            phase_runs = self.runs()
            if len(phase_runs) > self.n // MIN_RUN_ROWS + 1:
                return None
            cuts = {start for _, start, _ in phase_runs}
            if 1 <= self.buckets < self.n / 2:  # fewer rows: every known one is drawn
                cuts.update(bucket_cuts(self.n, self.buckets))
            cuts.update(bucket_cuts(self.n, min(GAP_BUCKETS, self.n)))
            self._cuts = sorted(cuts)
        return self._cuts

    def read(self) -> None:
        """Read each memory column once (:meth:`_scan`)."""
        for metric in self.values:
            self._scan(metric)

    def _scan(self, metric: str) -> list[Stretch | None] | None:
        """Each stretch's smallest and largest value of a metric's column (:meth:`_scan_cuts`), read once;
        None for a column the device lacks, or when the phase changes too often to read so."""
        values = self.values.get(metric)
        cuts = self._scan_cuts()
        if not values or cuts is None:
            return None
        return self.facts.read(values, cuts)

    def _has_gap(self, metric: str) -> bool:
        """True when some row of a metric's column is unknown (None); from its scan, when it was read."""
        return self.facts.gap(self.values[metric])

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
        idx: Sequence[int]
        if self._has_gap("reserved_bytes") or self._has_gap(demand_metric):
            both = [r is not None and a is not None for r, a in zip(reserved, demand, strict=True)]
            idx = list(itertools.compress(range(self.n), both))
            if not idx:
                return None
            res: list[int] = list(itertools.compress(reserved, both))  # type: ignore[arg-type]
            used: list[int] = list(itertools.compress(demand, both))  # type: ignore[arg-type]
            top = max(res)
            at = res.index(top)
            top_demand = max(used)
            b = min(GAP_BUCKETS, len(res))
            res_tops = [max(part) for part in _buckets(res, b)]
            used_tops = [max(part) for part in _buckets(used, b)]
        else:
            # Every row has both: the peaks and the buckets' largest values come from the columns' scans.
            idx = range(self.n)
            res, used = reserved, demand  # type: ignore[assignment]
            at, top = self._argmax("reserved_bytes")  # type: ignore[misc]
            top_demand = self._argmax(demand_metric)[1]  # type: ignore[index]
            res_tops = self._bucket_maxima("reserved_bytes", min(GAP_BUCKETS, self.n))
            used_tops = self._bucket_maxima(demand_metric, min(GAP_BUCKETS, self.n))
        xs, x_unit = self._trend_axis(idx)
        slope = _gap_slope(xs, res_tops, used_tops) if xs is not None else None
        # A trend is only worth stating over a span long enough to hold one: a 26-second run says
        # nothing about the next hour. At least 200 steps, or 10 minutes of samples.
        if xs is not None and slope is not None and self._span(xs) < (200 if x_unit == "step" else 600):
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
        if self.cols.filled("inactive_split_bytes"):
            split = _pick(self.cols.ints("inactive_split_bytes"), self.sel)
            out["inactive_split_max_bytes"] = top_and_gap(split)[0]
            out["inactive_split_last_bytes"] = next((v for v in reversed(split) if v is not None), None)
        for column, key in (("num_alloc_retries", "alloc_retries"), ("num_ooms", "ooms")):
            out[key] = self._counter_max(column)
        out["verdict"] = _fragmentation_verdict(out)
        return out

    def _counter_max(self, column: str) -> int | None:
        """The largest value of one of torch's counters (cumulative); None when the log lacks it."""
        values = _pick(self.cols.ints(column), self.sel)
        # As a rule every count is 0 (torch never had to retry): the same object in every row, which a
        # count() tells at once, instead of a max() comparing each row.
        top: int | None = values[0] if values.count(values[0]) == len(values) else top_and_gap(values)[0]
        if top is not None:
            return top
        if not self.cols.table.has(column):
            return None
        # None of this device's rows has a count: 0 all the same when every count in the log is 0.
        raw = self.cols.table.raw[column]
        return 0 if raw.count("0") + raw.count("") == len(raw) else None

    def _trend_axis(self, idx: Sequence[int]) -> tuple[list[float] | None, str]:
        every = len(idx) == self.n  # every row of the device: its columns as they are, no copy
        steps = self.step if every else [self.step[j] for j in idx]
        complete = not self.step_gap if every else None not in steps
        if complete and len(set(steps[:: max(1, len(steps) // 64)])) > 1:
            return steps, "step"  # type: ignore[return-value]
        # Time-based log: elapsed seconds at bucket granularity are enough for a slope.
        xs = _pick(self.cols.elapsed, self.sel) if every else [self.cols.elapsed[_row_of(self.sel, j)] for j in idx]
        if None in xs:
            return None, "s"
        return xs, "s"  # type: ignore[return-value]

    def _span(self, xs: list[float]) -> float:
        """``max(xs) - min(xs)``; the device's steps' range is known already."""
        if xs is self.step and self.step_range is not None:
            return self.step_range[1] - self.step_range[0]
        return max(xs) - min(xs)

    def _bucket_maxima(self, metric: str, buckets: int) -> list[int]:
        """The largest value of each of ``buckets`` equal buckets of a gap-free metric column."""
        scan, cuts = self._scan(metric), self._scan_cuts()
        if scan is None or cuts is None:
            return [max(part) for part in _buckets(self.values[metric], buckets)]  # type: ignore[type-var]
        return [combine(part)[2] for part in regroup(scan, cuts, bucket_cuts(self.n, buckets))]  # type: ignore[index]

    def _peak_metric(self) -> str | None:
        """The column a batch's peak is read from: the per-step peak, else what was allocated."""
        return next((m for m in ("peak_allocated_bytes", "allocated_bytes") if self.values[m]), None)

    def longest_batches(self) -> list[dict[str, Any]]:
        """The batches with the most tokens (one row per step), the highest peak first among equals."""
        if not self.tokens or self.facts.top(self.tokens) is None:
            return []
        peak_metric = self._peak_metric()
        peak = self.values[peak_metric] if peak_metric else [None] * self.n
        ranked = self._rank_longest(peak_metric) if peak_metric else None
        if ranked is None:
            ranked = self._rank_by_length(peak_metric)
        out: list[dict[str, Any]] = []
        seen_steps: set[int] = set()
        for _peak, j in ranked:  # a step logged twice counts once
            tokens = self.tokens[j]
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

    # The batches are ranked by tokens, then peak (an unknown one last, as -1), then row (the latest first):
    # LONGEST_BATCHES * 8 (peak, row) pairs, the first first. Any longer batch outranks every shorter one.

    def _rank_longest(self, peak_metric: str) -> list[tuple[int, int]] | None:
        """The ranking when the longest length alone holds enough distinct steps (as a rule), from the few
        stretches of the peak column (its scan) that can hold the best peaks; None when it cannot tell."""
        scan, cuts = self._scan(peak_metric), self._scan_cuts()
        if scan is None or cuts is None:
            return None
        longest = self.facts.top(self.tokens)
        if self._distinct_batches(self._first_rows(longest, LONGEST_BATCHES * 64)) < LONGEST_BATCHES:
            return None  # the next lengths count too
        values, k = self.values[peak_metric], LONGEST_BATCHES * 8
        best: list[tuple[int, int]] = []  # a heap of the k best so far, the k-th on top
        # Stretches by their highest peak: one whose highest is below the k-th best holds no better row.
        for top, s in sorted(((found[2], s) for s, found in enumerate(scan) if found is not None), reverse=True):
            if len(best) == k and top < best[0][0]:
                break
            lo, hi = cuts[s], cuts[s + 1]
            for j in itertools.compress(range(lo, hi), map(eq, self.tokens[lo:hi], itertools.repeat(longest))):
                v = values[j]
                pair = (-1 if v is None else v, j)
                if len(best) < k:
                    heapq.heappush(best, pair)
                elif pair > best[0]:
                    heapq.heapreplace(best, pair)
        # Rows left unread rank below the k-th best, except the unknown peaks (-1) of stretches with no
        # known one: those count when the k-th best is no better.
        if len(best) < k or best[0][0] < 0:
            return None
        return sorted(best, reverse=True)

    def _distinct_batches(self, rows: list[int]) -> int:
        """How many distinct steps the rows hold (a row without a step counts as its own)."""
        return len({j if self.step[j] is None else -1 - self.step[j] for j in rows})  # type: ignore[operator]

    def _first_rows(self, length: int, count: int) -> list[int]:
        """The first ``count`` rows of batches of ``length`` tokens (fewer when there are fewer)."""
        rows: list[int] = []
        try:
            while len(rows) < count:
                rows.append(self.tokens.index(length, rows[-1] + 1 if rows else 0))
        except ValueError:  # no more of them
            pass
        return rows

    def _rank_by_length(self, peak_metric: str | None) -> list[tuple[int, int]]:
        """The ranking, one length's rows at a time, the longest first, until enough distinct steps: batches
        padded to max_length can make one length hold most of the run."""
        known = set(self.tokens)
        known.discard(None)
        peak = self.values[peak_metric] if peak_metric else [None] * self.n
        groups: list[list[int]] = []
        head: list[int] = []  # the first rows taken, as many as it takes to count distinct steps
        for length in sorted(known, reverse=True)[: LONGEST_BATCHES * 10]:  # type: ignore[type-var]
            groups.append(list(itertools.compress(range(self.n), map(eq, self.tokens, itertools.repeat(length)))))
            head += groups[-1][: LONGEST_BATCHES * 64 - len(head)]
            if self._distinct_batches(head) >= LONGEST_BATCHES:
                break
        ranked: list[tuple[int, int]] = []
        for rows in groups:
            need = LONGEST_BATCHES * 8 - len(ranked)
            if need <= 0:
                break
            peaks = _pick(peak, rows)
            if peak_metric is None or self._has_gap(peak_metric):
                peaks = [-1 if v is None else v for v in peaks]
            ranked += _largest(peaks, rows, need)
        return ranked

    def summary(self, analysis: dict[str, Any]) -> dict[str, Any]:
        peaks = self.peaks()
        self._peaks = peaks
        self._batches = self.longest_batches()
        self._idle = idle_reason(self.key, peaks, self.step_range is not None)
        forecast = ((analysis.get("forecast") or {}).get("devices") or {}).get(self.key) or {}
        return {
            "title": self.title,
            "gpu": None if self.key == "host" else int(self.key),
            "rows": self.n,
            "idle": self._idle,
            "peaks": peaks,
            "phases": self.phase_peaks(),
            **self.headroom(peaks),
            "capacity_source": self.capacity_source,
            "oom_severity": oom_severity(forecast, _steps_logged(analysis)),
            "fragmentation": self.fragmentation(),
            "longest_batches": self._batches,
            "longest_batches_note": batch_peak_note(self._peak_metric(), self._batches),
        }

    # ---- what is drawn ----
    def view(self, analysis: dict[str, Any], buckets: int) -> DeviceView:
        charts = [self._timeline(buckets), self._step_chart(analysis, buckets)]
        for chart in charts:
            if chart is not None:
                chart.capacity_source = self.capacity_source
                chart.hover = hover_buckets(chart.lines, chart.spans)
        return DeviceView(self.key, self.title, charts[0], charts[1], idle=self._idle)  # type: ignore[arg-type]

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
            xs, ys = self._at(self._minmax("host_rss_bytes", values, buckets), values, self._x_time)
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
        rows: Sequence[int] = (range(self.n) if not self.step_gap
                               else [j for j, s in enumerate(self.step) if s is not None])
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

    def _add_trend(self, chart: Chart, analysis: dict[str, Any], rows: Sequence[int]) -> None:
        leak = ((analysis.get("leak") or {}).get("devices") or {}).get(self.key) or {}
        forecast = ((analysis.get("forecast") or {}).get("devices") or {}).get(self.key) or {}
        chart.capacity_bytes = self.capacity  # the forecast's own limit (torch's reach) is said in the note
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
            limit = forecast_limit_note(capacity, self.capacity)
            if limit:
                notes.append(limit)
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
            self._runs = self.facts.runs(self.labels()) or []
        return self._runs

    def _spans(self, x_of: Callable[[int], float | None]) -> list[Span]:
        """Runs of rows of a phase other than training, along x (eval bands), from the row before each run
        (when its work began) to its last row."""
        if not any(self.phase):
            return []
        spans: list[Span] = []
        for label, start, end in self.runs():
            if label not in (TRAIN, "run"):
                begin = start - 1 if start > 0 else start
                a, b = x_of(begin), x_of(end - 1)
                if a is None:
                    a, begin = x_of(start), start
                if a is not None and b is not None:
                    t0, t1 = self._x_time(begin), self._x_time(end - 1)
                    if spans and spans[-1].phase == label and a - spans[-1].end <= 0:
                        last = spans[-1]
                        last.end, last.end_s, last.rows = b, t1, last.rows + end - start
                        last.last_step = self.step[end - 1]
                    else:
                        spans.append(Span(a, b, label, rows=end - start, start_s=t0, end_s=t1,
                                          first_step=self.step[start], last_step=self.step[end - 1]))
        return spans


# -- helpers -----------------------------------------------------------------------------------------


def _largest(values: list[int], rows: list[int], k: int) -> list[tuple[int, int]]:
    """``heapq.nlargest(k, zip(values, rows))``, the largest first.

    heapq's loop runs in Python, a step per row: past RANK_CUT_ROWS rows, those that cannot rank are
    dropped first with C passes. The k chunks with the largest maxima hold k values at least as large
    as the k-th largest maximum, so every value that ranks is at least that floor: only rows below it
    are dropped.
    """
    if len(values) > RANK_CUT_ROWS:
        maxima = [max(values[i : i + RANK_CHUNK]) for i in range(0, len(values), RANK_CHUNK)]
        if len(maxima) >= k:
            floor = heapq.nlargest(k, maxima)[-1]
            keep = list(map(ge, values, itertools.repeat(floor)))
            values, rows = list(itertools.compress(values, keep)), list(itertools.compress(rows, keep))
    return heapq.nlargest(k, zip(values, rows, strict=True))


def _buckets(values: Sequence[Any], buckets: int) -> list[Sequence[Any]]:
    """``values`` cut into ``buckets`` equal buckets of consecutive rows (at most ``len(values)`` of them)."""
    return [values[lo:hi] for lo, hi in itertools.pairwise(bucket_cuts(len(values), buckets))]


def _gap_slope(xs: Sequence[float], reserved_tops: list[int], demand_tops: list[int]) -> float | None:
    """Trend of reserved memory beyond the largest demand so far, per unit of x, in a few C passes.

    Per bucket of consecutive rows (``min(GAP_BUCKETS, len(xs))`` of them, whose largest reserved and
    demand values are given): its largest reserved value less the largest demand up to its end (the
    pool is sized by the largest demand seen); then a least-squares slope over the buckets' mean x.
    """
    n = len(xs)
    if n < 2:
        return None
    mx: list[float] = []
    my: list[float] = []
    demand_so_far = 0
    for (lo, hi), reserved, demand in zip(itertools.pairwise(bucket_cuts(n, len(reserved_tops))), reserved_tops,
                                          demand_tops, strict=True):
        demand_so_far = max(demand_so_far, demand)
        mx.append(sum(xs[lo:hi]) / (hi - lo))
        my.append(reserved - demand_so_far)
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
