"""Moved to :mod:`vramscope.logs.csv_sink` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.csv_sink import *  # noqa: F403
