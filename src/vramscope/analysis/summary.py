"""One analysis of a memory log: peaks, leak verdict and OOM forecast, as typed results.

:func:`analyze` reads a :class:`~vramscope.logs.table.LogTable` (what ``vramscope report`` loads);
:func:`analyze_columns` takes the plain columns a live :class:`~vramscope.training.monitor.MemoryMonitor`
holds in memory and builds the same arrays, so that it gets exactly the same answer. Both return an
:class:`~vramscope.analysis.results.AnalysisResult` (``to_json()`` is the JSON ``report --json`` prints).
Every number is bytes, steps or seconds; None means unknown.

Per device (``"0"``, ``"1"``, ... for GPUs; ``"host"`` for a log without GPUs) the analysis picks the
best signal the log has: the allocator's ``allocated_bytes`` (what stays after each step) and
``peak_allocated_bytes`` (the exact per-step peak) when the training process logged them; else the
process's or the device's memory from NVML; else the host RSS. Devices and phases are grouped once
(:mod:`vramscope.analysis.devices`); the report reads the same groups from the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vramscope.analysis.columns import ANALYSED_COLUMNS, Clock, LogColumns, last_known, tail
from vramscope.analysis.details import device_detail, rank_imbalance
from vramscope.analysis.devices import DeviceRows, device_rows
from vramscope.analysis.forecast import (
    RECENT_BATCHES,
    RECENT_STEP_TIMES,
    allocator_capacity,
    forecast_oom,
    longest_batch,
    seconds_per_step,
)
from vramscope.analysis.leak import DEFAULT_CONFIG, LeakConfig, LeakResult, detect_leak
from vramscope.analysis.results import (
    AnalysisResult,
    Caching,
    DeviceAnalysis,
    DeviceForecast,
    DeviceLeak,
    DevicePeak,
    ForecastSummary,
    LeakSummary,
    LongestBatch,
    OomForecast,
    PeakAt,
    PeakSummary,
    StepRange,
    no_batch_fit,
)
from vramscope.analysis.verdicts import forecast_severity, leak_trend, oom_outlook
from vramscope.logs.table import LogTable
from vramscope.units import GIB, MIB

__all__ = [
    "ANALYSED_COLUMNS",
    "LeakSeries",
    "analyze",
    "analyze_columns",
    "config_for",
    "leak_series",
]

# Signals for the leak test, best first: what stays allocated after a step, then coarser views.
LEVEL_SIGNALS = ("allocated_bytes", "process_bytes", "device_used_bytes", "host_rss_bytes")
PEAK_SIGNALS = ("peak_allocated_bytes", "allocated_bytes", "process_bytes", "device_used_bytes", "host_rss_bytes")
# Signals that include an allocator's cache (glibc's heap in the RSS, torch's reserved memory in the
# device's and the process's figures) climb for a while after the start as the caches fill: a longer
# warm-up is skipped on them than on what the allocator has handed out.
CACHED_SIGNAL_WARMUP_POINTS = 50
CAPACITY_UNKNOWN = "capacity unknown"  # how the forecast's reason begins when no capacity is known


def config_for(signal: str | None, config: LeakConfig = DEFAULT_CONFIG) -> LeakConfig:
    """The leak-test thresholds for a signal: ``config``, with a longer warm-up on cache-including ones."""
    if signal is None or signal == "allocated_bytes":
        return config
    return replace(config, min_warmup_points=max(config.min_warmup_points, CACHED_SIGNAL_WARMUP_POINTS))


def analyze(
    table: LogTable,
    capacity_bytes: int | None = None,
    max_batch_tokens: int | None = None,
    config: LeakConfig = DEFAULT_CONFIG,
    capacity_hint: str | None = None,
    columns: LogColumns | None = None,
    capacity_option: str = "",
) -> AnalysisResult:
    """Analyse a log read by :func:`vramscope.logs.reader.read_log`.

    Args:
        table: the log.
        capacity_bytes: memory limit for the forecast when the log has no GPU total (a host-only
            log), or to forecast against a smaller budget than the GPU.
        max_batch_tokens: the longest batch the run can see (batch size x maximum sequence length),
            for the longest-batch forecast; None uses the longest batch seen.
        config: leak-test thresholds.
        capacity_hint: the forecast's reason when no capacity is known, said the caller's way (the
            report names its ``--gpu-memory`` option).
        columns: the table's columns, when the caller reads them too (a report draws them): each is
            read once for both.
        capacity_option: how the caller names a given capacity (the report's ``--gpu-memory``), for the
            verdict on a capacity below what the log holds.

    Returns:
        the typed result; its ``to_json()`` is ``{"leak": {...}, "peak": {...}, "forecast": {...},
        "warnings": [...], "devices": [...], ...}`` (docs/leak-detection.md lists every key).
    """
    cols = columns if columns is not None else LogColumns.from_table(table)
    return _analyze(cols, capacity_bytes, max_batch_tokens, config, capacity_hint, capacity_option)


def analyze_columns(
    columns: Mapping[str, Sequence[Any]],
    capacity_bytes: int | None = None,
    max_batch_tokens: int | None = None,
    config: LeakConfig = DEFAULT_CONFIG,
) -> AnalysisResult:
    """The analysis over typed columns (ints/floats/str, None = unknown), one entry per log row."""
    return _analyze(LogColumns.from_lists(columns), capacity_bytes, max_batch_tokens, config, None, "")


def _analyze(
    cols: LogColumns,
    capacity_bytes: int | None,
    max_batch_tokens: int | None,
    config: LeakConfig,
    capacity_hint: str | None,
    capacity_option: str,
) -> AnalysisResult:
    clock = Clock(cols)
    steps = _step_range(cols)
    devices: list[DeviceAnalysis] = []
    for key, sel in device_rows(cols).items():
        dev = DeviceRows(key, sel, cols)
        devices.append(_analyze_device(dev, clock, capacity_bytes, max_batch_tokens, config, capacity_hint,
                                       steps.logged, capacity_option))
    elapsed = cols.column("elapsed_s")
    seconds = elapsed.values[elapsed.known]
    peaks = {d.key: d.peak for d in devices}
    # The highest peak; the first device of equals.
    overall = max((p for p in peaks.values() if p.at is not None), key=lambda p: p.at.bytes if p.at else 0,
                  default=None)
    # What must hold (stated where it holds, as torch's _memory_viz does): the overall peak is every device's top.
    top = None if overall is None else overall.bytes
    assert top is None or all(p.bytes is None or p.bytes <= top for p in peaks.values()), "a device above the peak"
    return AnalysisResult(
        rows=cols.n,
        steps=steps,
        duration_s=float(seconds.max() - seconds.min()) if len(seconds) else None,
        leak=_overall_leak([d.leak for d in devices]),
        peak=PeakSummary(peaks, overall),
        forecast=_overall_forecast([d.forecast for d in devices]),
        devices=tuple(devices),
        warnings=tuple(_warnings(devices)),
        ranks=rank_imbalance(cols),
        phases=tuple(cols.labels("phase").names),
        start=clock.start,
        clock_duration_s=clock.duration_s(),
    )


def _step_range(cols: LogColumns) -> StepRange:
    step = cols.column("step")
    known = step.values if step.known.all() else step.values[step.known]
    if not len(known):
        return StepRange(0, None, None)
    rising = bool(np.all(known[1:] > known[:-1]))  # as a rule: then every step is distinct, with no sort
    count = len(known) if rising else len(np.unique(known))
    first, last = int(known.min()), int(known.max())
    assert 0 < count <= last - first + 1, "more distinct steps than the range holds"
    return StepRange(count, first, last)


def _signal(dev: DeviceRows, candidates: Sequence[str]) -> str | None:
    return next((name for name in candidates if dev.column(name).known.any()), None)


def _analyze_device(dev: DeviceRows, clock: Clock, capacity_bytes: int | None, max_batch_tokens: int | None,
                    config: LeakConfig, capacity_hint: str | None, steps_logged: int | None,
                    capacity_option: str = "") -> DeviceAnalysis:
    level_name = _signal(dev, LEVEL_SIGNALS)
    peak_name = _signal(dev, PEAK_SIGNALS)
    peak = _peak(dev, clock, peak_name)

    # The leak test on the training steps' rows (eval rows hold eval's own memory); against time in a log
    # without steps (a `vramscope run` log).
    unit = "step" if dev.has_steps else "s"
    train = dev.training() if unit == "step" else dev.column("elapsed_s").known
    found = _leak_on(dev, level_name, train, config, unit)
    leak = _device_leak(found, level_name, dev.key, unit)
    if level_name == "allocated_bytes" and not found.detected:
        cached = _leak_on(dev, "reserved_bytes", train, config, unit)
        if cached.detected:
            leak = replace(leak, caching=_caching(dev, cached, train, unit))
    leak = replace(leak, trend=leak_trend(dev, leak))

    capacity = _capacity(dev, level_name, capacity_bytes)
    oom = _oom(dev, found, unit, train, peak_name, capacity)
    if capacity_hint is not None and oom.reason.startswith(CAPACITY_UNKNOWN):
        oom = replace(oom, reason=capacity_hint)
    detail = device_detail(dev, clock, capacity_bytes)
    batch = _longest_batch(dev, train, capacity, max_batch_tokens)
    severity = forecast_severity(oom, steps_logged)
    held = max((b for b in (peak.bytes, detail.headroom.peak_used_bytes) if b is not None), default=None)
    given = None if capacity_bytes is None else f"{capacity_option or 'a capacity of'} {capacity_bytes / GIB:.3g}GiB"
    outlook = oom_outlook(detail.title, oom, batch, severity, leak, held, given, dev.key)
    forecast = DeviceForecast(dev.key, oom, batch, severity, outlook)
    _check_device(peak, leak, oom)
    return DeviceAnalysis(dev.key, peak, leak, forecast, detail)


def _check_device(peak: DevicePeak, leak: DeviceLeak, oom: OomForecast) -> None:
    """What must hold of one device's analysis (O(phases)): the run's peak is the highest phase peak, the recent
    peak the forecast starts from is one of the readings at or below it, a leak grows, and no OOM is behind."""
    if peak.at is not None:
        assert peak.phases and peak.at.bytes == max(p.bytes for p in peak.phases.values()), "peak != top phase peak"
        assert peak.at.phase in peak.phases, "the peak's phase has no peak"
    recent = oom.current_peak_bytes
    assert recent is None or peak.bytes is None or recent <= peak.bytes, "the recent peak is above the run's"
    assert not leak.detected or (leak.slope_per_x is not None and leak.slope_per_x > 0), "a leak that does not grow"
    assert oom.steps_to_oom is None or oom.steps_to_oom >= 0, "an OOM forecast in the past"
    assert oom.seconds_to_oom is None or oom.seconds_to_oom >= 0, "an OOM forecast in the past"


def _peak(dev: DeviceRows, clock: Clock, name: str | None) -> DevicePeak:
    """The highest reading of the device's peak signal, overall and per phase (first one of equals)."""
    total = dev.column("device_total_bytes")
    last = last_known(total.known)
    peak = DevicePeak(key=dev.key, metric=name, at=None, phases={},
                      max_reserved_bytes=_top(dev, "reserved_bytes"),
                      max_device_used_bytes=_top(dev, "device_used_bytes"),
                      max_host_rss_bytes=_top(dev, "host_rss_bytes"),
                      total_bytes=int(total.values[last]) if last is not None else None)
    if name is None:
        return peak
    top = dev.argmax(name)
    if top is None:
        return peak
    def at(j: int) -> PeakAt:
        return dev.peak_at(name, j, clock.at(dev.row(j)))

    phases = {label: at(j) for label, j in dev.phase_maxima(name).items()}
    return replace(peak, at=at(top), phases=phases)


def _top(dev: DeviceRows, name: str) -> int | None:
    j = dev.argmax(name)
    return None if j is None else int(dev.column(name).values[j])


def _leak_on(dev: DeviceRows, name: str | None, train: np.ndarray, config: LeakConfig, unit: str) -> LeakResult:
    if name is None:
        return LeakResult(detected=False, kind="insufficient", verdict="no memory readings to test for a leak")
    xs, ys, tokens = _series(dev, name, train, unit)
    rising = bool(np.all(xs[1:] > xs[:-1]))
    return detect_leak(xs, ys, config_for(name, config), unit=unit, tokens=tokens, rising=rising)


def _series(dev: DeviceRows, name: str, train: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray,
                                                                               np.ndarray | None]:
    """What the leak test reads: x (steps or seconds), bytes, and each row's batch tokens (NaN: unknown)
    when the log has them, on the rows of ``train`` where the signal is known."""
    signal = dev.column(name)
    picked = train & signal.known
    x = dev.column("step" if unit == "step" else "elapsed_s")
    tokens = dev.column("tokens")
    if picked.all():  # every row, as a rule: the columns as floats (seconds as they are: read-only), no pick
        xs, ys = x.values.astype(np.float64, copy=False), signal.values.astype(np.float64, copy=False)
        known = tokens.known
        toks = np.where(known, tokens.values, np.nan) if known.any() else None
        return xs, ys, toks
    xs = x.values[picked].astype(np.float64, copy=False)
    ys = signal.values[picked].astype(np.float64, copy=False)
    known = tokens.known[picked]
    toks = np.where(known, tokens.values[picked], np.nan) if known.any() else None
    return xs, ys, toks


def _device_leak(leak: LeakResult, signal: str | None, key: str, unit: str) -> DeviceLeak:
    return DeviceLeak(key=key, detected=leak.detected, kind=leak.kind, verdict=leak.verdict, signal=signal, unit=unit,
                      slope_per_x=leak.slope_per_x, start_x=leak.start_x, growth_bytes=leak.growth_bytes, z=leak.z,
                      points=leak.points)


def _caching(dev: DeviceRows, cached: LeakResult, train: np.ndarray, unit: str) -> Caching:
    # Reserved grows while allocated does not: the allocator keeps more blocks. When the cached but
    # unusable part (inactive split blocks) grows along, the cause is fragmentation.
    split = dev.column("inactive_split_bytes")
    known = split.values[train & split.known]
    fragmented = (len(known) >= 2 and cached.growth_bytes is not None
                  and int(known[-1] - known.min()) >= 0.5 * cached.growth_bytes)
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


def _capacity(dev: DeviceRows, level: str | None, given: int | None) -> int | None:
    if given is not None:
        return given
    total = dev.column("device_total_bytes")
    rows = np.flatnonzero(total.known)
    if not len(rows):
        return None
    i = int(rows[-1])
    if level == "allocated_bytes":
        used, reserved = dev.column("device_used_bytes"), dev.column("reserved_bytes")
        return allocator_capacity(int(total.values[i]), int(used.values[i]) if used.known[i] else None,
                                  int(reserved.values[i]) if reserved.known[i] else None)
    return int(total.values[i])


def _oom(dev: DeviceRows, found: LeakResult, unit: str, train: np.ndarray, peak_name: str | None,
         capacity: int | None) -> OomForecast:
    """Room between the recent peak and the capacity, at the leak's slope."""
    recent_peak = _recent_max(dev, peak_name)
    step_s = None
    if unit == "step":
        elapsed = dev.column("elapsed_s")
        rows = tail(train & elapsed.known, RECENT_STEP_TIMES)  # only the newest rows count
        step_s = seconds_per_step(dev.column("step").values[rows], elapsed.values[rows], recent=RECENT_STEP_TIMES)
    if unit == "s":
        # A log without steps: the same arithmetic per second, and no steps to count (not "~0 steps").
        per_s = found.slope_per_x if found.detected else None
        fc = forecast_oom(per_s, recent_peak, capacity, 1.0)
        return replace(fc, steps_to_oom=None, seconds_to_oom=fc.steps_to_oom, slope_bytes_per_step=None,
                       seconds_per_step=None, slope_bytes_per_second=per_s)
    slope_per_step = found.slope_per_x if found.detected else None
    return forecast_oom(slope_per_step, recent_peak, capacity, step_s)


def _recent_max(dev: DeviceRows, name: str | None) -> int | None:
    """The largest of the newest tenth of a column's known values (at least 20 of them)."""
    if name is None:
        return None
    col = dev.column(name)
    count = int(col.known.sum())
    if not count:
        return None
    return int(col.values[tail(col.known, max(20, count // 10))].max())


def _longest_batch(dev: DeviceRows, train: np.ndarray, capacity: int | None,
                   max_batch_tokens: int | None) -> LongestBatch:
    tokens, peaks = dev.column("tokens"), dev.column("peak_allocated_bytes")
    if not tokens.known.any():
        return no_batch_fit("no token counts in the log")
    # The newest training rows only: ``train`` is every row of a log without steps, eval's among them.
    rows = tail(train & dev.training_phase() & tokens.known & peaks.known, RECENT_BATCHES)
    if not len(rows):
        return no_batch_fit("no per-step peaks")
    return longest_batch(tokens.values[rows], peaks.values[rows], capacity, max_batch_tokens, recent=RECENT_BATCHES)


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
    # Already over (or at) the capacity first, then the fewest steps, then the fewest seconds (a log without steps).
    soonest = min(forecasts, key=lambda f: (not f.outlook.at_capacity,
                                            f.oom.steps_to_oom is None, f.oom.steps_to_oom or 0.0,
                                            f.oom.seconds_to_oom is None, f.oom.seconds_to_oom or 0.0))
    batches = [f.longest_batch for f in forecasts]
    risky = [b for b in batches if b.at_risk]
    fitted = [b for b in batches if b.available]
    # The report leads with the soonest OOM; without one, with a batch at risk on any device.
    ahead = [f.outlook for f in forecasts if f.outlook.ahead]
    outlook = soonest.outlook if soonest.outlook.ahead or not ahead else ahead[0]
    return ForecastSummary(soonest, (risky or fitted or batches)[0], {f.key: f for f in forecasts}, outlook)


def _warnings(devices: list[DeviceAnalysis]) -> list[str]:
    warnings: list[str] = []
    for d in devices:
        leak = d.leak
        where = "host" if d.key == "host" else f"GPU {d.key}"
        if leak.detected or leak.shown_kind in ("caching", "fragmentation"):
            warnings.append(f"{where}: {leak.shown_verdict}")
        outlook = d.forecast.outlook
        if outlook.at_capacity:
            warnings.append(outlook.detail)  # it names the device
        elif outlook.kind == "leak" and leak.detected:
            warnings.append(f"{where}: at this rate the run runs {outlook.headline}")
        if d.forecast.longest_batch.warning:
            warnings.append(f"{where}: {d.forecast.longest_batch.warning}")
    return warnings


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
    cols = LogColumns.from_table(table)
    out: dict[str, LeakSeries] = {}
    for key, sel in device_rows(cols).items():
        dev = DeviceRows(key, sel, cols)
        signal = _signal(dev, LEVEL_SIGNALS)
        unit = "step" if dev.has_steps else "s"
        train = dev.training() if unit == "step" else dev.column("elapsed_s").known
        if signal is None:
            out[key] = LeakSeries(key, None, unit, [], [], None)
            continue
        xs, ys, tokens = _series(dev, signal, train, unit)
        toks = None if tokens is None else [None if t != t else int(t) for t in tokens.tolist()]
        out[key] = LeakSeries(key, signal, unit, xs.tolist(), ys.tolist(), toks)
    return out
