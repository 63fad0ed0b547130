"""Kept so that old imports still work: the memory breakdown is :mod:`vramscope.training.breakdown`."""

from __future__ import annotations

from vramscope.training.breakdown import BreakdownTracker, measure, model_device, summary, with_readings

__all__ = ["BreakdownTracker", "measure", "model_device", "summary", "with_readings"]
