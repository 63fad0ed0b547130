"""Advice: one :class:`Advice` type, built from an OOM record, a log's analysis or a plan.

* :mod:`~vramscope.advice.types`: :class:`Advice` and the two orders it is ranked in.
* :mod:`~vramscope.advice.oom`: from an OOM's facts (:class:`vramscope.analysis.oom.OomReport`): vramscope's rules
  over the measured numbers (a tuple of rule functions), the planner's changes fed with them, and the two merged.
* :mod:`~vramscope.advice.log`: from a log's analysis: rules over what the log shows, and the planner's changes
  when the user says what ran (:class:`RunSettings`).
* :mod:`~vramscope.advice.plan`: from a plan: the planner's recommendations as :class:`Advice`.

Only the type is imported here; the builders are imported by their module path, as they import the floors they
read (the analysis, the planner). The post-mortem (:mod:`vramscope.oom`) and the report, a floor above, put the
advice beside what it is about.
"""

from __future__ import annotations

from vramscope.advice.types import SOURCES, Advice, rank_by_sufficiency, rank_by_urgency

__all__ = ["SOURCES", "Advice", "rank_by_sufficiency", "rank_by_urgency"]
