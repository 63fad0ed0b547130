"""Predict a QLoRA/LoRA run's GPU memory before it starts: pure functions over config.json fields."""

from __future__ import annotations

from vramscope.planner.errors import PlanInputError, UnknownModelError
from vramscope.planner.registry import get_config

__all__ = ["PlanInputError", "UnknownModelError", "get_config"]
