"""Public path: ``from vramscope.integrations.lightning import MemoryMonitorCallback`` (the README's and docs').

The Lightning callback lives in :mod:`vramscope.training.lightning`, beside the monitor it drives; this
module only re-exports it, so that users' imports keep working. It is meant to stay.
"""

from __future__ import annotations

from vramscope.training.lightning import INSTALL_HINT, PEAK_FIGURES, MemoryMonitorCallback, lightning_batch_tokens

__all__ = ["INSTALL_HINT", "PEAK_FIGURES", "MemoryMonitorCallback", "lightning_batch_tokens"]
