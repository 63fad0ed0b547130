"""The readings every part of vramscope speaks.

A reading is taken once by a backend and becomes part of a :class:`Sample`; everything downstream
(sinks, analysis, reports, exporters) only consumes samples. Memory is always an ``int`` of bytes,
and ``None`` means *unknown* (a field the hardware did not report), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcessGpuReading:
    """One compute process on one GPU (``nvidia-smi --query-compute-apps=pid,used_memory``)."""

    pid: int
    gpu_bytes: int | None
    name: str = ""
    cmdline: str = ""


@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML sees it (``nvidia-smi --query-gpu=memory.used,memory.total``)."""

    index: int
    uuid: str | None = None
    name: str | None = None
    used_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    reserved_bytes: int | None = None  # driver/firmware reserve; only from the v2 memory info
    utilization_pct: int | None = None
    processes: tuple[ProcessGpuReading, ...] = ()
    processes_known: bool = True  # False when NVML could not list them: then () means unknown, not none
    error: str | None = None  # why some fields are missing, for display


@dataclass(frozen=True)
class AllocatorReading:
    """torch's caching allocator on one device (``torch.cuda.memory_stats``)."""

    device: int  # torch's index (after CUDA_VISIBLE_DEVICES), not NVML's
    allocated_bytes: int
    reserved_bytes: int
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None  # cached but unusable: a fragmentation measure
    peak_allocated_bytes: int | None = None  # peak since the previous reading (counter is reset)
    peak_reserved_bytes: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    uuid: str | None = None  # "GPU-..." as NVML spells it, to join with GpuReading


@dataclass(frozen=True)
class HostReading:
    """Host memory: the watched process tree and the whole machine (psutil)."""

    rss_bytes: int | None = None  # summed over the watched process tree
    system_used_bytes: int | None = None
    system_total_bytes: int | None = None


@dataclass(frozen=True)
class Sample:
    """Everything read at one instant.

    ``step``, ``phase`` and ``tokens`` are set when the sample is tied to a training step.
    ``extra`` carries per-sample values that integrations add (e.g. ``{"rank": 0}``); sinks write them
    as extra columns without the core knowing their names.
    """

    time: float  # Unix time, seconds
    elapsed_s: float
    gpus: tuple[GpuReading, ...] = ()
    allocator: tuple[AllocatorReading, ...] = ()
    host: HostReading = field(default_factory=HostReading)
    watched_pids: frozenset[int] | None = None  # the process tree whose GPU memory counts as "ours"
    step: int | None = None
    phase: str | None = None
    tokens: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def process_bytes(self, gpu_index: int) -> int | None:
        """GPU memory held on ``gpu_index`` by the watched processes, or None when unknown."""
        if self.watched_pids is None:
            return None
        gpu = next((g for g in self.gpus if g.index == gpu_index), None)
        if gpu is None or not gpu.processes_known:
            return None
        total = 0
        seen = False
        for proc in gpu.processes:
            if proc.pid in self.watched_pids:
                if proc.gpu_bytes is None:
                    return None
                total += proc.gpu_bytes
                seen = True
        return total if seen else 0
