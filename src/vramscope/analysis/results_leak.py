"""The leak test's verdicts as typed results (:mod:`vramscope.analysis.results` imports them for its readers):
each device's, with what the allocator's cache did and the trend line a chart draws, and the log's most telling
one.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.analysis.results_json import Json


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
