"""What the analysis of a memory log finds, as typed results: computed once in :mod:`vramscope.analysis`,
read by the report, the live monitor and the CLI; turned into a dict only at the JSON edge (``to_json``).

The JSON is the one ``vramscope report --json`` prints (it carries :data:`SCHEMA_VERSION`) and the one
``MemoryMonitor.analysis()`` returns; docs/leak-detection.md lists its keys. Every number is bytes,
steps or seconds; None means unknown.

This module owns the format of ``<log stem>.analysis.json`` (``MemoryMonitor.save_analysis`` writes
``AnalysisResult.to_json``): :meth:`AnalysisResult.from_json` reads the dict back, :func:`read_analysis` the file.
The leak's results are in :mod:`~vramscope.analysis.results_leak`, the forecast's in
:mod:`~vramscope.analysis.results_forecast` (both imported from here as well); the fields are read through
:mod:`~vramscope.analysis.results_json`, whose :class:`AnalysisFileError` every bad file raises.
"""

from __future__ import annotations

import os
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
from vramscope.analysis.results_json import REDO, AnalysisFileError, Fields, Json, device_key, not_an_analysis
from vramscope.analysis.results_leak import Caching, DeviceLeak, LeakSummary, TrendLine
from vramscope.logs.inputfile import FileTooLargeError, NotRegularFileError, read_json_file

__all__ = [
    "ANALYSIS_FILE_LIMIT", "NOT_KEPT_ROW", "NO_OUTLOOK", "SCHEMA_VERSION", "AnalysisFileError", "AnalysisResult",
    "AtPeakReserved", "BatchPeak", "Caching", "DeviceAnalysis", "DeviceDetail", "DeviceForecast", "DeviceLeak",
    "DevicePeak", "ForecastSummary", "Fragmentation", "Headroom", "Json", "LeakSummary", "LongestBatch",
    "OomForecast", "OomOutlook", "PeakAt", "PeakSummary", "PhasePeaks", "PhaseStretch", "RankImbalance", "RankPeak",
    "Severity", "StepRange", "TrendLine", "no_batch_fit", "read_analysis",
]

# The version of the JSON of a report (``report --json``): raised when a field changes meaning or goes.
SCHEMA_VERSION = 1

# The row of a peak read back from a file, which does not keep rows (they are the log's, not the analysis').
NOT_KEPT_ROW = -1
# An analysis file is a few kB a device; a file of 16 MiB is something else, not read into memory whole.
ANALYSIS_FILE_LIMIT = 16 << 20


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

    @classmethod
    def from_json(cls, data: object, where: str = "peak.devices.phases", *, phase: str) -> PeakAt:
        """A phase's peak as ``to_json`` wrote it, under the name of its ``phase``. The file keeps neither its
        row (:data:`NOT_KEPT_ROW`) nor its seconds since the start (None).

        Raises:
            AnalysisFileError: not a peak.
        """
        f = Fields(data, where)
        return cls(row=NOT_KEPT_ROW, bytes=f.whole("bytes"), step=f.whole_or_none("step"), phase=phase,
                   time=f.text_or_none("time"), elapsed_s=f.number_or_none("elapsed_s"))

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

    @classmethod
    def from_json(cls, data: object, where: str = "peak.devices") -> DevicePeak:
        """One device's peaks as ``to_json`` wrote them (the rows of the peaks not kept, as in
        :meth:`PeakAt.from_json`).

        Raises:
            AnalysisFileError: not a device's peaks.
        """
        f = Fields(data, where)
        phases = {label: PeakAt.from_json(p, f"{f.at('phases')}.{label}", phase=label)
                  for label, p in f.entries("phases").items()}
        top, step, time, elapsed = (f.whole_or_none("bytes"), f.whole_or_none("step"), f.text_or_none("time"),
                                    f.number_or_none("elapsed_s"))
        phase = f.text_or_none("phase")
        at = None
        if top is not None:
            if phase is None:
                raise not_an_analysis(f.at("phase"), "is null beside a peak; a peak is read in a phase")
            at = PeakAt(row=NOT_KEPT_ROW, bytes=top, step=step, phase=phase, time=time, elapsed_s=elapsed)
        return cls(key=device_key(f), metric=f.text_or_none("metric"), at=at, phases=phases,
                   max_reserved_bytes=f.whole_or_none("max_reserved_bytes"),
                   max_device_used_bytes=f.whole_or_none("max_device_used_bytes"),
                   max_host_rss_bytes=f.whole_or_none("max_host_rss_bytes"), total_bytes=f.whole_or_none("total_bytes"))


@dataclass(frozen=True)
class PeakSummary:
    devices: dict[str, DevicePeak]
    overall: DevicePeak | None  # the device with the highest peak (the first of equals)

    def to_json(self) -> Json:
        return {"devices": {k: p.to_json() for k, p in self.devices.items()},
                "overall": None if self.overall is None else self.overall.to_json()}

    @classmethod
    def from_json(cls, data: object, where: str = "peak") -> PeakSummary:
        """Raises: AnalysisFileError: not a peak summary."""
        f = Fields(data, where)
        devices = {k: DevicePeak.from_json(v, f"{f.at('devices')}.{k}") for k, v in f.entries("devices").items()}
        overall = f.raw("overall")
        return cls(devices, None if overall is None else DevicePeak.from_json(overall, f.at("overall")))


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

    @classmethod
    def from_json(cls, data: object, where: str = "devices.fragmentation") -> Fragmentation:
        """The fragmentation as ``to_json`` wrote it (in ``report --json``'s devices); without the inactive split
        lines the log had no such column.

        Raises:
            AnalysisFileError: not a fragmentation.
        """
        f = Fields(data, where)
        at = Fields(f.raw("at_peak_reserved"), f.at("at_peak_reserved"))
        split = f.has("inactive_split_max_bytes")
        return cls(measured_against=f.text("measured_against"),
                   at_peak_reserved=AtPeakReserved(at.whole("reserved_bytes"), at.whole("demand_bytes"),
                                                   at.whole("unused_bytes"), at.number_or_none("unused_fraction"),
                                                   at.whole_or_none("step")),
                   demand_over_reserved=f.number_or_none("demand_over_reserved"),
                   unused_trend_bytes_per=f.text("unused_trend_bytes_per"),
                   unused_trend=f.number_or_none("unused_trend"),
                   inactive_split_max_bytes=f.whole_or_none("inactive_split_max_bytes") if split else None,
                   inactive_split_last_bytes=f.whole_or_none("inactive_split_last_bytes") if split else None,
                   has_inactive_split=split, alloc_retries=f.whole_or_none("alloc_retries"),
                   ooms=f.whole_or_none("ooms"), verdict=f.text("verdict"))


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

    @classmethod
    def from_json(cls, data: object, where: str = "devices.longest_batches") -> BatchPeak:
        """A batch as ``to_json`` wrote it: its row not kept (:data:`NOT_KEPT_ROW`), its seconds since the start
        rounded to the millisecond.

        Raises:
            AnalysisFileError: not a batch.
        """
        f = Fields(data, where)
        return cls(row=NOT_KEPT_ROW, step=f.whole_or_none("step"), tokens=f.whole("tokens"),
                   peak_allocated_bytes=f.whole_or_none("peak_allocated_bytes"), phase=f.text("phase"),
                   since_start_s=f.number_or_none("elapsed_s"))


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

    @classmethod
    def from_json(cls, data: object, where: str = "devices") -> Headroom:
        """The headroom's keys of ``data`` (a device of ``report --json`` holds them among its others). The JSON
        does not keep ``level`` (None): its fraction says the same.

        Raises:
            AnalysisFileError: not a headroom.
        """
        f = Fields(data, where)
        return cls(f.whole_or_none("capacity_bytes"), f.whole_or_none("peak_used_bytes"),
                   f.whole_or_none("headroom_bytes"), f.number_or_none("headroom_fraction"))


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

    @classmethod
    def not_kept(cls, key: str) -> DeviceDetail:
        """The detail of a device read back from an analysis file, which keeps none of it: no rows, phases,
        column peaks, headroom, fragmentation or batches (analyse the log again for them)."""
        return cls(key=key, rows=0, table_rows=slice(0, 0), step_range=None, stretches=(), peaks={}, phases={},
                   capacity_bytes=None, capacity_given=False, total_logged=False,
                   headroom=Headroom(None, None, None, None), fragmentation=None, longest_batches=(),
                   batch_metric=None)


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

    @classmethod
    def from_json(cls, data: object, where: str = "ranks") -> RankPeak:
        """A rank as ``to_json`` wrote it (``report --json``'s ``ranks``): every key beside its rank, rows, GPUs
        and ``peak_step`` is one of its peaks, in the file's order.

        Raises:
            AnalysisFileError: not a rank's peaks.
        """
        f = Fields(data, where)
        own = ("rank", "rows", "gpus", "peak_step")
        peaks = {name: f.whole_or_none(name) for name in f.names() if name not in own}
        step = f.whole_or_none("peak_step") if "peak_allocated_bytes" in peaks else None
        return cls(f.whole("rank"), f.whole("rows"), f.wholes("gpus"), peaks, step)


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

    @classmethod
    def from_json(cls, data: object, where: str = "steps") -> StepRange:
        """Raises: AnalysisFileError: not a step range."""
        f = Fields(data, where)
        return cls(f.whole("count"), f.whole_or_none("first"), f.whole_or_none("last"))


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

    @classmethod
    def from_json(cls, data: object) -> AnalysisResult:
        """The analysis as :meth:`to_json` wrote it (``<log stem>.analysis.json``, ``MemoryMonitor.analysis()``):
        written again, it is the same JSON.

        What the file does not keep reads back empty, so that a reader knows not to trust it: each device's
        detail (:meth:`DeviceDetail.not_kept`), the ranks (None), the phases' names (``()``), the start and the
        clock's duration (None), the forecast's severity (None), a leak's trend line (None), the rows of the
        peaks (:data:`NOT_KEPT_ROW`); see each part's ``from_json``. A device's leak test without a slope or a
        start is read as over steps when the log has steps, else over seconds.

        Raises:
            AnalysisFileError: not an analysis (not an object, a key missing that ``to_json`` always writes, a
                value of the wrong type, a device named in ``devices`` without its leak, peak or forecast).
        """
        f = Fields(data, "")
        steps = StepRange.from_json(f.raw("steps"))
        leak = LeakSummary.from_json(f.raw("leak"), unit="step" if steps.first is not None else "s")
        peak = PeakSummary.from_json(f.raw("peak"))
        forecast = ForecastSummary.from_json(f.raw("forecast"))
        devices = []
        for key in f.texts("devices"):
            parts = (leak.devices, "leak"), (peak.devices, "peak"), (forecast.devices, "forecast")
            missing = [name for found, name in parts if key not in found]
            if missing:
                raise not_an_analysis("devices", f"names {key!r}, which {missing[0]}.devices has not")
            devices.append(DeviceAnalysis(key, peak.devices[key], leak.devices[key], forecast.devices[key],
                                          DeviceDetail.not_kept(key)))
        return cls(rows=f.whole("rows"), steps=steps, duration_s=f.number_or_none("duration_s"), leak=leak,
                   peak=peak, forecast=forecast, devices=tuple(devices), warnings=f.texts("warnings"))


def read_analysis(path: str | os.PathLike[str]) -> AnalysisResult:
    """The analysis in ``path`` (``runs/mem.analysis.json`` beside ``runs/mem.csv``: the suffix is
    ``output.names.ANALYSIS_SUFFIX``), read bounded as every side file is: a regular file (never a FIFO or a
    device, which could block or never end) of at most :data:`ANALYSIS_FILE_LIMIT` bytes.

    Raises:
        AnalysisFileError: missing, unreadable, not JSON, or not an analysis; one line that says what to do.
    """
    shown = os.fspath(path)
    try:
        data = read_json_file(path, "an analysis file", ANALYSIS_FILE_LIMIT)
    except (NotRegularFileError, FileTooLargeError) as exc:  # /dev/zero, a FIFO, a huge file: said in one line
        raise AnalysisFileError(str(exc)) from None
    except IsADirectoryError:
        raise AnalysisFileError(f"{shown} is a folder, not a file; give the path of an analysis file") from None
    except FileNotFoundError:
        raise AnalysisFileError(f"{shown}: no such file; the monitor writes it beside its log at the end "
                                "(runs/mem.csv -> runs/mem.analysis.json)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AnalysisFileError(f"{shown} cannot be read as JSON ({type(exc).__name__}); {REDO}") from None
    try:
        return AnalysisResult.from_json(data)
    except AnalysisFileError as exc:
        raise AnalysisFileError(f"{shown}: {exc}") from None
