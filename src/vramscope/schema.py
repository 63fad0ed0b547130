"""Moved to :mod:`vramscope.logs.schema` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.schema import *  # noqa: F403
