"""Public path: ``from vramscope.integrations.loop import MemoryMonitor`` (a hand-written training loop).

The monitor lives in :mod:`vramscope.training.monitor`, its parts in :mod:`vramscope.training`; this module
only re-exports them, so that users' imports keep working. It is meant to stay.
"""

from __future__ import annotations

from vramscope.training.gather import GATHER_FIELDS
from vramscope.training.hooks import batch_tokens
from vramscope.training.monitor import MemoryMonitor
from vramscope.training.outputs import LEAK_HINT
from vramscope.training.ranks import beside, current_rank, rank_path
from vramscope.training.settings import MonitorSettings

__all__ = ["GATHER_FIELDS", "LEAK_HINT", "MemoryMonitor", "MonitorSettings", "batch_tokens", "beside", "current_rank",
           "rank_path"]
