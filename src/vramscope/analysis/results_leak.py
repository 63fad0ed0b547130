"""The leak test's verdicts as typed results (:mod:`vramscope.analysis.results` imports them for its readers):
each device's, with what the allocator's cache did and the trend line a chart draws, and the log's most telling
one. The two verdicts have a ``to_json`` and its ``from_json`` (read back from ``<log stem>.analysis.json``;
:mod:`vramscope.analysis.results_json` reads the fields).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.analysis.results_json import Fields, Json, device_key, not_an_analysis


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

    @classmethod
    def from_json(cls, data: object, where: str = "leak.devices", unit: str = "step") -> DeviceLeak:
        """One device's verdict as ``to_json`` wrote it (``where`` names it in errors).

        The file does not keep the trend line (None), nor, under a caching verdict, the leak test's own kind
        and verdict: both read back as the ones shown. It holds a leak's start step rounded to a whole step.
        Whether the test ran over steps or seconds it says only by a slope or a start: a device without either
        reads back in ``unit``, the log's (``to_json`` writes the two alike).

        Raises:
            AnalysisFileError: not a device's verdict.
        """
        f = Fields(data, where)
        per_step, per_second = f.number_or_none("slope_bytes_per_step"), f.number_or_none("slope_bytes_per_second")
        start_step, start_s = f.whole_or_none("start_step"), f.number_or_none("start_elapsed_s")
        over_seconds = per_second is not None or start_s is not None
        if over_seconds and (per_step is not None or start_step is not None):
            raise not_an_analysis(where, "has a slope or a start both per step and per second")
        if over_seconds or (per_step is None and start_step is None and unit != "step"):
            unit, slope, start = "s", per_second, start_s
        else:
            unit, slope, start = "step", per_step, None if start_step is None else float(start_step)
        kind, verdict = f.text("kind"), f.text("verdict")
        caching = None
        if f.has("reserved_slope_bytes_per_step"):  # written only beside a caching verdict
            caching = Caching(kind, verdict, f.number_or_none("reserved_slope_bytes_per_step"),
                              f.number_or_none("reserved_growth_bytes"))
        return cls(key=device_key(f), detected=f.flag("detected"), kind=kind, verdict=verdict,
                   signal=f.text_or_none("signal"), unit=unit, slope_per_x=slope, start_x=start,
                   growth_bytes=f.number_or_none("growth_bytes"), z=f.number_or_none("z"), points=f.whole("points"),
                   caching=caching)


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

    @classmethod
    def from_json(cls, data: object, where: str = "leak", unit: str = "step") -> LeakSummary:
        """The summary as ``to_json`` wrote it; ``unit`` as in :meth:`DeviceLeak.from_json`.

        Raises:
            AnalysisFileError: not a leak summary.
        """
        f = Fields(data, where)
        devices = {k: DeviceLeak.from_json(v, f"{f.at('devices')}.{k}", unit) for k, v in f.entries("devices").items()}
        if f.has("key"):
            return cls(DeviceLeak.from_json(data, where, unit), devices)
        for fixed in ("detected", "kind", "verdict", "slope_bytes_per_step", "start_step"):
            f.raw(fixed)  # a log without rows: its lines are always these
        return cls(None, devices)


@dataclass(frozen=True)
class TrendLine:
    """The leak's trend over the steps it grew, placed on the signal's readings (what a chart draws dashed): from
    ``(x0, y0)`` to ``(x1, y1)``, steps against bytes."""

    signal: str  # the column tested, ``allocated_bytes`` say
    x0: float
    x1: float
    y0: float
    y1: float
