"""Public path: ``from vramscope.integrations.hf import MemoryMonitorCallback`` (the README's, docs', examples').

The Hugging Face ``Trainer`` callback lives in :mod:`vramscope.training.hf`, beside the monitor it drives;
this module only re-exports it, so that users' imports keep working. It is meant to stay.
"""

from __future__ import annotations

from vramscope.training.hf import INSTALL_HINT, PEAK_FIGURES, MemoryMonitorCallback, prometheus_address

__all__ = ["INSTALL_HINT", "PEAK_FIGURES", "MemoryMonitorCallback", "prometheus_address"]
