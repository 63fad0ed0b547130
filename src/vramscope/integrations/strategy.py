"""Kept so that old imports still work: the strategy detection is :mod:`vramscope.training.strategy`."""

from __future__ import annotations

from vramscope.training.strategy import STRATEGY_FILE_SUFFIX, detect_strategy

__all__ = ["STRATEGY_FILE_SUFFIX", "detect_strategy"]
