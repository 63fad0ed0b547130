"""vramscope: watch, explain and plan the GPU memory of QLoRA/LoRA fine-tuning.

Importing vramscope needs no GPU, no NVIDIA driver and no torch: everything that needs one of those
is imported lazily, on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from vramscope.sampler import Collector, Sampler
from vramscope.types import AllocatorReading, GpuReading, HostReading, ProcessGpuReading, Sample

__version__ = "0.1.0"

# Public names that live in modules with heavier imports; resolved on first access.
_LAZY = {
    "MemoryMonitor": "vramscope.integrations.loop",
    "find_max_batch_size": "vramscope.tuner",
    "plan": "vramscope.planner",
    "summary": "vramscope.integrations.breakdown",
}

__all__ = [
    "AllocatorReading",
    "Collector",
    "GpuReading",
    "HostReading",
    "ProcessGpuReading",
    "Sample",
    "Sampler",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    return getattr(import_module(module), name)
