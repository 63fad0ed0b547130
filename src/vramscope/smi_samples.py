"""Moved to :mod:`vramscope.logs.smi_samples` (issue 15); this shim goes once every import is rewritten."""

from vramscope.logs.smi_samples import *  # noqa: F403
