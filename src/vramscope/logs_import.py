"""Moved to :mod:`vramscope.logs.imports` and :mod:`vramscope.logs.mapping` (issue 15); this shim goes once every
import is rewritten."""

from vramscope.logs.imports import *  # noqa: F403
from vramscope.logs.mapping import *  # noqa: F403
