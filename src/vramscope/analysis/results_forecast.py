"""The OOM forecast as typed results (:mod:`vramscope.analysis.results` imports them for its readers): each
device's time to the capacity, its longest batch, what to say of it, and the log's soonest.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.analysis.results_json import Json


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
