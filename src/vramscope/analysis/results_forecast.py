"""The OOM forecast as typed results (:mod:`vramscope.analysis.results` imports them for its readers): each
device's time to the capacity, its longest batch, what to say of it, and the log's soonest; each with its
``to_json`` and ``from_json`` (read back from ``<log stem>.analysis.json``; :mod:`vramscope.analysis.results_json`
reads the fields).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vramscope.analysis.results_json import Fields, Json, not_an_analysis


@dataclass(frozen=True)
class Severity:
    """How urgent an OOM forecast is: ``level`` is one of ``high``, ``medium``, ``low``; ``why`` says it for people
    (:func:`vramscope.analysis.verdicts.forecast_severity`)."""

    level: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "why": self.why}

    @classmethod
    def from_json(cls, data: object, where: str = "oom_severity") -> Severity:
        """Raises: AnalysisFileError: not a severity."""
        f = Fields(data, where)
        return cls(f.text("level"), f.text("why"))


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

    @classmethod
    def from_json(cls, data: object, where: str = "forecast") -> OomForecast:
        """The forecast's keys of ``data`` (a device's forecast holds more, which it passes over).

        Raises:
            AnalysisFileError: not a forecast.
        """
        f = Fields(data, where)
        return cls(steps_to_oom=f.number_or_none("steps_to_oom"), seconds_to_oom=f.number_or_none("seconds_to_oom"),
                   capacity_bytes=f.whole_or_none("capacity_bytes"),
                   current_peak_bytes=f.whole_or_none("current_peak_bytes"),
                   headroom_bytes=f.whole_or_none("headroom_bytes"),
                   slope_bytes_per_step=f.number_or_none("slope_bytes_per_step"),
                   seconds_per_step=f.number_or_none("seconds_per_step"), reason=f.text("reason"),
                   slope_bytes_per_second=f.number_or_none("slope_bytes_per_second"))


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

    @classmethod
    def from_json(cls, data: object, where: str = "forecast.longest_batch") -> LongestBatch:
        """A forecast without ``points`` is a brief one (nothing was fitted).

        Raises:
            AnalysisFileError: not a longest-batch forecast.
        """
        f = Fields(data, where)
        brief = cls(available=f.flag("available"), reason=f.text("reason"), at_risk=f.flag("at_risk"),
                    warning=f.text_or_none("warning"), brief=True)
        if not f.has("points"):
            return brief
        return replace(brief, brief=False, points=f.whole("points"),
                       bytes_per_token=f.number_or_none("bytes_per_token"), base_bytes=f.number_or_none("base_bytes"),
                       tokens_seen_max=f.whole_or_none("tokens_seen_max"),
                       peak_at_seen_max_bytes=f.whole_or_none("peak_at_seen_max_bytes"),
                       max_tokens=f.whole_or_none("max_tokens"),
                       predicted_peak_bytes=f.number_or_none("predicted_peak_bytes"),
                       capacity_bytes=f.whole_or_none("capacity_bytes"),
                       max_tokens_that_fit=f.whole_or_none("max_tokens_that_fit"))


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
    def at_capacity(self) -> bool:
        """The log already holds the capacity given, or more (``over_capacity`` or ``at_capacity``)."""
        return self.kind in ("over_capacity", "at_capacity")

    @property
    def ahead(self) -> bool:
        """An OOM is ahead, or already here."""
        return self.at_capacity or self.kind in ("leak", "longest_batch")

    def to_json(self) -> Json:
        return {"kind": self.kind, "headline": self.headline, "detail": self.detail, "level": self.level,
                "key": self.key}

    @classmethod
    def from_json(cls, data: object, where: str = "forecast.outlook") -> OomOutlook:
        """Raises: AnalysisFileError: not an outlook."""
        f = Fields(data, where)
        return cls(f.text("kind"), f.text("headline"), f.text("detail"), f.text_or_none("level"),
                   f.text_or_none("key"))


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

    @classmethod
    def from_json(cls, data: object, where: str = "forecast.devices") -> DeviceForecast:
        """One device's forecast as ``to_json`` wrote it. The file does not keep its severity (None): the
        outlook's ``level`` says it.

        Raises:
            AnalysisFileError: not a device's forecast.
        """
        f = Fields(data, where)
        return cls(key=f.text("key"), oom=OomForecast.from_json(data, where),
                   longest_batch=LongestBatch.from_json(f.raw("longest_batch"), f.at("longest_batch")),
                   outlook=OomOutlook.from_json(f.raw("outlook"), f.at("outlook")))


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

    @classmethod
    def from_json(cls, data: object, where: str = "forecast") -> ForecastSummary:
        """The summary as ``to_json`` wrote it: its soonest device is that device's forecast (the file keeps
        the soonest's own forecast and key, and the device's batch and outlook under ``devices``).

        Raises:
            AnalysisFileError: not a forecast summary, or its soonest device is not among its devices.
        """
        f = Fields(data, where)
        devices = {k: DeviceForecast.from_json(v, f"{f.at('devices')}.{k}") for k, v in f.entries("devices").items()}
        outlook = OomOutlook.from_json(f.raw("outlook"), f.at("outlook"))
        batch = LongestBatch.from_json(f.raw("longest_batch"), f.at("longest_batch"))
        if not f.has("key"):
            for fixed in ("steps_to_oom", "seconds_to_oom"):
                f.raw(fixed)  # a log without rows: its lines are always these
            return cls(None, batch, devices, outlook)
        key = f.text("key")
        if key not in devices:
            raise not_an_analysis(f.at("key"), f"is {key!r}, a device that {f.at('devices')} has not")
        return cls(replace(devices[key], oom=OomForecast.from_json(data, where)), batch, devices, outlook)
