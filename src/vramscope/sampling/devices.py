"""Which NVML GPU an allocator reading is on, and back: the one rule for joining the two.

NVML numbers the machine's GPUs; torch numbers the ones its process can see (after
``CUDA_VISIBLE_DEVICES``), so ``GpuReading.index`` and ``AllocatorReading.device`` differ as soon as a
launcher gives each rank one GPU (rank 3 sees its GPU 3 as ``cuda:0``). Both backends read the GPU's
UUID, which does not change; the indexes are compared only where a UUID is missing on the side being
matched or on every reading of the other side (an old driver, a torch without ``uuid`` in its device
properties), which is right unless ``CUDA_VISIBLE_DEVICES`` reorders the devices.
"""

from __future__ import annotations

from collections.abc import Iterable

from vramscope.types import AllocatorReading, GpuReading


def allocator_of(gpu: GpuReading, allocator: Iterable[AllocatorReading]) -> AllocatorReading | None:
    """The allocator reading of ``gpu`` (this process's torch view of that GPU), or None."""
    readings = tuple(allocator)
    if gpu.uuid is not None:
        found = next((r for r in readings if r.uuid == gpu.uuid), None)
        if found is not None or any(r.uuid is not None for r in readings):
            return found
    return next((r for r in readings if r.device == gpu.index), None)


def gpu_of(reading: AllocatorReading, gpus: Iterable[GpuReading]) -> GpuReading | None:
    """The NVML reading of the GPU that ``reading`` was taken on, or None."""
    readings = tuple(gpus)
    if reading.uuid is not None:
        found = next((g for g in readings if g.uuid == reading.uuid), None)
        if found is not None or any(g.uuid is not None for g in readings):
            return found
    return next((g for g in readings if g.index == reading.device), None)
