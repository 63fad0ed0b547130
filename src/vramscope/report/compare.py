"""Several logs side by side: the same figures for each, with the change against the first log.

The usual question is "what did this change buy me" (gradient checkpointing on, a smaller batch, an
8-bit optimizer), so the first log is the baseline and every other column says how far it moved.
Figures over several GPUs are the largest of them (the GPU that runs out first decides).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vramscope.report.figures import analysis_of, leak_kind, soonest_oom
from vramscope.report.model import LogReport
from vramscope.units import MIB, gib

Getter = Callable[[LogReport], float | int | str | None]


def _device_max(metric: str) -> Callable[[LogReport], int | None]:
    def get(report: LogReport) -> int | None:
        values = [((d.get("peaks") or {}).get(metric) or {}).get("bytes") for d in report.summary["devices"].values()]
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return get


def _peak_allocated(report: LogReport) -> int | None:
    return _device_max("peak_allocated_bytes")(report) or _device_max("allocated_bytes")(report)


def _headroom(report: LogReport) -> int | None:
    devices = report.summary["devices"].values()
    known = [d["headroom_bytes"] for d in devices if d.get("headroom_bytes") is not None]
    return min(known) if known else None


def _unused(report: LogReport) -> int | None:
    known = [((d.get("fragmentation") or {}).get("at_peak_reserved") or {}).get("unused_bytes")
             for d in report.summary["devices"].values()]
    values = [v for v in known if v is not None]
    return max(values) if values else None


def _steps(report: LogReport) -> int | None:
    return analysis_of(report).steps.count or None


def _leak(report: LogReport) -> str:
    leak = analysis_of(report).leak
    if leak.worst is not None and leak.detected:
        slope = leak.worst.slope_bytes_per_step
        return f"leak, {slope / MIB:.2f} MiB/step" if slope is not None else "leak"
    return leak_kind(leak) or "none"


def _oom(report: LogReport) -> float | None:
    oom = soonest_oom(analysis_of(report))
    return None if oom is None or oom.steps_to_oom is None else float(oom.steps_to_oom)


def _longest(report: LogReport) -> int | None:
    devices = report.summary["devices"].values()
    tokens = [b.get("tokens") for d in devices for b in d.get("longest_batches") or []]
    known = [t for t in tokens if t is not None]
    return max(known) if known else None


# (label, unit, which way is better, getter); unit "bytes", "s", "count" or "text"; better "lower",
# "higher" or None (a fact, neither good nor bad: a longer run is not a worse one).
ROWS: list[tuple[str, str, str | None, Getter]] = [
    ("duration", "s", None, lambda r: r.summary["log"].get("duration_s")),
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


def compare(reports: Sequence[LogReport]) -> list[dict[str, Any]]:
    """One row per figure: ``{"figure", "unit", "better", "values": [...], "changes": [None, fraction, ...]}``.

    ``changes[i]`` is log i against the first log as a fraction (-0.3 = 30% less), None where either is
    unknown, zero or not a number; ``better`` says which direction is an improvement ("lower", "higher"
    or None). Rows unknown in every log are left out.
    """
    rows: list[dict[str, Any]] = []
    for label, unit, better, get in ROWS:
        values = [get(r) for r in reports]
        if all(v is None for v in values):
            continue
        base = values[0]
        changes: list[float | None] = [None]
        for v in values[1:]:
            numeric = isinstance(v, (int, float)) and isinstance(base, (int, float)) and unit != "text"
            changes.append(round((v - base) / base, 4) if numeric and base else None)  # type: ignore[operator]
        rows.append({"figure": label, "unit": unit, "better": better, "values": values, "changes": changes})
    return rows


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
