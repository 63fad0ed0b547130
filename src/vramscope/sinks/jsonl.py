"""Moved to :mod:`vramscope.logs.jsonl_sink` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.jsonl_sink import *  # noqa: F403
