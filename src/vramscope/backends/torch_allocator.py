"""Readings of torch's CUDA caching allocator (the only backend that imports ``torch``).

Works only inside the process that trains: the allocator is per process. ``torch.cuda.memory_stats``
is a cheap host-side read (no device synchronisation), so it is safe at every step.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from vramscope.types import AllocatorReading


def torch_cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device. Does not import torch if it is absent."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


class TorchAllocatorBackend:
    """Reads allocated / reserved / peak memory of the devices this process uses.

    Args:
        devices: CUDA device indices; ``None`` means every device torch has initialised.
        reset_peak: reset the peak counters after each reading, so that ``peak_allocated_bytes`` is the
            exact peak *since the previous reading* (what a per-step peak needs).
    """

    def __init__(self, devices: Iterable[int] | None = None, reset_peak: bool = True) -> None:
        import torch

        self._torch: Any = torch
        self._devices = None if devices is None else list(devices)
        self._reset_peak = reset_peak
        self._uuids: dict[int, str | None] = {}

    def available(self) -> bool:
        return bool(self._torch.cuda.is_available())

    def devices(self) -> list[int]:
        if self._devices is not None:
            return self._devices
        if not self.available():
            return []
        # Only devices this process has touched: reading another would create a CUDA context there.
        return [i for i in range(self._torch.cuda.device_count()) if self._is_initialised(i)]

    def _is_initialised(self, index: int) -> bool:
        stats = self._torch.cuda.memory_stats(index) if self._torch.cuda.is_initialized() else {}
        return bool(stats.get("num_device_alloc", 0) or stats.get("reserved_bytes.all.current", 0))

    def read(self) -> tuple[AllocatorReading, ...]:
        readings = []
        for device in self.devices():
            stats = self._torch.cuda.memory_stats(device)
            readings.append(reading_from_stats(device, stats, self._uuid(device)))
            if self._reset_peak:
                self._torch.cuda.reset_peak_memory_stats(device)
        return tuple(readings)

    def _uuid(self, device: int) -> str | None:
        if device not in self._uuids:
            try:
                raw = str(self._torch.cuda.get_device_properties(device).uuid)
            except (AttributeError, RuntimeError):
                raw = ""
            self._uuids[device] = (raw if raw.startswith("GPU-") else f"GPU-{raw}") if raw else None
        return self._uuids[device]

    def reset_peaks(self) -> None:
        for device in self.devices():
            self._torch.cuda.reset_peak_memory_stats(device)


def reading_from_stats(device: int, stats: dict[str, Any], uuid: str | None = None) -> AllocatorReading:
    """Turn one ``torch.cuda.memory_stats`` dict into a reading (absent keys become None)."""

    def get(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if value is not None else None

    return AllocatorReading(
        device=device,
        allocated_bytes=get("allocated_bytes.all.current") or 0,
        reserved_bytes=get("reserved_bytes.all.current") or 0,
        active_bytes=get("active_bytes.all.current"),
        inactive_split_bytes=get("inactive_split_bytes.all.current"),
        peak_allocated_bytes=get("allocated_bytes.all.peak"),
        peak_reserved_bytes=get("reserved_bytes.all.peak"),
        num_alloc_retries=get("num_alloc_retries"),
        num_ooms=get("num_ooms"),
        uuid=uuid,
    )
