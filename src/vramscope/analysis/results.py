"""What the analysis of a memory log finds, as typed results: computed once in :mod:`vramscope.analysis`,
read by the report, the live monitor and the CLI; turned into a dict only at the JSON edge (``to_json``).

The JSON is the one ``vramscope report --json`` prints (it carries :data:`SCHEMA_VERSION`) and the one
``MemoryMonitor.analysis()`` returns; docs/leak-detection.md lists its keys. Every number is bytes,
steps or seconds; None means unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# The version of the JSON of a report (``report --json``): raised when a field changes meaning or goes.
SCHEMA_VERSION = 1

Json = dict[str, Any]


# -- where a peak was ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeakAt:
    """A reading worth pointing at (a peak): its value and the row it was read on.

    ``elapsed_s`` is the logged seconds of the row; ``since_start_s`` the seconds since the log's first row
    by the wall clock (what a report shows: rows of two writers agree on it), else the logged seconds.
    """

    row: int  # the row of the table
    bytes: int
    step: int | None
    phase: str
    time: str | None
    elapsed_s: float | None
    since_start_s: float | None = None

    def to_json(self) -> Json:
        """The analysis' form (``peak.devices.<key>.phases.<phase>``)."""
        return {"bytes": self.bytes, "step": self.step, "time": self.time, "elapsed_s": self.elapsed_s}

    def report_json(self) -> Json:
        """The report's form (``devices.<key>.peaks.<metric>``): with the phase, seconds since the start."""
        since = None if self.since_start_s is None else round(self.since_start_s, 3)
        return {"bytes": self.bytes, "step": self.step, "phase": self.phase, "time": self.time, "elapsed_s": since}


@dataclass(frozen=True)
class DevicePeak:
    """One device's peak of its best peak signal (``metric``), overall and per phase, and other maxima."""

    key: str  # "0", "1", ... or "host"
    metric: str | None  # the column the peak is read from; None: the device has no memory reading
    at: PeakAt | None  # the run's peak: the highest phase peak, the first of equals
    phases: dict[str, PeakAt]  # in order of each phase's first reading
    max_reserved_bytes: int | None
    max_device_used_bytes: int | None
    max_host_rss_bytes: int | None
    total_bytes: int | None  # the device's total memory, as last logged

    @property
    def gpu(self) -> int | None:
        return None if self.key == "host" else int(self.key)

    @property
    def bytes(self) -> int | None:
        return None if self.at is None else self.at.bytes

    def to_json(self) -> Json:
        at = self.at
        return {
            "metric": self.metric,
            "bytes": None if at is None else at.bytes,
            "step": None if at is None else at.step,
            "time": None if at is None else at.time,
            "elapsed_s": None if at is None else at.elapsed_s,
            "phase": None if at is None else at.phase,
            "phases": {label: p.to_json() for label, p in self.phases.items()},
            "max_reserved_bytes": self.max_reserved_bytes,
            "max_device_used_bytes": self.max_device_used_bytes,
            "max_host_rss_bytes": self.max_host_rss_bytes,
            "total_bytes": self.total_bytes,
            "gpu": self.gpu,
            "key": self.key,
        }


@dataclass(frozen=True)
class PeakSummary:
    devices: dict[str, DevicePeak]
    overall: DevicePeak | None  # the device with the highest peak (the first of equals)

    def to_json(self) -> Json:
        return {"devices": {k: p.to_json() for k, p in self.devices.items()},
                "overall": None if self.overall is None else self.overall.to_json()}


# -- leak -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caching:
    """Reserved memory grows while allocated memory is flat: the allocator caches (or fragments), no leak."""

    kind: str  # "caching" or "fragmentation"
    verdict: str
    reserved_slope_bytes_per_step: float | None
    reserved_growth_bytes: float | None


@dataclass(frozen=True)
class DeviceLeak:
    """The leak test's verdict on one device (see :mod:`vramscope.analysis.leak`)."""

    key: str
    detected: bool
    kind: str  # "leak", "none", "plateau", "unconfirmed", "batch_growth", "insufficient"
    verdict: str
    signal: str | None  # the column tested
    unit: str  # "step", or "s" for a log without steps
    slope_per_x: float | None
    start_x: float | None
    growth_bytes: float | None
    z: float | None
    points: int
    caching: Caching | None = None  # reserved grows while allocated does not
    trend: TrendLine | None = None  # a leak over steps: its trend line on the signal's readings

    @property
    def gpu(self) -> int | None:
        return None if self.key == "host" else int(self.key)

    @property
    def slope_bytes_per_step(self) -> float | None:
        return self.slope_per_x if self.unit == "step" else None

    @property
    def slope_bytes_per_second(self) -> float | None:
        return None if self.unit == "step" else self.slope_per_x

    @property
    def start_step(self) -> int | None:
        return round(self.start_x) if self.unit == "step" and self.start_x is not None else None

    @property
    def shown_kind(self) -> str:
        """The kind people read: caching or fragmentation over the test's own "none"."""
        return self.caching.kind if self.caching is not None else self.kind

    @property
    def shown_verdict(self) -> str:
        return self.caching.verdict if self.caching is not None else self.verdict

    def to_json(self) -> Json:
        out: Json = {
            "detected": self.detected,
            "kind": self.shown_kind,
            "verdict": self.shown_verdict,
            "slope_bytes_per_step": self.slope_bytes_per_step,
            "slope_bytes_per_second": self.slope_bytes_per_second,
            "start_step": self.start_step,
            "start_elapsed_s": None if self.unit == "step" else self.start_x,
            "growth_bytes": self.growth_bytes,
            "z": self.z,
            "points": self.points,
            "signal": self.signal,
            "key": self.key,
            "gpu": self.gpu,
        }
        if self.caching is not None:
            out["reserved_slope_bytes_per_step"] = self.caching.reserved_slope_bytes_per_step
            out["reserved_growth_bytes"] = self.caching.reserved_growth_bytes
        return out


@dataclass(frozen=True)
class LeakSummary:
    """The most telling device's verdict (the steepest leak, else the most telling kind), and each device's."""

    worst: DeviceLeak | None  # None: the log has no rows
    devices: dict[str, DeviceLeak]

    @property
    def detected(self) -> bool:
        return self.worst is not None and self.worst.detected

    def to_json(self) -> Json:
        if self.worst is None:
            out: Json = {"detected": False, "kind": "insufficient", "verdict": "the log has no rows",
                         "slope_bytes_per_step": None, "start_step": None}
        else:
            out = self.worst.to_json()
        out["devices"] = {k: lk.to_json() for k, lk in self.devices.items()}
        return out


@dataclass(frozen=True)
class TrendLine:
    """The leak's trend over the steps it grew, placed on the signal's readings (what a chart draws dashed): from
    ``(x0, y0)`` to ``(x1, y1)``, steps against bytes."""

    signal: str  # the column tested, ``allocated_bytes`` say
    x0: float
    x1: float
    y0: float
    y1: float


# -- forecast -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Severity:
    """How urgent an OOM forecast is: ``level`` is one of ``high``, ``medium``, ``low``; ``why`` says it for people
    (:func:`vramscope.analysis.verdicts.forecast_severity`)."""

    level: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "why": self.why}


@dataclass(frozen=True)
class OomForecast:
    """Steps and seconds until the leak takes the peak to the capacity; None where not predictable."""

    steps_to_oom: float | None
    seconds_to_oom: float | None
    capacity_bytes: int | None
    current_peak_bytes: int | None
    headroom_bytes: int | None
    slope_bytes_per_step: float | None
    seconds_per_step: float | None
    reason: str
    slope_bytes_per_second: float | None = None  # a log without steps: the leak's growth per second

    def to_json(self) -> Json:
        return {
            "steps_to_oom": self.steps_to_oom,
            "seconds_to_oom": self.seconds_to_oom,
            "capacity_bytes": self.capacity_bytes,
            "current_peak_bytes": self.current_peak_bytes,
            "headroom_bytes": self.headroom_bytes,
            "slope_bytes_per_step": self.slope_bytes_per_step,
            "seconds_per_step": self.seconds_per_step,
            "slope_bytes_per_second": self.slope_bytes_per_second,
            "reason": self.reason,
        }

    def to_dict(self) -> Json:
        return self.to_json()


@dataclass(frozen=True)
class LongestBatch:
    """Peak against batch tokens, and what the longest batch will need (a fit, or why there is none)."""

    available: bool
    reason: str
    points: int = 0
    bytes_per_token: float | None = None
    base_bytes: float | None = None  # the fitted peak at zero tokens (weights, optimizer, ...)
    tokens_seen_max: int | None = None
    peak_at_seen_max_bytes: int | None = None  # the measured peak of the longest batch seen so far
    max_tokens: int | None = None  # the longest batch the run can see (given, or the longest seen)
    predicted_peak_bytes: float | None = None
    capacity_bytes: int | None = None
    max_tokens_that_fit: int | None = None
    at_risk: bool = False
    warning: str | None = None
    brief: bool = False  # nothing to fit at all (no counts, no peaks): only available/reason/at_risk/warning

    def to_json(self) -> Json:
        if self.brief:
            return {"available": self.available, "reason": self.reason, "at_risk": self.at_risk,
                    "warning": self.warning}
        return {
            "available": self.available,
            "reason": self.reason,
            "points": self.points,
            "bytes_per_token": self.bytes_per_token,
            "base_bytes": self.base_bytes,
            "tokens_seen_max": self.tokens_seen_max,
            "peak_at_seen_max_bytes": self.peak_at_seen_max_bytes,
            "max_tokens": self.max_tokens,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "capacity_bytes": self.capacity_bytes,
            "max_tokens_that_fit": self.max_tokens_that_fit,
            "at_risk": self.at_risk,
            "warning": self.warning,
        }

    def to_dict(self) -> Json:
        return self.to_json()


def no_batch_fit(reason: str) -> LongestBatch:
    """A longest-batch forecast that has nothing to fit, for ``reason``."""
    return LongestBatch(available=False, reason=reason, brief=True)


@dataclass(frozen=True)
class OomOutlook:
    """What the log says of running out of memory, in words every renderer shows as they are (the page's card,
    the terminal's line, ``--json``'s ``forecast.outlook``): judged once, by
    :func:`vramscope.analysis.verdicts.oom_outlook`.

    ``kind`` is ``over_capacity`` (the log already holds more than the capacity given), ``at_capacity`` (the
    peak is within the allocator's margin of it), ``leak`` (the leak reaches the capacity: ``headline`` says in
    how many steps or how long), ``longest_batch`` (the longest batch the run can see will not fit), ``none``
    (nothing ahead) or ``unknown`` (no capacity or no reading to tell). ``level`` is the severity's level
    (``high``, ``medium``, ``low``), or None.
    """

    kind: str
    headline: str  # "out of memory in about 4 min", "no OOM ahead", ...
    detail: str  # why, with the numbers
    level: str | None = None
    key: str | None = None  # the device it is about

    @property
    def ahead(self) -> bool:
        """An OOM is ahead, or already here."""
        return self.kind in ("over_capacity", "at_capacity", "leak", "longest_batch")

    def to_json(self) -> Json:
        return {"kind": self.kind, "headline": self.headline, "detail": self.detail, "level": self.level,
                "key": self.key}


NO_OUTLOOK = OomOutlook("unknown", "no forecast", "the log has no rows")


@dataclass(frozen=True)
class DeviceForecast:
    key: str
    oom: OomForecast
    longest_batch: LongestBatch
    severity: Severity | None = None  # how urgent ``oom`` is; None without a time to OOM
    outlook: OomOutlook = NO_OUTLOOK  # what to say of it

    def to_json(self) -> Json:
        return {**self.oom.to_json(), "key": self.key, "longest_batch": self.longest_batch.to_json(),
                "outlook": self.outlook.to_json()}


@dataclass(frozen=True)
class ForecastSummary:
    """The device that runs out first, the most telling longest-batch forecast, and each device's."""

    soonest: DeviceForecast | None  # None: the log has no rows
    longest_batch: LongestBatch
    devices: dict[str, DeviceForecast]
    outlook: OomOutlook = NO_OUTLOOK  # the one the report leads with: the soonest OOM, else a batch at risk

    def to_json(self) -> Json:
        if self.soonest is None:
            out: Json = {"steps_to_oom": None, "seconds_to_oom": None}
        else:
            out = {**self.soonest.oom.to_json(), "key": self.soonest.key}
        out["outlook"] = self.outlook.to_json()
        out["longest_batch"] = self.longest_batch.to_json()
        out["devices"] = {k: f.to_json() for k, f in self.devices.items()}
        return out


# -- what a report reads of each device -----------------------------------------------------------------


@dataclass(frozen=True)
class PhaseStretch:
    """Consecutive rows of one device in one phase: its rows ``start`` up to ``end`` (exclusive)."""

    phase: str
    start: int
    end: int


@dataclass(frozen=True)
class PhasePeaks:
    """A phase's rows on a device and the peak of each memory column within them."""

    rows: int
    peaks: dict[str, PeakAt]  # by column, in the order of :data:`vramscope.analysis.details.METRICS`

    def report_json(self) -> Json:
        return {"rows": self.rows, **{m: p.report_json() for m, p in self.peaks.items()}}


@dataclass(frozen=True)
class AtPeakReserved:
    reserved_bytes: int
    demand_bytes: int
    unused_bytes: int
    unused_fraction: float | None
    step: int | None


@dataclass(frozen=True)
class Fragmentation:
    """Reserved memory that no tensor used: the allocator's cache beyond demand, partly split and unusable."""

    measured_against: str  # "peak_allocated_bytes" or "allocated_bytes"
    at_peak_reserved: AtPeakReserved
    demand_over_reserved: float | None
    unused_trend_bytes_per: str  # "step" or "s"
    unused_trend: float | None  # bytes per step (or second) of the gap's trend; None: too short to tell
    inactive_split_max_bytes: int | None
    inactive_split_last_bytes: int | None
    has_inactive_split: bool  # the log has the column at all
    alloc_retries: int | None
    ooms: int | None
    verdict: str

    def to_json(self) -> Json:
        at = self.at_peak_reserved
        out: Json = {
            "measured_against": self.measured_against,
            "at_peak_reserved": {"reserved_bytes": at.reserved_bytes, "demand_bytes": at.demand_bytes,
                                 "unused_bytes": at.unused_bytes, "unused_fraction": at.unused_fraction,
                                 "step": at.step},
            "demand_over_reserved": self.demand_over_reserved,
            "unused_trend_bytes_per": self.unused_trend_bytes_per,
            "unused_trend": self.unused_trend,
        }
        if self.has_inactive_split:
            out["inactive_split_max_bytes"] = self.inactive_split_max_bytes
            out["inactive_split_last_bytes"] = self.inactive_split_last_bytes
        out["alloc_retries"] = self.alloc_retries
        out["ooms"] = self.ooms
        out["verdict"] = self.verdict
        return out


@dataclass(frozen=True)
class BatchPeak:
    """One of the longest batches: its step, tokens and peak."""

    row: int  # the row of the table
    step: int | None
    tokens: int
    peak_allocated_bytes: int | None
    phase: str
    since_start_s: float | None

    def to_json(self) -> Json:
        since = None if self.since_start_s is None else round(self.since_start_s, 3)
        return {"step": self.step, "tokens": self.tokens, "peak_allocated_bytes": self.peak_allocated_bytes,
                "phase": self.phase, "elapsed_s": since}


@dataclass(frozen=True)
class Headroom:
    capacity_bytes: int | None
    peak_used_bytes: int | None
    headroom_bytes: int | None
    headroom_fraction: float | None
    # How tight the headroom is ("high", "medium", "low": analysis.verdicts.headroom_level); None: no headroom known.
    # Judged here for the renderers, which only colour it; not in the JSON, whose fraction says the same.
    level: str | None = None

    def to_json(self) -> Json:
        return {"capacity_bytes": self.capacity_bytes, "peak_used_bytes": self.peak_used_bytes,
                "headroom_bytes": self.headroom_bytes, "headroom_fraction": self.headroom_fraction}


@dataclass(frozen=True)
class DeviceDetail:
    """What a report reads of one device beyond the verdicts: its rows, phases and every column's peak."""

    key: str
    rows: int
    table_rows: slice | np.ndarray  # the device's rows of the table: a slice (all, or an interleave) or positions
    step_range: tuple[int, int] | None  # the first and last known step; None: no step logged
    stretches: tuple[PhaseStretch, ...]  # the device's rows, cut where the phase changes
    peaks: dict[str, PeakAt]  # each memory column's peak, first of equals
    phases: dict[str, PhasePeaks]  # in order of each phase's first row
    capacity_bytes: int | None  # the memory the device is held against (``--gpu-memory``, else its total)
    capacity_given: bool  # ``capacity_bytes`` was given, not logged
    total_logged: bool  # the log has the device's total
    headroom: Headroom
    fragmentation: Fragmentation | None
    longest_batches: tuple[BatchPeak, ...]
    batch_metric: str | None  # the column a batch's peak is read from
    batches_note: str | None = None  # why some of the longest batches have no peak; None when all have one
    idle: str | None = None  # why this run counts the device as idle (then it gets no advice); None: it was used

    @property
    def gpu(self) -> int | None:
        return None if self.key == "host" else int(self.key)

    @property
    def title(self) -> str:
        return "host (no GPU in the log)" if self.key == "host" else f"GPU {self.key}"


@dataclass(frozen=True)
class RankPeak:
    rank: int
    rows: int
    gpus: tuple[int, ...]
    peaks: dict[str, int | None]  # "peak_allocated_bytes", "peak_reserved_bytes", ...
    peak_step: int | None  # the step of the allocator's peak

    def to_json(self) -> Json:
        out: Json = {"rank": self.rank, "rows": self.rows, "gpus": list(self.gpus)}
        for name, value in self.peaks.items():
            out[name] = value
            if name == "peak_allocated_bytes":
                out["peak_step"] = self.peak_step
        return out


@dataclass(frozen=True)
class RankImbalance:
    """Each rank's peaks (rank 0's log of a distributed run gathers every rank) and ``max/min - 1`` of one."""

    ranks: tuple[RankPeak, ...]
    metric: str  # the peak compared: "peak_allocated_bytes", ... ("" when no peak is known on every rank)
    imbalance: float | None
    notable: bool = False  # large enough to look at (analysis.verdicts.imbalance_notable); drawn, not in the JSON


# -- the whole analysis -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRange:
    count: int  # distinct known steps
    first: int | None
    last: int | None

    @property
    def logged(self) -> int | None:
        """How many steps the log spans (at least 1); None without steps."""
        return None if self.first is None or self.last is None else max(1, self.last - self.first + 1)

    def to_json(self) -> Json:
        return {"count": self.count, "first": self.first, "last": self.last}


@dataclass(frozen=True)
class DeviceAnalysis:
    """Everything found on one device."""

    key: str
    peak: DevicePeak
    leak: DeviceLeak
    forecast: DeviceForecast
    detail: DeviceDetail


@dataclass(frozen=True)
class AnalysisResult:
    """One analysis of a log: see docs/leak-detection.md for the JSON of :meth:`to_json`."""

    rows: int
    steps: StepRange
    duration_s: float | None  # the logged seconds' range
    leak: LeakSummary
    peak: PeakSummary
    forecast: ForecastSummary
    devices: tuple[DeviceAnalysis, ...]  # in order of each device's first row
    warnings: tuple[str, ...]
    ranks: RankImbalance | None = None  # a log of several ranks: each rank's peaks
    phases: tuple[str, ...] = ()  # the logged phases' names, in order of first appearance
    start: str | None = None  # the first row's time, as logged
    clock_duration_s: float | None = None  # from the first to the last row's time (else logged seconds)

    @property
    def keys(self) -> list[str]:
        return [d.key for d in self.devices]

    def device(self, key: str) -> DeviceAnalysis:
        return next(d for d in self.devices if d.key == key)

    def to_json(self) -> Json:
        return {
            "rows": self.rows,
            "steps": self.steps.to_json(),
            "duration_s": self.duration_s,
            "leak": self.leak.to_json(),
            "peak": self.peak.to_json(),
            "forecast": self.forecast.to_json(),
            "devices": self.keys,
            "warnings": list(self.warnings),
        }
