"""Predict a QLoRA/LoRA run's GPU memory before it starts: pure functions over config.json fields.

``plan(model, batch_size, seq_len, spec)`` returns a :class:`Plan` (three totals and a breakdown);
``recommend(...)`` ranks ways to use less memory; ``plan(..., run=RunPhases(trainer="dpo", eval_batch=8))`` plans
the whole run, phase by phase (:mod:`vramscope.planner.phases`). Nothing here imports torch except the trace
(:mod:`vramscope.planner.trace`, on fake tensors); the calibration on a real GPU is :mod:`vramscope.tune.calibrate`
and the reading of a training command is :mod:`vramscope.commands`.
"""

from __future__ import annotations

from vramscope.planner.api import Plan, Recommendation, max_batch_size, max_seq_len, plan, recommend, resolve_model
from vramscope.planner.errors import PlanInputError, UnknownModelError
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate
from vramscope.planner.phases import PhasePeak, RunPhases, RunPlan, plan_run
from vramscope.planner.registry import get_config
from vramscope.planner.shapes import ModelShape, load_config_file, shape_from_config

__all__ = [
    "Breakdown",
    "Estimate",
    "Hardware",
    "ModelShape",
    "PhasePeak",
    "Plan",
    "PlanInputError",
    "Recommendation",
    "RunPhases",
    "RunPlan",
    "UnknownModelError",
    "estimate",
    "get_config",
    "load_config_file",
    "max_batch_size",
    "max_seq_len",
    "plan",
    "plan_run",
    "recommend",
    "resolve_model",
    "shape_from_config",
]
