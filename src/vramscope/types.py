"""The readings every part of vramscope speaks.

A reading is taken once by a backend and becomes part of a :class:`Sample`; everything downstream
(sinks, analysis, reports, exporters) only consumes samples. Memory is always an ``int`` of bytes,
and ``None`` means *unknown* (a field the hardware did not report), never zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


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


@dataclass(frozen=True)
class MemoryBreakdown:
    """What holds a training process's device memory, by category (``torch.cuda.memory_summary()`` made readable).

    Everything is bytes on the model's device; ``None`` is unknown. The static parts are counted from the
    model's and the optimizer's own tensors; ``activations_at_peak`` is the run's peak allocated less
    everything else that is allocated at that moment (weights, quantization constants, buffers, LoRA,
    gradients, optimizer states), so it also holds the step's temporaries. Paged optimizer states live in
    unified memory, outside torch's allocator: they are listed but not part of allocated.

    Attributes:
        device: the device the figures are for (``"cuda:0"``, ``"cpu"``).
        weights: frozen weights by storage (``"4-bit (uint8)"``, ``"bfloat16"``, ``"float32"``, ...).
        quantization_constants: bitsandbytes' absmax, code books and double-quantization states.
        buffers: the model's buffers (rotary tables, masks).
        lora_weights: trainable parameters (LoRA adapters, ``modules_to_save``).
        trainable_params: how many trainable elements there are.
        gradients: the trainable parameters' gradients, held from the backward to the optimizer step
            (counted at full size, whether or not they exist at the moment of reading).
        optimizer_states: optimizer state tensors in torch's allocator.
        optimizer_states_paged: paged (unified memory) optimizer states, e.g. bitsandbytes' paged AdamW.
        activations_at_peak: peak allocated less the rest; None without a peak.
        peak_allocated_bytes: the run's peak ``torch.cuda.max_memory_allocated``.
        reserved_bytes: what torch's caching allocator holds from the driver.
        allocator_cache_bytes: reserved less allocated at the latest reading (cached, free blocks).
        cuda_context_bytes: the process's GPU memory (NVML) less reserved: CUDA context, kernels, NCCL.
        process_bytes: the process's GPU memory as nvidia-smi shows it.
    """

    device: str
    weights: dict[str, int] = field(default_factory=dict)
    quantization_constants: int = 0
    buffers: int = 0
    lora_weights: int = 0
    trainable_params: int = 0
    gradients: int = 0
    optimizer_states: int = 0
    optimizer_states_paged: int = 0
    activations_at_peak: int | None = None
    peak_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    allocator_cache_bytes: int | None = None
    cuda_context_bytes: int | None = None
    process_bytes: int | None = None

    def static_bytes(self) -> int:
        """Allocated bytes that live through the whole step: everything but the activations."""
        return (sum(self.weights.values()) + self.quantization_constants + self.buffers + self.lora_weights
                + self.gradients + self.optimizer_states)

    def rows(self) -> list[tuple[str, int | None]]:
        """(label, bytes) in the order people read them; unknown figures are None."""
        out: list[tuple[str, int | None]] = [(f"weights ({kind})", n) for kind, n in self.weights.items()]
        out += [
            ("quantization constants", self.quantization_constants),
            ("buffers", self.buffers),
            ("LoRA / trainable weights", self.lora_weights),
            ("gradients (backward to optimizer step)", self.gradients),
            ("optimizer states (on the device)", self.optimizer_states),
            ("activations and temporaries at the peak", self.activations_at_peak),
            ("= peak allocated", self.peak_allocated_bytes),
            ("allocator cache (reserved - allocated)", self.allocator_cache_bytes),
            ("CUDA context and kernels (process - reserved)", self.cuda_context_bytes),
            ("= process memory (nvidia-smi)", self.process_bytes),
            ("optimizer states (paged, unified memory)", self.optimizer_states_paged),
        ]
        return out

    def __str__(self) -> str:
        from vramscope.units import gib  # units is the one place that formats bytes

        lines = [f"what holds memory on {self.device} ({self.trainable_params / 1e6:.1f}M trainable parameters)"]
        for label, value in self.rows():
            lines.append(f"  {label:48} {'unknown' if value is None else gib(value):>11}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> MemoryBreakdown:
        """Read :meth:`to_dict`'s output back (unknown keys are ignored, so newer files still read)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        weights = known.get("weights")
        if not isinstance(known.get("device"), str) or not isinstance(weights, dict):
            raise ValueError("not a vramscope memory breakdown (no device or weights)")
        for name, value in known.items():
            if name in ("device", "weights"):
                continue
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"breakdown field {name!r} is not a whole number of bytes: {value!r}")
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in weights.items()):
            raise ValueError("breakdown weights must map a storage name to bytes")
        return cls(**known)  # type: ignore[arg-type]


@runtime_checkable
class Sink(Protocol):
    """Receives every sample (a log file, an exporter). ``write`` may raise; the sampler reports it once and carries on.

    The log files themselves (writing, rotation, names) are :mod:`vramscope.logs.files`.
    """

    def write(self, sample: Sample) -> None: ...

    def close(self) -> None: ...


# Which NVML GPU an allocator reading is on, and back: the one rule for joining the two.
#
# NVML numbers the machine's GPUs; torch numbers the ones its process can see (after ``CUDA_VISIBLE_DEVICES``), so
# ``GpuReading.index`` and ``AllocatorReading.device`` differ as soon as a launcher gives each rank one GPU (rank 3
# sees its GPU 3 as ``cuda:0``). Both backends read the GPU's UUID, which does not change; the indexes are compared
# only where a UUID is missing on the side being matched or on every reading of the other side (an old driver, a
# torch without ``uuid`` in its device properties), which is right unless ``CUDA_VISIBLE_DEVICES`` reorders them.


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


@dataclass(frozen=True)
class RunStrategy:
    """How a run is spread over its GPUs, as the monitor saw it: the format of ``<log stem>.strategy.json``
    (:data:`vramscope.output.names.STRATEGY_SUFFIX`), written by ``MemoryMonitor.note_strategy`` and read by
    ``vramscope report`` to name it and hold each rank against a per-rank plan."""

    strategy: str  # "fsdp", "zero2", "zero3", "ddp", "single", ...
    implementation: str | None = None  # "FSDP2 fully_shard", "DeepSpeed ZeRO-3", "DistributedDataParallel", ...
    world_size: int | None = None
    backend: str | None = None  # the process group's: "nccl", "gloo"
    source: str | None = None  # where it was read: "model wrapping", "TrainingArguments", "process group", ...

    def to_json(self) -> dict[str, object]:
        return {"strategy": self.strategy, "implementation": self.implementation, "world_size": self.world_size,
                "backend": self.backend, "source": self.source}

    @classmethod
    def from_json(cls, data: object) -> RunStrategy:
        """The record in a strategy file's JSON; a field of another type (a file edited by hand) reads as unknown.

        Raises:
            ValueError: not a strategy record (no ``"strategy"`` name).
        """
        if not isinstance(data, dict) or not isinstance(data.get("strategy"), str):
            raise ValueError("not a strategy record: no 'strategy' name")
        world = data.get("world_size")
        return cls(data["strategy"], _text(data.get("implementation")),
                   world if isinstance(world, int) and not isinstance(world, bool) else None,
                   _text(data.get("backend")), _text(data.get("source")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
