"""The rank gather: at each logged step every rank sends rank 0 one fixed-size row, through one all-gather.

The wire format is :data:`GATHER_FIELDS`: one int64 per field, -1 for unknown (every real value is >= 0),
so the all-gather's size is known on every rank without a first exchange of sizes. :func:`row_numbers`
writes a rank's row from its :class:`~vramscope.types.Sample`; :func:`row_sample` reads another rank's
row back into one. Imports torch only through ``sys.modules`` (the training process has it).
"""

from __future__ import annotations

import sys
from typing import Any

from vramscope.types import AllocatorReading, GpuReading, HostReading, ProcessGpuReading, Sample, gpu_of

# What one rank sends rank 0 at a logged step, in this order; -1 = unknown (every real value is >= 0).
# Fixed, so the all-gather's size is known on every rank without a first exchange of sizes.
GATHER_FIELDS: tuple[str, ...] = (
    "rank", "step", "tokens", "gpu", "device", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
    "active_bytes", "inactive_split_bytes", "num_alloc_retries", "num_ooms", "device_used_bytes",
    "device_total_bytes", "device_free_bytes", "utilization_pct", "process_bytes", "host_rss_bytes",
    "system_used_bytes",
)


class RankGather:
    """One all-gather of :data:`GATHER_FIELDS` per logged step, on the process group's own device.

    Both tensors are allocated once: a logged step adds no allocation (and no allocator block) of
    its own on the GPU, so the gather does not show up in the peaks it carries.
    """

    def __init__(self, dist: Any, torch: Any, world: int, device: Any) -> None:
        self._torch = torch
        self.world = world
        self._mine = torch.full((len(GATHER_FIELDS),), -1, dtype=torch.int64, device=device)
        # Flat (the concatenation form): every backend takes it, gloo does not take the stacked one.
        self._all = torch.full((world * len(GATHER_FIELDS),), -1, dtype=torch.int64, device=device)
        # torch 2.13 renamed the call (the old name warns); older releases have only the old one.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    @classmethod
    def create(cls) -> RankGather | None:
        """The gatherer for the default process group, or None when torch.distributed is not initialised."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        world = int(dist.get_world_size())
        # NCCL moves CUDA tensors only; anything else with a CPU backend (gloo, or accelerate's
        # "cpu:gloo,cuda:nccl") takes the CPU tensor and so never waits on the GPU.
        backend = str(dist.get_backend())
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        return cls(dist, torch, world, device)

    def exchange(self, sample: Sample, rank: int) -> list[Sample]:
        """All-gather this rank's row; rank 0 gets the other ranks' samples back (the others: [])."""
        values = row_numbers(sample, rank)
        self._mine.copy_(self._torch.tensor(values, dtype=self._torch.int64))
        self._all_gather(self._all, self._mine)
        if rank != 0:
            return []  # no read-back: with NCCL, other ranks never wait for the gather to finish
        flat = self._all.tolist()
        n = len(GATHER_FIELDS)
        table = [flat[i : i + n] for i in range(0, len(flat), n)]
        return [row_sample(dict(zip(GATHER_FIELDS, row, strict=True)), sample)
                for row in table if row[0] != rank]


def row_numbers(sample: Sample, rank: int) -> list[int]:
    """This rank's numbers in :data:`GATHER_FIELDS` order: its own GPU (the one its allocator uses)."""
    reading = sample.allocator[0] if sample.allocator else None
    gpu: GpuReading | None = None
    if reading is not None:
        gpu = gpu_of(reading, sample.gpus)
    elif len(sample.gpus) == 1:
        gpu = sample.gpus[0]
    values: dict[str, int | None] = {
        "rank": rank,
        "step": sample.step,
        "tokens": sample.tokens,
        "gpu": None if gpu is None else gpu.index,
        "device": None if reading is None else reading.device,
        "host_rss_bytes": sample.host.rss_bytes,
        "system_used_bytes": sample.host.system_used_bytes,
    }
    if reading is not None:
        values.update(allocated_bytes=reading.allocated_bytes, reserved_bytes=reading.reserved_bytes,
                      peak_allocated_bytes=reading.peak_allocated_bytes, active_bytes=reading.active_bytes,
                      inactive_split_bytes=reading.inactive_split_bytes,
                      num_alloc_retries=reading.num_alloc_retries, num_ooms=reading.num_ooms)
    if gpu is not None:
        values.update(device_used_bytes=gpu.used_bytes, device_total_bytes=gpu.total_bytes,
                      device_free_bytes=gpu.free_bytes, utilization_pct=gpu.utilization_pct,
                      process_bytes=sample.process_bytes(gpu.index))
    return [-1 if values.get(name) is None else int(values[name] or 0) for name in GATHER_FIELDS]


def row_sample(row: dict[str, int], own: Sample) -> Sample:
    """Another rank's numbers as a Sample, stamped with rank 0's time and phase (taken at the same step)."""
    v: dict[str, int | None] = {k: (None if n < 0 else n) for k, n in row.items()}
    gpus: tuple[GpuReading, ...] = ()
    watched: frozenset[int] | None = None
    index = v["gpu"]
    if index is not None:
        # The process's own bytes travel as a one-process reading under a placeholder pid, so that
        # the schema reads them back the way it reads NVML's.
        procs = () if v["process_bytes"] is None else (ProcessGpuReading(pid=0, gpu_bytes=v["process_bytes"]),)
        gpus = (GpuReading(index=index, used_bytes=v["device_used_bytes"], total_bytes=v["device_total_bytes"],
                           free_bytes=v["device_free_bytes"], utilization_pct=v["utilization_pct"],
                           processes=procs, processes_known=bool(procs)),)
        watched = frozenset({0})
    allocator: tuple[AllocatorReading, ...] = ()
    if v["allocated_bytes"] is not None and v["reserved_bytes"] is not None:
        # Matched to the GPU row by index (no UUIDs travel), so the NVML index stands in for torch's.
        allocator = (AllocatorReading(
            device=index if index is not None else (v["device"] or 0),
            allocated_bytes=v["allocated_bytes"], reserved_bytes=v["reserved_bytes"],
            active_bytes=v["active_bytes"], inactive_split_bytes=v["inactive_split_bytes"],
            peak_allocated_bytes=v["peak_allocated_bytes"], num_alloc_retries=v["num_alloc_retries"],
            num_ooms=v["num_ooms"]),)
    return Sample(time=own.time, elapsed_s=own.elapsed_s, gpus=gpus, allocator=allocator,
                  host=HostReading(rss_bytes=v["host_rss_bytes"], system_used_bytes=v["system_used_bytes"]),
                  watched_pids=watched, step=v["step"], phase=own.phase, tokens=v["tokens"],
                  extra={"rank": v["rank"]})
