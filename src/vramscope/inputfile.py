"""Moved to :mod:`vramscope.logs.inputfile` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.inputfile import *  # noqa: F403
