"""Moved to :mod:`vramscope.tune.calibrate` (issue 15: the planner stays pure); this shim keeps the old path
(with the planner names scripts took from it: bench/h200/calibrate_probe.py)."""

from vramscope.planner.api import resolve_model
from vramscope.planner.memory import estimate
from vramscope.tune.calibrate import DEFAULT_SHAPES, CalibrationError, Point, _static, calibrate, fit, measure

__all__ = ["DEFAULT_SHAPES", "CalibrationError", "Point", "_static", "calibrate", "estimate", "fit", "measure",
           "resolve_model"]
