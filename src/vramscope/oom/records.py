"""The facts of one OOM and its post-mortem, as plain frozen dataclasses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from vramscope.advice.types import Advice as Advice  # the one advice type, re-exported for the OOM's readers


@dataclass(frozen=True)
class OomEvent:
    """The facts of one OOM, as torch's observer and the training loop reported them.

    ``capacity_bytes`` is what the allocator was allowed to hold: the device's total memory, or the
    per-process limit when ``torch.cuda.set_per_process_memory_fraction`` set one.
    """

    device: int = 0
    kind: str = "cuda_allocator"
    requested_bytes: int | None = None
    capacity_bytes: int | None = None
    device_free_bytes: int | None = None
    time: float | None = None
    message: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)  # step, phase, tokens, batch_shape
    stats: Mapping[str, int] = field(default_factory=dict)  # torch.cuda.memory_stats at that moment


@dataclass(frozen=True)
class AllocationSite:
    """Live memory at the OOM grouped by where it was allocated (the innermost frame outside torch)."""

    where: str
    via: tuple[str, ...]  # the next frames outwards, for context
    bytes: int
    blocks: int
    largest_bytes: int
    kind: str = "activations"  # what the whole stack says it is: see :func:`classify_stack`


@dataclass(frozen=True)
class OomReport:
    device: int
    kind: str
    time: float | None
    message: str | None
    requested_bytes: int | None
    capacity_bytes: int | None
    device_free_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    free_in_segments_bytes: int  # cached by the allocator but not in use (after its own cache flush)
    largest_free_block_bytes: int
    fragmentation: float | None  # 1 - largest free block / free in segments; None when nothing is free
    segments: int
    outside_bytes: int | None  # device memory held outside this process's PyTorch allocator
    shortfall_bytes: int | None  # how much more would have been needed for this one request
    step: Any
    phase: Any
    tokens: Any
    batch_shape: Any
    top_sites: tuple[AllocationSite, ...]
    unattributed_bytes: int  # live blocks without a Python stack
    checkpointing_seen: bool  # torch.utils.checkpoint frames among the live blocks' stacks
    history_entries: int
    advice: tuple[Advice, ...]
    advice_source: str
    snapshot_file: str | None = None
    breakdown: dict[str, Any] | None = None  # what the model and optimizer held (MemoryBreakdown.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NO_STACK = "(no Python stack: allocated before recording began, e.g. weights, or by autograd's backward thread)"
