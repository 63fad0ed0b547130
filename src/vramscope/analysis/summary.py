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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vramscope.analysis.forecast import allocator_capacity, forecast_oom, longest_batch, seconds_per_step
from vramscope.analysis.leak import DEFAULT_CONFIG, LeakConfig, LeakResult, detect_leak
from vramscope.logfile import LogTable

MIB = 1024 * 1024

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
) -> dict[str, Any]:
    """Analyse a log read by :func:`vramscope.logfile.read_log`.

    Args:
        table: the log.
        capacity_bytes: memory limit for the forecast when the log has no GPU total (a host-only
            log), or to forecast against a smaller budget than the GPU.
        max_batch_tokens: the longest batch the run can see (batch size x maximum sequence length),
            for the longest-batch forecast; None uses the longest batch seen.
        config: leak-test thresholds.

    Returns:
        ``{"leak": {...}, "peak": {...}, "forecast": {...}, "warnings": [...], "devices": [...], ...}``;
        see docs/leak-detection.md for every key.
    """
    columns: dict[str, Sequence[Any]] = {}
    for name in INT_COLUMNS:
        columns[name] = table.ints(name)
    for name in FLOAT_COLUMNS:
        columns[name] = table.floats(name)
    for name in TEXT_COLUMNS:
        columns[name] = table.strings(name)
    return analyze_columns(columns, capacity_bytes=capacity_bytes, max_batch_tokens=max_batch_tokens, config=config)


def analyze_columns(
    columns: Columns,
    capacity_bytes: int | None = None,
    max_batch_tokens: int | None = None,
    config: LeakConfig = DEFAULT_CONFIG,
) -> dict[str, Any]:
    """The analysis over typed columns (ints/floats/str, None = unknown), one entry per log row."""
    n = max((len(v) for v in columns.values()), default=0)
    groups: dict[str, list[int]] = {}
    gpu_col = _col(columns, "gpu", n)
    for i in range(n):
        gpu = gpu_col[i]
        groups.setdefault("host" if gpu is None else str(gpu), []).append(i)

    devices = [_analyze_device(key, rows, columns, n, capacity_bytes, max_batch_tokens, config)
               for key, rows in groups.items()]
    steps = [s for s in _col(columns, "step", n) if s is not None]
    elapsed = [e for e in _col(columns, "elapsed_s", n) if e is not None]
    result: dict[str, Any] = {
        "rows": n,
        "steps": {"count": len(set(steps)), "first": min(steps) if steps else None,
                  "last": max(steps) if steps else None},
        "duration_s": (max(elapsed) - min(elapsed)) if elapsed else None,
        "leak": _overall_leak(devices),
        "peak": {"devices": {d["key"]: d["peak"] for d in devices}},
        "forecast": _overall_forecast(devices),
        "devices": [d["key"] for d in devices],
    }
    overall_peak = max((d["peak"] for d in devices if d["peak"].get("bytes") is not None),
                       key=lambda p: p["bytes"], default=None)
    result["peak"]["overall"] = overall_peak
    result["warnings"] = _warnings(result, devices)
    return result


def _col(columns: Columns, name: str, n: int) -> Sequence[Any]:
    values = columns.get(name)
    return values if values is not None and len(values) == n else [None] * n


def _signal(columns: Columns, rows: list[int], candidates: Sequence[str], n: int) -> str | None:
    for name in candidates:
        values = _col(columns, name, n)
        if any(values[i] is not None for i in rows):
            return name
    return None


def _phase_of(phase: str | None, step: int | None) -> str:
    if phase:
        return phase
    return "train" if step is not None else "untagged"


def _analyze_device(
    key: str,
    rows: list[int],
    columns: Columns,
    n: int,
    capacity_bytes: int | None,
    max_batch_tokens: int | None,
    config: LeakConfig,
) -> dict[str, Any]:
    step = _col(columns, "step", n)
    phase = _col(columns, "phase", n)
    elapsed = _col(columns, "elapsed_s", n)
    times = _col(columns, "time", n)
    level_name = _signal(columns, rows, LEVEL_SIGNALS, n)
    peak_name = _signal(columns, rows, PEAK_SIGNALS, n)

    # Peaks, overall and per phase, with where they happened.
    peak: dict[str, Any] = {"metric": peak_name, "bytes": None, "step": None, "time": None, "elapsed_s": None,
                            "phase": None, "phases": {}}
    if peak_name is not None:
        values = _col(columns, peak_name, n)
        for i in rows:
            v = values[i]
            if v is None:
                continue
            ph = _phase_of(phase[i], step[i])
            where = {"bytes": v, "step": step[i], "time": times[i], "elapsed_s": elapsed[i]}
            current = peak["phases"].get(ph)
            if current is None or v > current["bytes"]:
                peak["phases"][ph] = where
            if peak["bytes"] is None or v > peak["bytes"]:
                peak.update(where, phase=ph)
    for extra in ("reserved_bytes", "device_used_bytes", "host_rss_bytes"):
        values = _col(columns, extra, n)
        known = [values[i] for i in rows if values[i] is not None]
        peak[f"max_{extra}"] = max(known) if known else None
    totals = _col(columns, "device_total_bytes", n)
    peak["total_bytes"] = next((totals[i] for i in reversed(rows) if totals[i] is not None), None)
    peak["gpu"] = None if key == "host" else int(key)
    peak["key"] = key

    # The leak test on the training steps' rows (eval rows hold eval's own memory).
    train_rows, unit = _train_rows(rows, step, phase, elapsed)
    x_of = (lambda i: step[i]) if unit == "step" else (lambda i: elapsed[i])
    leak = _leak_on(level_name, train_rows, columns, x_of, n, config, unit)
    leak_dict = _leak_dict(leak, level_name, key, unit)
    if level_name == "allocated_bytes" and not leak.detected:
        cached = _leak_on("reserved_bytes", train_rows, columns, x_of, n, config, unit)
        if cached.detected:
            leak_dict.update(_caching(cached, train_rows, columns, n, x_of, unit))

    # The forecast: room between the recent peak and the capacity, at the leak's slope.
    capacity = _capacity(rows, columns, n, level_name, capacity_bytes)
    recent_peak = _recent_max(rows, _col(columns, peak_name, n) if peak_name else [None] * n)
    train_steps = [step[i] for i in train_rows if unit == "step" and elapsed[i] is not None]
    train_elapsed = [elapsed[i] for i in train_rows if unit == "step" and elapsed[i] is not None]
    step_s = seconds_per_step(train_steps, train_elapsed) if unit == "step" else None
    slope_per_step = leak.slope_per_x if leak.detected and unit == "step" else None
    fc = forecast_oom(slope_per_step, recent_peak, capacity, step_s)
    if leak.detected and unit == "s" and leak.slope_per_x and capacity is not None and recent_peak is not None:
        # A time-based log: the same arithmetic per second.
        seconds = forecast_oom(leak.slope_per_x, recent_peak, capacity, 1.0)
        fc.seconds_to_oom = seconds.steps_to_oom
        fc.reason = seconds.reason
    forecast = fc.to_dict()
    forecast["key"] = key

    tokens = _col(columns, "tokens", n)
    peaks = _col(columns, "peak_allocated_bytes", n)
    tok_rows = [i for i in train_rows if tokens[i] is not None and peaks[i] is not None]
    if tok_rows:
        lb = longest_batch([tokens[i] for i in tok_rows], [peaks[i] for i in tok_rows], capacity, max_batch_tokens)
        forecast["longest_batch"] = lb.to_dict()
    else:
        why = "no token counts in the log" if not any(tokens[i] is not None for i in rows) else "no per-step peaks"
        forecast["longest_batch"] = {"available": False, "reason": why, "at_risk": False, "warning": None}
    return {"key": key, "peak": peak, "leak": leak_dict, "forecast": forecast}


def _train_rows(
    rows: list[int], step: Sequence[Any], phase: Sequence[Any], elapsed: Sequence[Any]
) -> tuple[list[int], str]:
    """The rows the leak test runs on, and what x counts: training steps, or seconds in a time-based log."""
    train_rows = [i for i in rows if step[i] is not None and phase[i] in TRAIN_PHASES]
    if train_rows or any(step[i] is not None for i in rows):
        return train_rows, "step"
    return [i for i in rows if elapsed[i] is not None], "s"


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
    groups: dict[str, list[int]] = {}
    for i, gpu in enumerate(_col(columns, "gpu", n)):
        groups.setdefault("host" if gpu is None else str(gpu), []).append(i)
    step, phase, elapsed = _col(columns, "step", n), _col(columns, "phase", n), _col(columns, "elapsed_s", n)
    for key, rows in groups.items():
        signal = _signal(columns, rows, LEVEL_SIGNALS, n)
        train_rows, unit = _train_rows(rows, step, phase, elapsed)
        values: Sequence[Any] = _col(columns, signal, n) if signal else [None] * n
        xcol = step if unit == "step" else elapsed
        picked = [i for i in train_rows if values[i] is not None]
        tokens = [columns["tokens"][i] for i in picked]
        out[key] = LeakSeries(key, signal, unit, [float(xcol[i]) for i in picked], [float(values[i]) for i in picked],
                              tokens if any(t is not None for t in tokens) else None)
    return out


def _leak_on(
    name: str | None, rows: list[int], columns: Columns, x_of: Any, n: int, config: LeakConfig, unit: str
) -> LeakResult:
    if name is None:
        return LeakResult(detected=False, kind="insufficient", verdict="no memory readings to test for a leak")
    values = _col(columns, name, n)
    tokens = _col(columns, "tokens", n)
    picked = [i for i in rows if values[i] is not None]
    known = [tokens[i] for i in picked]
    return detect_leak([x_of(i) for i in picked], [values[i] for i in picked], config_for(name, config), unit=unit,
                       tokens=known if any(t is not None for t in known) else None)


def _leak_dict(leak: LeakResult, signal: str | None, key: str, unit: str) -> dict[str, Any]:
    per_step = unit == "step"
    return {
        "detected": leak.detected,
        "kind": leak.kind,
        "verdict": leak.verdict,
        "slope_bytes_per_step": leak.slope_per_x if per_step else None,
        "slope_bytes_per_second": None if per_step else leak.slope_per_x,
        "start_step": round(leak.start_x) if per_step and leak.start_x is not None else None,
        "start_elapsed_s": None if per_step else leak.start_x,
        "growth_bytes": leak.growth_bytes,
        "z": leak.z,
        "points": leak.points,
        "signal": signal,
        "key": key,
        "gpu": None if key == "host" else int(key),
    }


def _caching(cached: LeakResult, rows: list[int], columns: Columns, n: int, x_of: Any, unit: str) -> dict[str, Any]:
    # Reserved grows while allocated does not: the allocator keeps more blocks. When the cached but
    # unusable part (inactive split blocks) grows along, the cause is fragmentation.
    split = _col(columns, "inactive_split_bytes", n)
    known = [split[i] for i in rows if split[i] is not None]
    fragmented = (
        len(known) >= 2 and cached.growth_bytes is not None and (known[-1] - min(known)) >= 0.5 * cached.growth_bytes
    )
    what = "fragmentation (inactive split blocks grow with it)" if fragmented else "caching"
    rate = (cached.slope_per_x or 0.0) / MIB
    return {
        "kind": "fragmentation" if fragmented else "caching",
        "verdict": (
            f"no leak: allocated memory is flat while reserved grows {rate:.2f} MiB/{unit}: the allocator is {what}; "
            "it gives the memory back under pressure (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True limits it)"
        ),
        "reserved_slope_bytes_per_step": cached.slope_per_x if unit == "step" else None,
        "reserved_growth_bytes": cached.growth_bytes,
    }


def _capacity(rows: list[int], columns: Columns, n: int, level: str | None, given: int | None) -> int | None:
    if given is not None:
        return given
    total = _col(columns, "device_total_bytes", n)
    used = _col(columns, "device_used_bytes", n)
    reserved = _col(columns, "reserved_bytes", n)
    for i in reversed(rows):
        if total[i] is not None:
            if level == "allocated_bytes":
                return allocator_capacity(total[i], used[i], reserved[i])
            return int(total[i])
    return None


def _recent_max(rows: list[int], values: Sequence[Any]) -> int | None:
    known = [values[i] for i in rows if values[i] is not None]
    if not known:
        return None
    tail = known[-max(20, len(known) // 10) :]
    return int(max(tail))


def _overall_leak(devices: list[dict[str, Any]]) -> dict[str, Any]:
    leaks = [d["leak"] for d in devices]
    found = [lk for lk in leaks if lk["detected"]]
    if found:
        worst = max(found, key=lambda lk: lk["slope_bytes_per_step"] or lk["slope_bytes_per_second"] or 0.0)
    else:
        rank = {"caching": 0, "fragmentation": 0, "batch_growth": 0, "unconfirmed": 1, "none": 1, "plateau": 1,
                "insufficient": 2}
        worst = min(leaks, key=lambda lk: rank.get(lk["kind"], 3)) if leaks else {
            "detected": False, "kind": "insufficient", "verdict": "the log has no rows", "slope_bytes_per_step": None,
            "start_step": None}
    out = dict(worst)
    out["devices"] = {lk["key"]: lk for lk in leaks}
    return out


def _overall_forecast(devices: list[dict[str, Any]]) -> dict[str, Any]:
    forecasts = [d["forecast"] for d in devices]
    if not forecasts:
        return {"steps_to_oom": None, "seconds_to_oom": None, "longest_batch": {"available": False,
                "reason": "the log has no rows", "at_risk": False, "warning": None}, "devices": {}}
    soonest = min(forecasts, key=lambda f: (f["steps_to_oom"] is None, f["steps_to_oom"] or 0.0,
                                            f["seconds_to_oom"] is None, f["seconds_to_oom"] or 0.0))
    out = {k: v for k, v in soonest.items() if k != "longest_batch"}
    batches = [f["longest_batch"] for f in forecasts]
    risky = [b for b in batches if b.get("at_risk")]
    fitted = [b for b in batches if b.get("available")]
    out["longest_batch"] = (risky or fitted or batches)[0]
    out["devices"] = {f["key"]: f for f in forecasts}
    return out


def _warnings(result: dict[str, Any], devices: list[dict[str, Any]]) -> list[str]:
    warnings: list[str] = []
    for d in devices:
        leak = d["leak"]
        where = "host" if d["key"] == "host" else f"GPU {d['key']}"
        if leak["detected"] or leak["kind"] in ("caching", "fragmentation"):
            warnings.append(f"{where}: {leak['verdict']}")
        fc = d["forecast"]
        if fc["steps_to_oom"] is not None and leak["detected"]:
            when = f" (~{fc['seconds_to_oom'] / 60:.0f} min)" if fc["seconds_to_oom"] is not None else ""
            steps = f"~{fc['steps_to_oom']:.0f} steps{when}"
            warnings.append(f"{where}: at this rate the run runs out of memory in {steps}")
        lb = fc.get("longest_batch") or {}
        if lb.get("warning"):
            warnings.append(f"{where}: {lb['warning']}")
    return warnings
