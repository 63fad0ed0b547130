"""One analysis of a memory log: peaks, leak verdict and OOM forecast, as a JSON-ready dict.

:func:`analyze` reads a :class:`~vramscope.logfile.LogTable` (what ``vramscope report`` loads);
:func:`analyze_columns` does the work on plain columns, so that a live
:class:`~vramscope.integrations.loop.MemoryMonitor` gets exactly the same answer from what it holds in
memory. Every number is bytes (int or float), steps or seconds; ``None`` means unknown.

Per device (``"0"``, ``"1"``, ... for GPUs; ``"host"`` for a log without GPUs) the analysis picks the
best signal the log has: the allocator's ``allocated_bytes`` (what stays after each step) and
``peak_allocated_bytes`` (the exact per-step peak) when the training process logged them; else the
process's or the device's memory from NVML; else the host RSS.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from operator import itemgetter
from typing import Any, overload

from vramscope.analysis.forecast import (
    RECENT_BATCHES,
    RECENT_STEP_TIMES,
    allocator_capacity,
    forecast_oom,
    longest_batch,
    seconds_per_step,
)
from vramscope.analysis.leak import DEFAULT_CONFIG, LeakConfig, LeakResult, detect_leak
from vramscope.analysis.peaks import ColumnFacts, has_known, stretch_maxima
from vramscope.analysis.results import (
    AnalysisResult,
    Caching,
    DeviceAnalysis,
    DeviceForecast,
    DeviceLeak,
    DevicePeak,
    ForecastSummary,
    LeakSummary,
    PeakAt,
    PeakSummary,
    StepRange,
    no_batch_fit,
)
from vramscope.logfile import LogTable
from vramscope.units import MIB

INT_COLUMNS = (
    "step",
    "gpu",
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "device_used_bytes",
    "device_total_bytes",
    "process_bytes",
    "host_rss_bytes",
    "tokens",
    "inactive_split_bytes",
    "rank",
)
FLOAT_COLUMNS = ("elapsed_s",)
TEXT_COLUMNS = ("time", "phase")
# Signals for the leak test, best first: what stays allocated after a step, then coarser views.
LEVEL_SIGNALS = ("allocated_bytes", "process_bytes", "device_used_bytes", "host_rss_bytes")
PEAK_SIGNALS = ("peak_allocated_bytes", "allocated_bytes", "process_bytes", "device_used_bytes", "host_rss_bytes")
TRAIN_PHASES = (None, "", "train")
# Signals that include an allocator's cache (glibc's heap in the RSS, torch's reserved memory in the
# device's and the process's figures) climb for a while after the start as the caches fill: a longer
# warm-up is skipped on them than on what the allocator has handed out.
CACHED_SIGNAL_WARMUP_POINTS = 50


def config_for(signal: str | None, config: LeakConfig = DEFAULT_CONFIG) -> LeakConfig:
    """The leak-test thresholds for a signal: ``config``, with a longer warm-up on cache-including ones."""
    if signal is None or signal == "allocated_bytes":
        return config
    return replace(config, min_warmup_points=max(config.min_warmup_points, CACHED_SIGNAL_WARMUP_POINTS))

Columns = Mapping[str, Sequence[Any]]


def analyze(
    table: LogTable,
    capacity_bytes: int | None = None,
    max_batch_tokens: int | None = None,
    config: LeakConfig = DEFAULT_CONFIG,
    facts: ColumnFacts | None = None,
) -> AnalysisResult:
    """Analyse a log read by :func:`vramscope.logfile.read_log`.

    Args:
        table: the log.
        capacity_bytes: memory limit for the forecast when the log has no GPU total (a host-only
            log), or to forecast against a smaller budget than the GPU.
        max_batch_tokens: the longest batch the run can see (batch size x maximum sequence length),
            for the longest-batch forecast; None uses the longest batch seen.
        config: leak-test thresholds.
        facts: what the caller has already worked out about the table's columns (a report reads them for
            its charts first), shared so that no column is read twice for the same answer.

    Returns:
        the typed result; its ``to_json()`` is ``{"leak": {...}, "peak": {...}, "forecast": {...},
        "warnings": [...], "devices": [...], ...}`` (docs/leak-detection.md lists every key).
    """
    return _analyze(_TableColumns(table), len(table), capacity_bytes, max_batch_tokens, config, facts or ColumnFacts())


def analyze_columns(
    columns: Columns,
    capacity_bytes: int | None = None,
    max_batch_tokens: int | None = None,
    config: LeakConfig = DEFAULT_CONFIG,
) -> AnalysisResult:
    """The analysis over typed columns (ints/floats/str, None = unknown), one entry per log row."""
    n = max((len(v) for v in columns.values()), default=0)
    return _analyze(columns, n, capacity_bytes, max_batch_tokens, config, ColumnFacts())


def _analyze(
    columns: Columns,
    n: int,
    capacity_bytes: int | None,
    max_batch_tokens: int | None,
    config: LeakConfig,
    facts: ColumnFacts,
) -> AnalysisResult:
    # A log of one device (as a rule) has the whole columns as its rows: the device's analysis and the
    # totals below read them through one memo, so no column is scanned twice for the same answer.
    whole = _Rows(columns, None, n, facts)
    # Steps and seconds rise from row to row as a rule: one pass that finds it out gives their range, and
    # spares the leak test the same pass.
    whole.rising("step")
    whole.rising("elapsed_s")
    devices = [_analyze_device(key, whole if rows is None else _Rows(columns, rows, n, facts), capacity_bytes,
                               max_batch_tokens, config)
               for key, rows in _device_groups(whole["gpu"]).items()]
    first_s, last_s = whole.low("elapsed_s"), whole.top("elapsed_s")
    peaks = {d.key: d.peak for d in devices}
    # The highest peak; the first device of equals.
    overall = max((p for p in peaks.values() if p.at is not None), key=lambda p: p.at.bytes if p.at else 0,
                  default=None)
    leak = _overall_leak([d.leak for d in devices])
    forecast = _overall_forecast([d.forecast for d in devices])
    return AnalysisResult(
        rows=n,
        steps=StepRange(_distinct_known(whole, "step"), whole.low("step"), whole.top("step")),
        duration_s=(last_s - first_s) if last_s is not None else None,
        leak=leak,
        peak=PeakSummary(peaks, overall),
        forecast=forecast,
        devices=tuple(devices),
        warnings=tuple(_warnings(devices)),
    )


# A day of rows is a million cells per column: the helpers below work on whole columns with builtins
# that loop in C (``count``, ``max``, ``compress``, ``map`` over ``operator`` functions) rather than
# with a Python loop per row.

_is_known = partial(operator.is_not, None)  # a C-level "is not None" for filter() and map()


def _col(columns: Columns, name: str, n: int) -> Sequence[Any]:
    values = columns.get(name)
    return values if values is not None and len(values) == n else [None] * n


def _known_values(values: Sequence[Any]) -> Sequence[Any]:
    """The known values, in order (the column itself when it has no gap)."""
    return values if None not in values else list(filter(_is_known, values))


def _tail(values: Sequence[Any], mask: Sequence[bool] | None, count: int) -> list[Any]:
    """The last ``count`` cells where ``mask`` is true (of all cells without a mask): ``_select(...)[-count:]``,
    reading only rows near the end (a stretch twice as long each time until it holds enough)."""
    if mask is None:
        return list(values[-count:])
    picked: list[Any] = []
    end, size = len(values), count
    while end > 0 and len(picked) < count:
        start = max(0, end - size)
        picked[:0] = itertools.compress(values[start:end], mask[start:end])
        end, size = start, size * 2
    return picked[-count:]


def _last_known(values: Sequence[Any]) -> int | None:
    """The position of the last known value (the last row, as a rule), or None."""
    return next((i for i in range(len(values) - 1, -1, -1) if values[i] is not None), None)


def _device_groups(gpus: Sequence[Any]) -> dict[str, list[int] | None]:
    """Each device's rows, in order of first appearance; None stands for all the rows (one device)."""
    if gpus and gpus.count(gpus[0]) == len(gpus):  # one device, as a rule: no dict built over a million rows
        return {"host" if gpus[0] is None else str(gpus[0]): None}
    distinct = list(dict.fromkeys(gpus))
    keys = ["host" if g is None else str(g) for g in distinct]
    if len(distinct) <= 1:
        return {keys[0]: None} if keys else {}
    # Grouping by equality in C is only the same as grouping by the key's text for ints and None
    # (0 and 0.0, or 1 and True, are equal but not spelled alike): anything else takes the row loop.
    if len(set(keys)) == len(keys) and set(map(type, gpus)) <= {int, type(None)}:
        return {key: list(itertools.compress(range(len(gpus)), map(operator.eq, gpus, itertools.repeat(g))))
                for key, g in zip(keys, distinct, strict=True)}
    groups: dict[str, list[int] | None] = {}
    for i, gpu in enumerate(gpus):
        groups.setdefault("host" if gpu is None else str(gpu), []).append(i)  # type: ignore[union-attr]
    return groups


class _TableColumns(Mapping[str, Sequence[Any]]):
    """A table's columns as the analysis reads them, each converted when first read: a log's reader
    converts a column of a day of rows at some cost, and the analysis never reads some (the rank)."""

    def __init__(self, table: LogTable) -> None:
        self.table = table

    def __getitem__(self, name: str) -> Sequence[Any]:
        if name in INT_COLUMNS:
            return self.table.ints(name)
        if name in FLOAT_COLUMNS:
            return self.table.floats(name)
        if name == "time" and "time" in self.table.raw:
            # The analysis reads the time of a few rows (the peaks'): those cells are read as they are asked for.
            return _TextCells(self.table.raw["time"])
        if name in TEXT_COLUMNS:
            return self.table.strings(name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter((*INT_COLUMNS, *FLOAT_COLUMNS, *TEXT_COLUMNS))

    def __len__(self) -> int:
        return len(INT_COLUMNS) + len(FLOAT_COLUMNS) + len(TEXT_COLUMNS)


class _TextCells(Sequence[str | None]):
    """A text column whose cells are read when asked for, an empty cell as None (as ``LogTable.strings``)."""

    def __init__(self, raw: Sequence[str]) -> None:
        self.raw = raw

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, i: int) -> str | None: ...

    @overload
    def __getitem__(self, i: slice) -> list[str | None]: ...

    def __getitem__(self, i: int | slice) -> str | list[str | None] | None:
        if isinstance(i, slice):
            return [v or None for v in self.raw[i]]
        return self.raw[i] or None


class _Rows:
    """One device's cells of the columns, picked once per column (all of them: the column itself).

    What several parts of the analysis ask of a column (its largest value, whether a cell is unknown, its
    cells on the training rows) is worked out once (``facts``): each answer is a pass over a million cells.
    """

    def __init__(self, columns: Columns, rows: list[int] | None, n: int, facts: ColumnFacts | None = None) -> None:
        self.columns = columns
        self.rows = rows
        self.n = n
        self.m = n if rows is None else len(rows)
        self.facts = facts or ColumnFacts()
        self._picked: dict[str, Sequence[Any]] = {}
        self._known: dict[str, list[bool]] = {}
        self._selected: dict[tuple[str, int], tuple[Sequence[bool], Sequence[Any]]] = {}

    def __getitem__(self, name: str) -> Sequence[Any]:
        if name not in self._picked:
            values = self.columns.get(name)
            if values is None or len(values) != self.n:
                self._picked[name] = [None] * self.m
            elif self.rows is None:
                self._picked[name] = values
            elif isinstance(values, _TextCells):
                self._picked[name] = _TextCells(_take(values.raw, self.rows))
            else:
                self._picked[name] = _take(values, self.rows)
        return self._picked[name]

    def row(self, i: int) -> int:
        """The table row of the device's ``i``-th row."""
        return i if self.rows is None else self.rows[i]

    def top(self, name: str) -> Any:
        """The column's largest known value; None when none is known."""
        return self.facts.top(self[name])

    def low(self, name: str) -> Any:
        """The column's smallest known value; None when none is known."""
        return self.facts.low(self[name])

    def has_gap(self, name: str) -> bool:
        """True when some cell of the column is unknown (None)."""
        return self.facts.gap(self[name])

    def rising(self, name: str) -> bool:
        """True when every cell of the column is known and larger than the one before."""
        return self.facts.rising(self[name])

    def known(self, name: str) -> list[bool] | None:
        """The cells of the column that are known, as a mask; None (all of them) when it has no gap."""
        if not self.has_gap(name):
            return None
        if name not in self._known:
            self._known[name] = list(map(_is_known, self[name]))
        return self._known[name]

    def both(self, mask: list[bool] | None, name: str) -> list[bool] | None:
        """``mask`` narrowed to the cells where the column is known; None (all) when that is every cell."""
        known = self.known(name)
        if known is None:
            return mask
        return known if mask is None else list(map(operator.and_, mask, known))

    def select(self, name: str, mask: list[bool] | None) -> Sequence[Any]:
        """The column's cells where ``mask`` is true, picked once per mask (two leak tests share the steps)."""
        if mask is None:
            return self[name]
        key = (name, id(mask))
        hit = self._selected.get(key)
        if hit is None or hit[0] is not mask:  # the mask is kept with the cells, so its id stays its own
            hit = self._selected[key] = (mask, _select(self[name], mask))
        return hit[1]

    def stretches(self, labels: Sequence[Any]) -> list[tuple[Any, int, int]] | None:
        """:func:`~vramscope.analysis.peaks.runs` of a label column (None: it changes too often to read so)."""
        return self.facts.runs(labels, limit=len(labels) // MIN_RUN_ROWS + 1)


def _distinct_known(dev: _Rows, name: str) -> int:
    """How many distinct known values the column holds."""
    if dev.rising(name):
        return dev.m
    return len(set(dev[name])) - dev.has_gap(name)  # set() keeps one None for all the unknown cells


def _take(values: Sequence[Any], rows: list[int]) -> list[Any]:
    # itemgetter picks many positions in C; it returns a bare item (not a tuple) for one position.
    if len(rows) == 1:
        return [values[rows[0]]]
    return list(itemgetter(*rows)(values)) if rows else []


def _select(values: Sequence[Any], mask: Sequence[bool] | None) -> Sequence[Any]:
    """The cells where ``mask`` is true (all cells, uncopied, without a mask)."""
    return values if mask is None else list(itertools.compress(values, mask))


def _both(mask: list[bool] | None, values: Sequence[Any]) -> list[bool] | None:
    """``mask`` narrowed to the cells where ``values`` is known; None (all) when that is every cell."""
    if None not in values:
        return mask
    if mask is None:
        return list(map(_is_known, values))
    return list(map(operator.and_, mask, map(_is_known, values)))


def _signal(dev: _Rows, candidates: Sequence[str]) -> str | None:
    return next((name for name in candidates if has_known(dev[name])), None)


def _phase_labels(phase: Sequence[Any], step: Sequence[Any]) -> Sequence[str]:
    """Each row's phase for the peaks: the logged one, else "train" on a step row, else "untagged"."""
    if all(phase):
        return phase  # every row has its phase (a step-aligned log): no copy
    if not any(phase):
        if None not in step:
            return ["train"] * len(step)
        if not has_known(step):
            return ["untagged"] * len(step)
    return [p if p else ("train" if s is not None else "untagged") for p, s in zip(phase, step, strict=True)]


# Per-phase peaks read the column one stretch of a phase at a time. A log whose phase changes every
# few rows (on average, more often than every MIN_RUN_ROWS rows) takes one C pass over the rows per
# phase instead; past MAX_PHASES_BY_COLUMN phases, one Python pass.
MIN_RUN_ROWS = 16
MAX_PHASES_BY_COLUMN = 32


def _peaks(dev: _Rows, key: str, peak_name: str | None) -> DevicePeak:
    """The highest reading, overall and per phase, with its step, time and phase (first one of equals)."""
    totals = dev["device_total_bytes"]
    last_total = _last_known(totals)
    peak = DevicePeak(key=key, metric=peak_name, at=None, phases={},
                      max_reserved_bytes=dev.top("reserved_bytes"), max_device_used_bytes=dev.top("device_used_bytes"),
                      max_host_rss_bytes=dev.top("host_rss_bytes"),
                      total_bytes=None if last_total is None else totals[last_total])
    if peak_name is None:
        return peak
    step, elapsed, times = dev["step"], dev["elapsed_s"], dev["time"]
    values = dev[peak_name]
    labels = _phase_labels(dev["phase"], step)
    found = _phase_maxima(dev, peak_name, labels)

    def where(i: int) -> PeakAt:
        return PeakAt(row=dev.row(i), bytes=values[i], step=step[i], phase=labels[i], time=times[i],
                      elapsed_s=elapsed[i])

    if not found:
        return peak
    # The run's peak is the highest phase peak; among equal ones, the earliest row (the first of equals).
    top = max(v for v, _ in found.values())
    i = min(i for v, i in found.values() if v == top)
    return replace(peak, at=where(i), phases={label: where(j) for label, (_, j) in found.items()})


def _phase_maxima(dev: _Rows, name: str, labels: Sequence[Any]) -> dict[Any, tuple[Any, int]]:
    """Each phase's largest known value of a column and its first row, in order of the phase's first reading."""
    values = dev[name]
    stretches = dev.stretches(labels)
    if stretches is None:
        return _phase_maxima_by_mask(values, labels)
    starts = [start for _, start, _ in stretches]
    read = dev.facts.stretches(values)
    if read is not None and set(starts) <= set(read[0]):
        # The column was read already, cut at least wherever the phase changes (a report's charts cut it
        # so): each phase's peak comes from those stretches.
        starts = read[0][:-1]
        maxima = [None if s is None else (s[2], s[3]) for s in read[1]]
    else:
        maxima, gap = stretch_maxima(values, [*starts, len(values)])
        dev.facts.learn_gap(values, gap)
    found: dict[Any, tuple[Any, int]] = {}
    for start, m in zip(starts, maxima, strict=True):
        label = labels[start]  # a stretch lies within one phase
        if m is not None and (label not in found or m[0] > found[label][0]):  # strict: the first of equals
            found[label] = m
    return found


def _phase_maxima_by_mask(values: Sequence[Any], labels: Sequence[Any]) -> dict[Any, tuple[Any, int]]:
    """:func:`_phase_maxima` for a phase that changes every few rows: each phase's rows picked in C."""
    known = _both(None, values)
    vals, labs = _select(values, known), _select(labels, known)
    rows: Sequence[int] = range(len(values)) if known is None else list(itertools.compress(range(len(values)), known))
    phases = list(dict.fromkeys(labs))  # in order of each phase's first reading
    found: dict[Any, tuple[Any, int]] = {}
    if len(phases) > MAX_PHASES_BY_COLUMN:
        for j, v in enumerate(vals):
            current = found.get(labs[j])
            if current is None or v > current[0]:
                found[labs[j]] = (v, rows[j])
        return found
    for label in phases:
        if len(phases) == 1:
            top = max(vals)
            found[label] = (top, rows[vals.index(top)])  # max() keeps the first of equals, as index() finds
            continue
        mask = list(map(operator.eq, labs, itertools.repeat(label)))
        mine = list(itertools.compress(vals, mask))
        top = max(mine)
        found[label] = (top, list(itertools.compress(rows, mask))[mine.index(top)])
    return found


def _analyze_device(
    key: str,
    dev: _Rows,
    capacity_bytes: int | None,
    max_batch_tokens: int | None,
    config: LeakConfig,
) -> DeviceAnalysis:
    step = dev["step"]
    elapsed = dev["elapsed_s"]
    level_name = _signal(dev, LEVEL_SIGNALS)
    peak_name = _signal(dev, PEAK_SIGNALS)

    # Peaks, overall and per phase, with where they happened.
    peak = _peaks(dev, key, peak_name)

    # The leak test on the training steps' rows (eval rows hold eval's own memory).
    train, unit = _train_rows(dev)
    found = _leak_on(level_name, train, dev, config, unit)
    leak = _device_leak(found, level_name, key, unit)
    if level_name == "allocated_bytes" and not found.detected:
        cached = _leak_on("reserved_bytes", train, dev, config, unit)
        if cached.detected:
            leak = replace(leak, caching=_caching(cached, train, dev, unit))

    # The forecast: room between the recent peak and the capacity, at the leak's slope.
    capacity = _capacity(dev, level_name, capacity_bytes)
    recent_peak = _recent_max(dev, peak_name)
    step_s = None
    if unit == "step":
        # Only the newest rows count: picked from the end, not from a copy of a day of rows.
        timed = dev.both(train, "elapsed_s")
        step_s = seconds_per_step(_tail(step, timed, RECENT_STEP_TIMES), _tail(elapsed, timed, RECENT_STEP_TIMES),
                                  recent=RECENT_STEP_TIMES)
    slope_per_step = found.slope_per_x if found.detected and unit == "step" else None
    fc = forecast_oom(slope_per_step, recent_peak, capacity, step_s)
    if found.detected and unit == "s" and found.slope_per_x and capacity is not None and recent_peak is not None:
        # A time-based log: the same arithmetic per second.
        seconds = forecast_oom(found.slope_per_x, recent_peak, capacity, 1.0)
        fc = replace(fc, seconds_to_oom=seconds.steps_to_oom, reason=seconds.reason)

    tokens = dev["tokens"]
    peaks = dev["peak_allocated_bytes"]
    tok_rows: list[bool] | None = []  # no row has both, as a rule because one of them is never logged
    if has_known(tokens) and has_known(peaks):
        tok_rows = dev.both(dev.both(train, "tokens"), "peak_allocated_bytes")
    if tok_rows is None or any(tok_rows):  # None: every row has both
        # The fit reads the newest rows only: they are picked from the end.
        lb = longest_batch(_tail(tokens, tok_rows, RECENT_BATCHES), _tail(peaks, tok_rows, RECENT_BATCHES), capacity,
                           max_batch_tokens, recent=RECENT_BATCHES)
    else:
        lb = no_batch_fit("no token counts in the log" if not has_known(tokens) else "no per-step peaks")
    return DeviceAnalysis(key, peak, leak, DeviceForecast(key, fc, lb))


def _train_rows(dev: _Rows) -> tuple[list[bool] | None, str]:
    """The rows the leak test runs on (a mask; None for all), and what x counts: training steps, or
    seconds in a time-based log (no step column: a `vramscope run` log)."""
    step, phase = dev["step"], dev["phase"]
    if not has_known(step):
        return dev.known("elapsed_s"), "s"
    # A log has a few phases, in long stretches as a rule: each phase is looked up once, and the mask is
    # built a stretch at a time (else every row's phase through a dict, a C call).
    stretches = dev.stretches(phase)
    training = {p: p in TRAIN_PHASES for p in (set(phase) if stretches is None else {p for p, _, _ in stretches})}
    if all(training.values()):
        return dev.known("step"), "step"
    if stretches is None:
        mask = list(map(training.__getitem__, phase))
    else:
        mask = []
        for p, start, end in stretches:
            mask += [training[p]] * (end - start)
    return dev.both(mask, "step"), "step"


@dataclass
class LeakSeries:
    """What the leak test of one device runs on: x (steps or seconds) and bytes."""

    key: str
    signal: str | None
    unit: str
    xs: list[float]
    ys: list[float]
    tokens: list[int | None] | None = None  # each row's batch tokens, when the log has them


def leak_series(table: LogTable) -> dict[str, LeakSeries]:
    """Per device, the series :func:`analyze` tests for a leak (to replay it prefix by prefix)."""
    columns: dict[str, Sequence[Any]] = {name: table.ints(name) for name in INT_COLUMNS}
    columns["elapsed_s"] = table.floats("elapsed_s")
    columns["phase"] = table.strings("phase")
    n = len(table)
    out: dict[str, LeakSeries] = {}
    for key, rows in _device_groups(_col(columns, "gpu", n)).items():
        dev = _Rows(columns, rows, n)
        signal = _signal(dev, LEVEL_SIGNALS)
        train, unit = _train_rows(dev)
        values = dev[signal] if signal else [None] * dev.m
        picked = _both(train, values)
        xs = _select(dev["step"] if unit == "step" else dev["elapsed_s"], picked)
        tokens = list(_select(dev["tokens"], picked))
        out[key] = LeakSeries(key, signal, unit, [float(x) for x in xs], [float(v) for v in _select(values, picked)],
                              tokens if has_known(tokens) else None)
    return out


def _leak_on(name: str | None, train: list[bool] | None, dev: _Rows, config: LeakConfig, unit: str) -> LeakResult:
    if name is None:
        return LeakResult(detected=False, kind="insufficient", verdict="no memory readings to test for a leak")
    picked = dev.both(train, name)
    known = dev.select("tokens", picked)
    x = "step" if unit == "step" else "elapsed_s"
    # The rows picked from a column that rises from row to row rise too: the test need not check it.
    return detect_leak(dev.select(x, picked), dev.select(name, picked), config_for(name, config), unit=unit,
                       tokens=known if has_known(known) else None, rising=dev.rising(x))


def _device_leak(leak: LeakResult, signal: str | None, key: str, unit: str) -> DeviceLeak:
    return DeviceLeak(key=key, detected=leak.detected, kind=leak.kind, verdict=leak.verdict, signal=signal, unit=unit,
                      slope_per_x=leak.slope_per_x, start_x=leak.start_x, growth_bytes=leak.growth_bytes, z=leak.z,
                      points=leak.points)


def _caching(cached: LeakResult, train: list[bool] | None, dev: _Rows, unit: str) -> Caching:
    # Reserved grows while allocated does not: the allocator keeps more blocks. When the cached but
    # unusable part (inactive split blocks) grows along, the cause is fragmentation.
    known = _known_values(_select(dev["inactive_split_bytes"], train))
    fragmented = (
        len(known) >= 2 and cached.growth_bytes is not None and (known[-1] - min(known)) >= 0.5 * cached.growth_bytes
    )
    what = "fragmentation (inactive split blocks grow with it)" if fragmented else "caching"
    rate = (cached.slope_per_x or 0.0) / MIB
    return Caching(
        kind="fragmentation" if fragmented else "caching",
        verdict=(
            f"no leak: allocated memory is flat while reserved grows {rate:.2f} MiB/{unit}: the allocator is {what}; "
            "it gives the memory back under pressure (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True limits it)"
        ),
        reserved_slope_bytes_per_step=cached.slope_per_x if unit == "step" else None,
        reserved_growth_bytes=cached.growth_bytes,
    )


def _capacity(dev: _Rows, level: str | None, given: int | None) -> int | None:
    if given is not None:
        return given
    total = dev["device_total_bytes"]
    i = _last_known(total)
    if i is None:
        return None
    if level == "allocated_bytes":
        return allocator_capacity(total[i], dev["device_used_bytes"][i], dev["reserved_bytes"][i])
    return int(total[i])


def _recent_max(dev: _Rows, name: str | None) -> int | None:
    """The largest of the newest tenth of a column's known values (at least 20 of them)."""
    if name is None:
        return None
    values = dev[name]
    count = len(values) - values.count(None) if dev.has_gap(name) else len(values)
    if not count:
        return None
    return int(max(_tail(values, dev.known(name), max(20, count // 10))))


# Which verdict stands for the log when no device leaks: the most telling kind (caching says what to do).
_KIND_RANK = {"caching": 0, "fragmentation": 0, "batch_growth": 0, "unconfirmed": 1, "none": 1, "plateau": 1,
              "insufficient": 2}


def _overall_leak(leaks: list[DeviceLeak]) -> LeakSummary:
    found = [lk for lk in leaks if lk.detected]
    worst: DeviceLeak | None
    if found:
        worst = max(found, key=lambda lk: lk.slope_per_x or 0.0)
    else:
        worst = min(leaks, key=lambda lk: _KIND_RANK.get(lk.shown_kind, 3), default=None)
    return LeakSummary(worst, {lk.key: lk for lk in leaks})


def _overall_forecast(forecasts: list[DeviceForecast]) -> ForecastSummary:
    if not forecasts:
        return ForecastSummary(None, no_batch_fit("the log has no rows"), {})
    soonest = min(forecasts, key=lambda f: (f.oom.steps_to_oom is None, f.oom.steps_to_oom or 0.0,
                                            f.oom.seconds_to_oom is None, f.oom.seconds_to_oom or 0.0))
    batches = [f.longest_batch for f in forecasts]
    risky = [b for b in batches if b.at_risk]
    fitted = [b for b in batches if b.available]
    return ForecastSummary(soonest, (risky or fitted or batches)[0], {f.key: f for f in forecasts})


def _warnings(devices: list[DeviceAnalysis]) -> list[str]:
    warnings: list[str] = []
    for d in devices:
        leak, fc = d.leak, d.forecast.oom
        where = "host" if d.key == "host" else f"GPU {d.key}"
        if leak.detected or leak.shown_kind in ("caching", "fragmentation"):
            warnings.append(f"{where}: {leak.shown_verdict}")
        if fc.steps_to_oom is not None and leak.detected:
            when = f" (~{fc.seconds_to_oom / 60:.0f} min)" if fc.seconds_to_oom is not None else ""
            warnings.append(f"{where}: at this rate the run runs out of memory in ~{fc.steps_to_oom:.0f} steps{when}")
        if d.forecast.longest_batch.warning:
            warnings.append(f"{where}: {d.forecast.longest_batch.warning}")
    return warnings
