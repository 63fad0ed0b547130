"""Running peaks over a stream of samples, kept in O(GPUs) memory.

A :class:`PeakTracker` is a sink: put beside the log's sink, it sees exactly the samples the log sees, and
``vramscope run`` prints its summary from it without reading the log back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vramscope.types import Sample


@dataclass
class GpuPeak:
    index: int
    name: str | None = None
    total_bytes: int | None = None
    process_bytes: int | None = None  # the watched tree's peak on this GPU
    device_used_bytes: int | None = None
    allocated_bytes: int | None = None  # allocator peak, where the sample carries one
    reserved_bytes: int | None = None
    process_peak_elapsed_s: float | None = None


@dataclass
class PeakTracker:
    """Consumes samples and remembers each GPU's peaks, the tree's total GPU peak and the host peak."""

    gpus: dict[int, GpuPeak] = field(default_factory=dict)
    tree_gpu_bytes: int | None = None  # the watched tree's GPU memory summed over GPUs, at its peak instant
    host_rss_bytes: int | None = None
    samples: int = 0
    first_time: float | None = None
    last_time: float | None = None

    def write(self, sample: Sample) -> None:
        self.samples += 1
        self.first_time = sample.time if self.first_time is None else self.first_time
        self.last_time = sample.time
        self.host_rss_bytes = _max(self.host_rss_bytes, sample.host.rss_bytes)
        tree_total: int | None = None
        for gpu in sample.gpus:
            peak = self.gpus.setdefault(gpu.index, GpuPeak(index=gpu.index))
            peak.name = gpu.name or peak.name
            peak.total_bytes = gpu.total_bytes or peak.total_bytes
            peak.device_used_bytes = _max(peak.device_used_bytes, gpu.used_bytes)
            used = sample.process_bytes(gpu.index)
            if used is not None:
                tree_total = (tree_total or 0) + used
                if peak.process_bytes is None or used > peak.process_bytes:
                    peak.process_bytes = used
                    peak.process_peak_elapsed_s = sample.elapsed_s
        for reading in sample.allocator:
            peak = self.gpus.setdefault(reading.device, GpuPeak(index=reading.device))
            value = (
                reading.peak_allocated_bytes if reading.peak_allocated_bytes is not None else reading.allocated_bytes
            )
            peak.allocated_bytes = _max(peak.allocated_bytes, value)
            peak.reserved_bytes = _max(peak.reserved_bytes, reading.reserved_bytes)
        self.tree_gpu_bytes = _max(self.tree_gpu_bytes, tree_total)

    def close(self) -> None:
        """Nothing to release; a tracker is a sink so that it sees exactly what the log sees."""

    @property
    def duration_s(self) -> float:
        if self.first_time is None or self.last_time is None:
            return 0.0
        return self.last_time - self.first_time


def _max(current: int | None, new: int | None) -> int | None:
    if new is None:
        return current
    return new if current is None or new > current else current
