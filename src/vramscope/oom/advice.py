"""Moved to :mod:`vramscope.advice.oom` (issue 15); this shim keeps the old import path."""

from vramscope.advice.oom import advise, merge_advice, planner_advice, rank_advice

__all__ = ["advise", "merge_advice", "planner_advice", "rank_advice"]
