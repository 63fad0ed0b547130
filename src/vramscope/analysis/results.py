"""What the analysis of a memory log finds, as typed results: computed once in :mod:`vramscope.analysis`,
read by the report, the live monitor and the CLI; turned into a dict only at the JSON edge (``to_json``).

The JSON is the one ``vramscope report --json`` prints (it carries :data:`SCHEMA_VERSION`) and the one
``MemoryMonitor.analysis()`` returns; docs/leak-detection.md lists its keys. Every number is bytes,
steps or seconds; None means unknown. The leak's results are in :mod:`~vramscope.analysis.results_leak`, the
forecast's in :mod:`~vramscope.analysis.results_forecast`; both are imported from here as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vramscope.analysis.results_forecast import (
    NO_OUTLOOK,
    DeviceForecast,
    ForecastSummary,
    LongestBatch,
    OomForecast,
    OomOutlook,
    Severity,
    no_batch_fit,
)
from vramscope.analysis.results_json import Json
from vramscope.analysis.results_leak import Caching, DeviceLeak, LeakSummary, TrendLine

__all__ = [
    "NO_OUTLOOK", "SCHEMA_VERSION", "AnalysisResult", "AtPeakReserved", "BatchPeak", "Caching", "DeviceAnalysis",
    "DeviceDetail", "DeviceForecast", "DeviceLeak", "DevicePeak", "ForecastSummary", "Fragmentation", "Headroom",
    "Json", "LeakSummary", "LongestBatch", "OomForecast", "OomOutlook", "PeakAt", "PeakSummary", "PhasePeaks",
    "PhaseStretch", "RankImbalance", "RankPeak", "Severity", "StepRange", "TrendLine", "no_batch_fit",
]

# The version of the JSON of a report (``report --json``): raised when a field changes meaning or goes.
SCHEMA_VERSION = 1


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
