"""The log advice's facts taken from the report's summary dict (:func:`vramscope.report.model.build_report`), for
the report until it hands :func:`vramscope.advice.log.advise_run_result` its typed analysis; then this module goes.
"""

from __future__ import annotations

from typing import Any

from vramscope.advice.log import DeviceFacts, RunSettings, advise_devices, in_report_order, priced_by_planner
from vramscope.advice.types import Advice


def facts_of_summary(summary: dict[str, Any]) -> list[DeviceFacts]:
    """The facts of each device the run used (the summary's idle devices left out)."""
    leaks = (summary.get("leak") or {}).get("devices") or {}
    forecasts = (summary.get("forecast") or {}).get("devices") or {}
    out = []
    for key, dev in (summary.get("devices") or {}).items():
        if dev.get("idle"):  # the run did not use this GPU: nothing to change there
            continue
        leak = leaks.get(key) or {}
        forecast = forecasts.get(key) or {}
        lb = forecast.get("longest_batch") or {}
        frag = dev.get("fragmentation") or {}
        at = frag.get("at_peak_reserved") or {}
        out.append(DeviceFacts(
            key=key, where=dev.get("title") or key, leak_detected=bool(leak.get("detected")),
            leak_verdict=leak.get("verdict", "memory grows step after step"),
            leak_growth_bytes=leak.get("growth_bytes"), steps_to_oom=forecast.get("steps_to_oom"),
            phase_peaks={phase: {m: (p.get("bytes"), p.get("step")) for m, p in peaks.items() if isinstance(p, dict)}
                         for phase, peaks in (dev.get("phases") or {}).items()},
            peaks={m: (p or {}).get("bytes") for m, p in (dev.get("peaks") or {}).items()},
            capacity_bytes=dev.get("capacity_bytes"), headroom_bytes=dev.get("headroom_bytes"),
            headroom_fraction=dev.get("headroom_fraction"),
            unused_bytes=at.get("unused_bytes"), unused_fraction=at.get("unused_fraction"),
            unused_growing=(frag.get("unused_trend") or 0) > 0 and frag.get("unused_trend_bytes_per") is not None,
            alloc_retries=frag.get("alloc_retries") or 0,
            batch_at_risk=bool(lb.get("at_risk")), batch_warning=lb.get("warning"),
            bytes_per_token=lb.get("bytes_per_token"), tokens_seen_max=lb.get("tokens_seen_max"),
            batch_tokens=tuple(b["tokens"] for b in dev.get("longest_batches") or [] if b.get("tokens")),
        ))
    return out


def advise(summary: dict[str, Any]) -> list[Advice]:
    """:func:`vramscope.advice.log.advise_devices` over the summary's devices."""
    return advise_devices(facts_of_summary(summary))


def planner_advice(summary: dict[str, Any], settings: RunSettings) -> list[Advice]:
    """:func:`vramscope.advice.log.priced_by_planner` over the summary's devices."""
    return priced_by_planner(facts_of_summary(summary), settings)


def advise_run(summary: dict[str, Any], settings: RunSettings | None = None) -> list[Advice]:
    """:func:`vramscope.advice.log.in_report_order` over the summary's devices."""
    facts = facts_of_summary(summary)
    return in_report_order(advise_devices(facts), None if settings is None else priced_by_planner(facts, settings))
