"""Moved to :mod:`vramscope.advice.log` (issue 15). This shim keeps the old path and its dict results for
:mod:`vramscope.report.model` until the report holds :class:`vramscope.advice.Advice` itself (from
:func:`vramscope.advice.log.advise_run_result`)."""

from __future__ import annotations

from typing import Any

from vramscope.advice import log_summary
from vramscope.advice.log import RunSettings

__all__ = ["RunSettings", "advise", "planner_advice"]


def advise(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """:func:`vramscope.advice.log_summary.advise`, each as its JSON dict (:meth:`Advice.to_dict`)."""
    return [a.to_dict() for a in log_summary.advise(summary)]


def planner_advice(summary: dict[str, Any], settings: RunSettings) -> list[dict[str, Any]]:
    """:func:`vramscope.advice.log_summary.planner_advice`, each as its JSON dict."""
    return [a.to_dict() for a in log_summary.planner_advice(summary, settings)]
