"""CUDA for the tuner: torch's caching allocator as the search's :class:`~vramscope.tune.search.MemoryProbe`, and
the device set up for the trials (:func:`claim_device`).

torch is imported when it is used, so importing this module needs no torch.
"""

from __future__ import annotations

import gc
from typing import Any

from vramscope.units import gib


class CudaProbe:
    """torch's CUDA caching allocator on one device.

    The capacity is what this process's allocator can hold: free device memory plus what it already
    reserved, capped by the per-process fraction (``torch.cuda.set_per_process_memory_fraction``) and
    by ``limit_bytes`` when given. torch enforces the per-process fraction on the allocator's
    *reserve* (``memory_reserved``), so the search measures and predicts reserved memory against it.

    Args:
        device: CUDA device index; None means the current device.
        limit_bytes: plan for at most this much (does not enforce it; the CLI's ``--gpu-memory`` sets
            torch's per-process fraction so that an OOM really happens there).
    """

    def __init__(self, device: int | None = None, limit_bytes: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("finding the largest batch needs a CUDA GPU, and torch sees none")
        self._torch: Any = torch
        self.device = torch.cuda.current_device() if device is None else int(device)
        self.limit_bytes = limit_bytes

    def capacity_bytes(self) -> int:
        cuda = self._torch.cuda
        self.release()
        free, total = cuda.mem_get_info(self.device)
        capacity = int(free) + int(cuda.memory_reserved(self.device))
        # Recent torch can say what set_per_process_memory_fraction set; older torch cannot, and then
        # only limit_bytes knows about such a cap.
        get_fraction = getattr(cuda, "get_per_process_memory_fraction", None)
        if get_fraction is not None:
            capacity = min(capacity, int(float(get_fraction(self.device)) * int(total)))
        if self.limit_bytes is not None:
            capacity = min(capacity, int(self.limit_bytes))
        return capacity

    def allocated_bytes(self) -> int:
        return int(self._torch.cuda.memory_allocated(self.device))

    def reserved_bytes(self) -> int:
        return int(self._torch.cuda.memory_reserved(self.device))

    def reset_peak(self) -> None:
        # Resets the allocated and the reserved peak alike; release() ran empty_cache() just before,
        # so the reserve starts at what live tensors need and its peak reflects this trial only.
        self._torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self.device))

    def peak_reserved_bytes(self) -> int:
        return int(self._torch.cuda.max_memory_reserved(self.device))

    def release(self) -> None:
        gc.collect()
        self._torch.cuda.synchronize(self.device)
        self._torch.cuda.empty_cache()


class CudaSetupError(Exception):
    """The GPU cannot be used as asked. ``usage``: the user's flags asked for what is not there (exit 2)."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def cuda_missing() -> str | None:
    """Why trial steps cannot run on a CUDA GPU here (``"needs torch"``, ``"torch sees none"``), or None.

    Creates no CUDA context: a parent that only launches trial children must leave the GPU's memory to them.
    """
    try:
        import torch
    except ImportError:
        return "needs torch"
    return None if torch.cuda.is_available() else "torch sees none"


def claim_device(device: int, limit_bytes: int | None = None) -> int:
    """Make ``device`` the current CUDA device and, with ``limit_bytes``, cap this process's allocator there
    (torch's per-process fraction, set before the model loads so that the model counts against it too, as on a
    smaller GPU). Returns the device's total memory in bytes.

    Raises:
        CudaSetupError: no torch or no CUDA GPU; ``usage`` when the index or the limit is beyond the device.
    """
    why = cuda_missing()
    if why == "needs torch":
        raise CudaSetupError("vramscope tune needs torch; run: pip install 'vramscope[hf]'")
    if why is not None:
        raise CudaSetupError("vramscope tune runs real training steps and needs a CUDA GPU; torch sees none")
    import torch

    if device >= torch.cuda.device_count():
        raise CudaSetupError(f"--devices {device}: torch sees {torch.cuda.device_count()} CUDA device(s)", usage=True)
    torch.cuda.set_device(device)
    total = int(torch.cuda.get_device_properties(device).total_memory)
    if limit_bytes is not None:
        if limit_bytes > total:
            raise CudaSetupError(f"--gpu-memory {gib(limit_bytes)} is more than the GPU's {gib(total)}", usage=True)
        torch.cuda.set_per_process_memory_fraction(limit_bytes / total, device)
    return total
