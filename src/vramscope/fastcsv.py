"""Moved to :mod:`vramscope.logs.locate` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.locate import *  # noqa: F403
