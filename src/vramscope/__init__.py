"""vramscope: watch, explain and plan the GPU memory of QLoRA/LoRA fine-tuning.

Importing vramscope needs no GPU, no NVIDIA driver and no torch: everything that needs one of those
is imported lazily, on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from vramscope.types import AllocatorReading, GpuReading, HostReading, MemoryBreakdown, ProcessGpuReading, Sample

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these resolve lazily (see __getattr__)
    from vramscope.sampling.sampler import Collector as Collector
    from vramscope.sampling.sampler import Sampler as Sampler

__version__ = "0.1.0"

# Public names that live in modules with heavier imports (psutil, NVML, torch); resolved on first access, so
# that reading a log or planning a run imports none of them.
_LAZY = {
    "Collector": "vramscope.sampling.sampler",
    "Sampler": "vramscope.sampling.sampler",
    "MemoryMonitor": "vramscope.training.monitor",
    "MonitorSettings": "vramscope.training.settings",  # MemoryMonitor(settings=...), and both callbacks'
    "find_max_batch_size": "vramscope.tune.find",
    "plan": "vramscope.planner",
    "report": "vramscope.report",  # vramscope.report(path): a log's typed report (the package is callable too)
    "summary": "vramscope.training.breakdown",
}

__all__ = [
    "AllocatorReading",
    "GpuReading",
    "HostReading",
    "MemoryBreakdown",
    "ProcessGpuReading",
    "Sample",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    return getattr(import_module(module), name)
