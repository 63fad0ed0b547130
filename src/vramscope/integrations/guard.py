"""Kept so that old imports still work: the callback guard is :mod:`vramscope.training.guard`."""

from __future__ import annotations

from vramscope.training.guard import never_stops_training

__all__ = ["never_stops_training"]
