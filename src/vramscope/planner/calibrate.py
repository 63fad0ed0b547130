"""Moved to :mod:`vramscope.tune.calibrate` (issue 15: the planner stays pure); this shim keeps the old path."""

from vramscope.tune.calibrate import DEFAULT_SHAPES, CalibrationError, Point, _static, calibrate, fit, measure

__all__ = ["DEFAULT_SHAPES", "CalibrationError", "Point", "_static", "calibrate", "fit", "measure"]
