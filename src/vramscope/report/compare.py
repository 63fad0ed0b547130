"""Several logs side by side: the same figures for each, with the change against the first log.

The usual question is "what did this change buy me" (gradient checkpointing on, a smaller batch, an
8-bit optimizer), so the first log is the baseline and every other column says how far it moved.
Figures over several GPUs are the largest of them (the GPU that runs out first decides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vramscope.analysis.results import DeviceDetail
from vramscope.report.figures import detail_of, duration_shown, leak_kind, soonest_oom
from vramscope.report.model import LogReport
from vramscope.units import MIB, gib

Getter = Callable[[LogReport], "Value"]


def _details(report: LogReport) -> list[DeviceDetail]:
    return [detail_of(report.result, d.key) for d in report.result.devices]


def _device_max(metric: str) -> Callable[[LogReport], int | None]:
    def get(report: LogReport) -> int | None:
        known = [d.peaks[metric].bytes for d in _details(report) if metric in d.peaks]
        return max(known) if known else None

    return get


def _peak_allocated(report: LogReport) -> int | None:
    return _device_max("peak_allocated_bytes")(report) or _device_max("allocated_bytes")(report)


def _headroom(report: LogReport) -> int | None:
    known = [left for d in _details(report) if (left := d.headroom.headroom_bytes) is not None]
    return min(known) if known else None


def _unused(report: LogReport) -> int | None:
    known = [d.fragmentation.at_peak_reserved.unused_bytes for d in _details(report) if d.fragmentation is not None]
    return max(known) if known else None


def _steps(report: LogReport) -> int | None:
    return report.result.steps.count or None


def _leak(report: LogReport) -> str:
    leak = report.result.leak
    if leak.worst is not None and leak.detected:
        slope = leak.worst.slope_bytes_per_step
        return f"leak, {slope / MIB:.2f} MiB/step" if slope is not None else "leak"
    return leak_kind(leak) or "none"


def _oom(report: LogReport) -> float | None:
    oom = soonest_oom(report.result)
    return None if oom is None or oom.steps_to_oom is None else float(oom.steps_to_oom)


def _longest(report: LogReport) -> int | None:
    tokens = [b.tokens for d in _details(report) for b in d.longest_batches]
    return max(tokens) if tokens else None


# (label, unit, which way is better, getter); unit "bytes", "s", "count" or "text"; better "lower",
# "higher" or None (a fact, neither good nor bad: a longer run is not a worse one).
ROWS: list[tuple[str, str, str | None, Getter]] = [
    ("duration", "s", None, lambda r: duration_shown(r.result)),
    ("steps", "count", None, _steps),
    ("peak device used", "bytes", "lower", _device_max("device_used_bytes")),
    ("peak reserved", "bytes", "lower", _device_max("reserved_bytes")),
    ("peak allocated", "bytes", "lower", _peak_allocated),
    ("peak of the process", "bytes", "lower", _device_max("process_bytes")),
    ("peak host RSS", "bytes", "lower", _device_max("host_rss_bytes")),
    ("headroom at the peak", "bytes", "higher", _headroom),
    ("reserved beyond the peak", "bytes", "lower", _unused),
    ("leak", "text", None, _leak),
    ("steps to OOM", "count", "higher", _oom),
    ("longest batch (tokens)", "count", None, _longest),
]


Value = float | int | str | None


@dataclass(frozen=True)
class Row:
    """One figure across the logs: ``values[i]`` is log i's, ``changes[i]`` log i against the first as a
    fraction (-0.3 = 30% less; None for the first log and where either is unknown, zero or not a number);
    ``better`` says which direction is an improvement ("lower", "higher" or None)."""

    figure: str
    unit: str  # "bytes", "s", "count" or "text"
    better: str | None
    values: tuple[Value, ...]
    changes: tuple[float | None, ...]

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "unit": self.unit, "better": self.better, "values": list(self.values),
                "changes": list(self.changes)}


def compare(reports: Sequence[LogReport]) -> list[Row]:
    """One row per figure of :data:`ROWS`; rows unknown in every log are left out."""
    rows: list[Row] = []
    for label, unit, better, get in ROWS:
        values = tuple(get(r) for r in reports)
        if all(v is None for v in values):
            continue
        base = values[0]
        changes = (None, *(_change(v, base) if unit != "text" else None for v in values[1:]))
        rows.append(Row(label, unit, better, values, changes))
    return rows


def _change(value: Value, base: Value) -> float | None:
    if isinstance(value, (int, float)) and isinstance(base, (int, float)) and base:
        return round((value - base) / base, 4)
    return None


def format_value(value: Any, unit: str) -> str:
    """A figure for people: GiB for bytes, h:mm for durations, thousands separators for counts."""
    if value is None:
        return "?"
    if unit == "bytes":
        return gib(value)
    if unit == "s":
        total = round(value)
        h, rest = divmod(total, 3600)
        m, s = divmod(rest, 60)
        return f"{h}:{m:02d}:{s:02d}"
    if unit == "count":
        return f"{value:,.0f}"
    return str(value)


def format_change(change: float | None) -> str:
    return "" if change is None else f"{change:+.0%}"


def change_tone(change: float | None, better: str | None) -> str | None:
    """"good", "bad" or None (no change, or a figure that is neither)."""
    if not change or better is None:
        return None
    return "good" if (change < 0) == (better == "lower") else "bad"
