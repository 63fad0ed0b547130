"""What a report reads of each device beyond the verdicts: every memory column's peak (overall and per
phase), the headroom to the capacity, the allocator's unused reserve (fragmentation), the longest batches,
and, for a log of several ranks, each rank's peaks and their imbalance. Whole-column numpy work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from vramscope.analysis.columns import Clock, LogColumns, last_known, top_known
from vramscope.analysis.devices import DeviceRows
from vramscope.analysis.results import (
    AtPeakReserved,
    BatchPeak,
    DeviceDetail,
    Fragmentation,
    Headroom,
    PeakAt,
    PhasePeaks,
    RankImbalance,
    RankPeak,
)
from vramscope.analysis.verdicts import batches_note, device_idle, headroom_level, imbalance_notable

# Memory columns a report looks at, with the names people read.
METRICS: dict[str, str] = {
    "device_used_bytes": "device used",
    "reserved_bytes": "reserved",
    "allocated_bytes": "allocated",
    "peak_allocated_bytes": "peak allocated",
    "process_bytes": "process",
    "host_rss_bytes": "host RSS",
}
LONGEST_BATCHES = 5
GAP_BUCKETS = 64  # buckets of the trend of reserved memory beyond demand
RANK_PEAKS = ("peak_allocated_bytes", "reserved_bytes", "device_used_bytes", "host_rss_bytes")
# Which peak the imbalance compares: the allocator's (what the model itself needs) when known.
IMBALANCE_ORDER = ("peak_allocated_bytes", "device_used_bytes", "host_rss_bytes")


def device_detail(dev: DeviceRows, clock: Clock, capacity_bytes: int | None) -> DeviceDetail:
    metrics = [m for m in METRICS if dev.filled(m)]
    peaks: dict[str, PeakAt] = {}
    for m in metrics:
        j = dev.argmax(m)
        if j is not None:
            peaks[m] = dev.peak_at(m, j, clock.at(int(dev.positions[j])))
    rows = dev.phase_rows()
    phases: dict[str, dict[str, PeakAt]] = {label: {} for label in rows}
    for m in metrics:
        for label, j in dev.phase_maxima(m).items():
            phases[label][m] = dev.peak_at(m, j, clock.at(int(dev.positions[j])))
    total = dev.column("device_total_bytes")
    last = last_known(total.known)
    logged_total = None if last is None else int(total.values[last])
    capacity = capacity_bytes if capacity_bytes is not None else logged_total
    step = dev.column("step")
    step_range = None
    if step.known.any():
        known = step.values[step.known] if not step.known.all() else step.values
        step_range = (int(known.min()), int(known.max()))
    used = peaks.get("device_used_bytes")
    batches = longest_batches(dev, clock)
    metric = batch_metric(dev)
    return DeviceDetail(
        key=dev.key,
        rows=dev.n,
        table_rows=dev.sel,
        step_range=step_range,
        stretches=dev.stretches(),
        peaks=peaks,
        phases={label: PhasePeaks(rows[label], found) for label, found in phases.items()},
        capacity_bytes=capacity,
        capacity_given=capacity_bytes is not None,
        total_logged=logged_total is not None,
        headroom=headroom(capacity, None if used is None else used.bytes),
        fragmentation=fragmentation(dev),
        longest_batches=batches,
        batch_metric=metric,
        batches_note=batches_note(metric, batches),
        idle=device_idle(dev.key, peaks, step_range is not None),
    )


def headroom(capacity: int | None, used: int | None) -> Headroom:
    if capacity is None or used is None:
        return Headroom(capacity, used, None, None)
    room = capacity - used
    fraction = round(room / capacity, 4) if capacity else None
    return Headroom(capacity, used, room, fraction, headroom_level(room, fraction))


# -- fragmentation ------------------------------------------------------------------------------------


def fragmentation(dev: DeviceRows) -> Fragmentation | None:
    """Reserved memory that no tensor used: the allocator's cache beyond demand, partly split and unusable.

    Measured against the per-step peak when the log has it: after a step, the activations' memory
    sits free in the cache on purpose (the next step reuses it), so only what even the peak did not
    use is overhead. Without per-step peaks, against what was allocated at the reading.
    """
    if not dev.filled("reserved_bytes"):
        return None
    demand_metric = "peak_allocated_bytes" if dev.filled("peak_allocated_bytes") else "allocated_bytes"
    if not dev.filled(demand_metric):
        return None
    reserved, demand = dev.column("reserved_bytes"), dev.column(demand_metric)
    both = reserved.known & demand.known
    every = bool(both.all())
    idx = np.arange(dev.n) if every else np.flatnonzero(both)
    if not len(idx):
        return None
    res = reserved.values if every else reserved.values[idx]
    used = demand.values if every else demand.values[idx]
    at = int(np.argmax(res))
    top, top_demand = int(res[at]), int(used.max())
    buckets = min(GAP_BUCKETS, len(res))
    cuts = bucket_starts(len(res), buckets)
    res_tops, used_tops = np.maximum.reduceat(res, cuts), np.maximum.reduceat(used, cuts)
    xs, x_unit = _trend_axis(dev, idx)
    slope = _gap_slope(xs, cuts, res_tops, used_tops) if xs is not None else None
    # A trend is only worth stating over a span long enough to hold one: a 26-second run says
    # nothing about the next hour. At least 200 steps, or 10 minutes of samples.
    if xs is not None and slope is not None and float(xs.max() - xs.min()) < (200 if x_unit == "step" else 600):
        slope = None
    total_res = int(res.sum())
    step = dev.column("step")
    split = dev.column("inactive_split_bytes")
    last_split = last_known(split.known)
    frag = Fragmentation(
        measured_against=demand_metric,
        at_peak_reserved=AtPeakReserved(top, top_demand, top - top_demand,
                                        round((top - top_demand) / top, 4) if top else None,
                                        int(step.values[idx[at]]) if step.known[idx[at]] else None),
        demand_over_reserved=round(int(used.sum()) / total_res, 4) if total_res else None,
        unused_trend_bytes_per=x_unit,
        unused_trend=None if slope is None else round(slope, 1),
        inactive_split_max_bytes=top_known(split.values, split.known),
        inactive_split_last_bytes=None if last_split is None else int(split.values[last_split]),
        has_inactive_split=dev.filled("inactive_split_bytes"),
        alloc_retries=_counter_max(dev, "num_alloc_retries"),
        ooms=_counter_max(dev, "num_ooms"),
        verdict="",
    )
    return _with_verdict(frag)


def bucket_starts(n: int, buckets: int) -> np.ndarray:
    """Where each of ``buckets`` equal buckets of ``n`` points begins (no repeats when ``n >= buckets``)."""
    return np.arange(buckets, dtype=np.int64) * n // buckets


def _trend_axis(dev: DeviceRows, idx: np.ndarray) -> tuple[np.ndarray | None, str]:
    step = dev.column("step")
    if step.known[idx].all():
        steps = step.values[idx]
        if len(np.unique(steps[:: max(1, len(steps) // 64)])) > 1:
            return steps.astype(np.float64), "step"
    # Time-based log: elapsed seconds at bucket granularity are enough for a slope.
    elapsed = dev.column("elapsed_s")
    if not elapsed.known[idx].all():
        return None, "s"
    return elapsed.values[idx], "s"


def _gap_slope(xs: np.ndarray, cuts: np.ndarray, reserved_tops: np.ndarray, demand_tops: np.ndarray) -> float | None:
    """Trend of reserved memory beyond the largest demand so far, per unit of x.

    Per bucket of consecutive rows: its largest reserved value less the largest demand up to its end (the
    pool is sized by the largest demand seen); then a least-squares slope over the buckets' mean x.
    """
    if len(xs) < 2:
        return None
    sizes = np.diff(np.append(cuts, len(xs)))
    mx = np.add.reduceat(xs, cuts) / sizes
    my = (reserved_tops - np.maximum.accumulate(demand_tops)).astype(np.float64)
    ax, ay = mx.mean(), my.mean()
    sxx = float(((mx - ax) ** 2).sum())
    if sxx == 0:
        return None
    return float(((mx - ax) * (my - ay)).sum()) / sxx


def _counter_max(dev: DeviceRows, column: str) -> int | None:
    """The largest value of one of torch's counters (cumulative); None when the log lacks it."""
    col = dev.column(column)
    top = top_known(col.values, col.known)
    if top is not None:
        return top
    # None of this device's rows has a count: 0 all the same when every count in the log is 0.
    whole = dev.cols.column(column)
    if not whole.known.any():
        return None
    return 0 if not whole.values[whole.known].any() else None


def _with_verdict(f: Fragmentation) -> Fragmentation:
    at = f.at_peak_reserved
    share = at.unused_fraction or 0.0
    demand = "the largest per-step peak" if f.measured_against == "peak_allocated_bytes" else "what was allocated"
    text = f"the allocator reserved {_gib(at.reserved_bytes)}, {_gib(at.unused_bytes)} ({share:.0%}) more than {demand}"
    if f.unused_trend is not None:
        per = 1000 if f.unused_trend_bytes_per == "step" else 3600
        change = f.unused_trend * per
        label = "1000 steps" if f.unused_trend_bytes_per == "step" else "hour"
        if abs(change) >= 64 * 1024**2:
            text += f"; the gap {'grows' if change > 0 else 'shrinks'} {_gib(abs(change))} per {label}"
        else:
            text += "; the gap is steady"
    if f.inactive_split_max_bytes:
        text += f"; split blocks that no allocation can use reached {_gib(f.inactive_split_max_bytes)}"
    if f.alloc_retries:
        text += f"; the allocator had to free its cache and retry {f.alloc_retries} times (close to OOM)"
    if f.ooms:
        text += f"; torch counted {f.ooms} out-of-memory errors"
    return replace(f, verdict=text)


def _gib(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB"


# -- the longest batches ------------------------------------------------------------------------------


def batch_metric(dev: DeviceRows) -> str | None:
    """The column a batch's peak is read from: the per-step peak, else what was allocated."""
    return next((m for m in ("peak_allocated_bytes", "allocated_bytes") if dev.filled(m)), None)


def longest_batches(dev: DeviceRows, clock: Clock) -> tuple[BatchPeak, ...]:
    """The training batches with the most tokens (one row per step), the highest peak first among equals,
    then the latest row.

    Only a training phase's rows (``train`` or none): an eval batch (often longer, and without a backward)
    is not the run's longest training batch, and the forecast fits the same rows."""
    if not dev.filled("tokens"):
        return ()
    tokens = dev.column("tokens")
    remaining = tokens.known & dev.training_phase()
    if not remaining.any():
        return ()
    metric = batch_metric(dev)
    peak = dev.column(metric) if metric else None
    step = dev.column("step")
    out: list[BatchPeak] = []
    seen: set[int] = set()
    while len(out) < LONGEST_BATCHES and remaining.any():
        # One length at a time, the longest first: batches padded to max_length can make one length hold
        # most of the run.
        length = int(tokens.values[remaining].max())
        rows = np.flatnonzero(remaining & (tokens.values == length))
        remaining[rows] = False
        if peak is None:
            values = np.full(len(rows), -1, np.int64)
        else:
            values = np.where(peak.known[rows], peak.values[rows], -1)
        for j in rows[np.lexsort((-rows, -values))].tolist():  # peak first, then the latest row
            s = int(step.values[j]) if step.known[j] else None
            if s is not None:
                if s in seen:  # a step logged twice counts once
                    continue
                seen.add(s)
            known_peak = peak is not None and bool(peak.known[j])
            out.append(BatchPeak(row=int(dev.positions[j]), step=s, tokens=length,
                                 peak_allocated_bytes=int(peak.values[j]) if peak is not None and known_peak else None,
                                 phase=dev.label(j), since_start_s=clock.at(int(dev.positions[j]))))
            if len(out) == LONGEST_BATCHES:
                break
    return tuple(out)


# -- ranks ------------------------------------------------------------------------------------------


def rank_imbalance(cols: LogColumns) -> RankImbalance | None:
    """Each rank's peaks and ``max/min - 1`` of one peak across ranks, for a log with several ranks (rank 0's
    log of a distributed run gathers every rank); None otherwise."""
    if not cols.filled("rank"):
        return None
    rank = cols.column("rank")
    distinct = np.unique(rank.values[rank.known]).tolist()
    if len(distinct) < 2:
        return None
    gpu, step = cols.column("gpu"), cols.column("step")
    entries: list[RankPeak] = []
    for r in distinct:
        rows = np.flatnonzero(rank.known & (rank.values == r))
        gpus = tuple(np.unique(gpu.values[rows][gpu.known[rows]]).tolist())
        peaks: dict[str, int | None] = {}
        peak_step = None
        for m in RANK_PEAKS:
            col = cols.column(m)
            known = col.known[rows]
            name = m if m.startswith("peak_") else f"peak_{m}"
            if not known.any():
                peaks[name] = None
                continue
            masked = np.where(known, col.values[rows], np.iinfo(np.int64).min)
            j = int(np.argmax(masked))
            peaks[name] = int(masked[j])
            if m == "peak_allocated_bytes":
                peak_step = int(step.values[rows[j]]) if step.known[rows[j]] else None
        entries.append(RankPeak(int(r), len(rows), tuple(int(g) for g in gpus), peaks, peak_step))
    return _imbalance(entries)


def _imbalance(entries: Sequence[RankPeak]) -> RankImbalance:
    for m in IMBALANCE_ORDER:
        name = m if m.startswith("peak_") else f"peak_{m}"
        values = [e.peaks[name] for e in entries]
        if all(v is not None for v in values):
            known = [v for v in values if v is not None]
            low = min(known)
            imbalance = round(max(known) / low - 1, 4) if low > 0 else None
            assert imbalance is None or imbalance >= 0, "the highest rank's peak below the lowest's"
            return RankImbalance(tuple(entries), name, imbalance, imbalance_notable(imbalance))
    return RankImbalance(tuple(entries), "", None)
