"""Per-GPU memory of a run spread over several GPUs: DDP, FSDP, DeepSpeed ZeRO-2/3, a model split over GPUs.

Built on the single-GPU model (:func:`vramscope.planner.memory.estimate`): every phase of the step is taken
from it as a :class:`~vramscope.planner.memory.Breakdown` and each component is then kept whole, sharded
1/N, gathered for compute or moved to the host, as the strategy does it. Nothing here knows how a
component is computed, so a change to the single-GPU model (a framework's dtypes, say) carries over.

What each strategy keeps per rank (N = world size):

``ddp``
    a full replica; the reducer's gradient buckets hold a second copy of every trainable gradient
    (``bucket_cap_mb`` only decides how they are split, not their total; ``gradient_as_bucket_view=False``).
``zero2``
    weights replicated; gradients and optimizer states 1/N, plus the reduce bucket (double-buffered
    under ``overlap_comm``).
``zero3`` / ``fsdp`` (FULL_SHARD)
    parameters, gradients and optimizer states 1/N; the 4-bit weights are sharded because they are
    stored as bf16 (``bnb_4bit_quant_storage=bfloat16``, same bytes), but their quantization constants
    live in the module's ``quant_state`` and stay whole on every rank. In forward and backward one unit
    (a decoder layer) is gathered whole and the next one is prefetched; FSDP's root unit (embeddings,
    final norm, lm_head) stays gathered from the forward to the end of the backward (FSDP1 and FSDP2
    do not reshard the root after forward). At the loss FSDP2 holds one unit, not two: the last layer's
    all-gather output, freed only in the root's post-forward (``_fsdp_units``).
``split``
    ``device_map="auto"`` (naive model parallel, no pipeline): one process, the layers divided over
    the GPUs; the first GPU also holds the embeddings, the last the final norm, lm_head and the
    logits; each GPU has its own CUDA context and cuBLAS workspaces.

NCCL allocates its channel buffers outside torch's allocator, so they count in process memory only.

Host memory under FSDP's parameter offload (``CPUOffload(offload_params=True)``, ``CPUOffloadPolicy``) is pinned,
and pinned memory costs more than the shards it holds:

- FSDP1 (``FullyShardedDataParallel``, what the HF Trainer and accelerate run unless told ``fsdp_version: 2``)
  gives every flat parameter a pinned CPU gradient the size of its shard when it is wrapped
  (``FlatParamHandle._init_flat_param_attributes``: ``_cpu_grad = zeros_like(_local_shard).pin_memory()``),
  frozen ones too: the 4-bit base and the embeddings are held twice on the host.
- torch's pinned-host caching allocator rounds every block up to the next power of two
  (``CachingHostAllocator``: ``PowerOf2Ceil(size)`` before ``cudaHostAlloc``). FSDP1 pins one block per flat
  parameter (a decoder layer's shard: 107 MB for Llama-3-70B over 4 ranks, pinned as 128 MiB); FSDP2 pins one per
  parameter shard and its gradient (a non-blocking copy to the CPU lands in pinned memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from vramscope.planner import parallel_loading
from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import framework_for
from vramscope.planner.layer import lora_tensors
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

STRATEGIES = ("ddp", "fsdp", "zero2", "zero3", "split")
OFFLOADS = ("none", "optimizer", "params")
STRATEGY_NAMES = {"ddp": "DDP", "fsdp": "FSDP", "zero2": "ZeRO-2", "zero3": "ZeRO-3", "split": "split"}
# Which offloads a strategy can do: DDP has none; FSDP's CPUOffload(offload_params=True) moves the parameters
# with their gradients, and the optimizer then steps on the CPU; ZeRO offloads the optimizer (and ZeRO-3 the
# parameters); device_map="auto" can spill layers to the CPU, but that is inference-style offload.
ALLOWED_OFFLOAD = {"ddp": ("none",), "fsdp": ("none", "params"), "zero2": ("none", "optimizer"),
                   "zero3": ("none", "optimizer", "params"), "split": ("none",)}
OPTIMIZER_PHASE = "optimizer step"
# The phases in which FSDP/ZeRO-3 hold gathered units (everything but the optimizer step).
LOSS_PHASES = ("forward", "loss backward")
# NCCL's own device memory for a communicator after its first collectives, outside torch's allocator:
# 544 MB for a 2-GPU group and 688 MB for larger ones (4 x A100 with NVLink, NVIDIA/nccl#964). It grows
# with the number of channels, i.e. the bandwidth NCCL aims at; PCIe cards use fewer. A one-rank
# communicator on the H200 (torch 2.11, CUDA 13) held 585 MB already: process less reserved went from
# 778 MB without a process group to 1363 MB with DDP or FSDP (bench/results/fsdp-world1/, 2026-12-01).
# That figure is also the floor for larger groups on such a machine (err high, never low).
NCCL_BYTES_ONE_RANK = 585_105_408
NCCL_BYTES_TWO_RANKS = max(544 * 1000**2, NCCL_BYTES_ONE_RANK)
NCCL_BYTES_MORE_RANKS = 688 * 1000**2
# DeepSpeed defaults as the HF integration fills "auto": reduce_bucket_size = hidden^2,
# stage3_prefetch_bucket_size = 0.9 hidden^2, stage3_param_persistence_threshold = 10 hidden.
MAX_WORLD = 64

# Components of one rank, in display order; the first group counts in torch's peak allocated.
ALLOCATED = (*Breakdown.ALLOCATED, "gathered_params", "comm_buffers")
OUTSIDE = ("allocator_overhead", "cuda_context", "nccl_buffers")


@dataclass(frozen=True)
class Parallelism:
    """How a run is spread: ``world_size`` GPUs under ``strategy``, with ``offload``.

    Attributes:
        world_size: GPUs (processes, except ``split``: one process over that many GPUs).
        strategy: one of :data:`STRATEGIES`.
        offload: one of :data:`OFFLOADS`.
        fsdp_prefetch_units: units gathered ahead of the one computing (FSDP's forward/backward prefetch: 1).
        zero_reduce_bucket_elements: DeepSpeed ``reduce_bucket_size``; None = the HF "auto" value, hidden^2.
        zero3_prefetch_bucket_elements: ``stage3_prefetch_bucket_size``; None = 0.9 x hidden^2.
        zero3_persistence_threshold: ``stage3_param_persistence_threshold``; None = 10 x hidden.
        nccl_bytes: NCCL's buffers per rank; None = :data:`NCCL_BYTES_TWO_RANKS` / ``_MORE_RANKS``.
        fsdp_version: 1 (``FullyShardedDataParallel`` with flat parameters: the HF Trainer's and accelerate's
            default, and the published FSDP-QLoRA recipes) or 2 (``fully_shard``, per-parameter shards); it
            decides only what parameter offload pins on the host.
    """

    world_size: int
    strategy: str
    offload: str = "none"
    fsdp_prefetch_units: int = 1
    zero_reduce_bucket_elements: int | None = None
    zero3_prefetch_bucket_elements: int | None = None
    zero3_persistence_threshold: int | None = None
    nccl_bytes: int | None = None
    fsdp_version: int = 1

    def __post_init__(self) -> None:
        if self.fsdp_version not in (1, 2):
            raise PlanInputError(f"fsdp_version is 1 (FullyShardedDataParallel) or 2 (fully_shard), "
                                 f"got {self.fsdp_version!r}")

    @property
    def data_parallel(self) -> int:
        """How many micro-batches one optimizer step sees per accumulation step (1 for a split model)."""
        return 1 if self.strategy == "split" else self.world_size

    def nccl(self) -> int:
        if self.nccl_bytes is not None:
            return self.nccl_bytes
        if self.strategy == "split":
            return 0
        if self.world_size < 2:
            return NCCL_BYTES_ONE_RANK  # a process group of one rank still opens a communicator
        return NCCL_BYTES_TWO_RANKS if self.world_size == 2 else NCCL_BYTES_MORE_RANKS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"world_size": self.world_size, "strategy": self.strategy, "offload": self.offload}
        if self.strategy == "fsdp":
            out["fsdp_version"] = self.fsdp_version
        return out


def parallelism(world_size: int, strategy: str | None = None, offload: str | None = None, *,
                layers: int | None = None, deepspeed: bool | None = None, fsdp_version: int = 1) -> Parallelism:
    """Check a (world size, strategy, offload) triple, e.g. from ``--gpus/--strategy/--offload`` or a parsed
    launch command, and return it as a :class:`Parallelism`.

    Args:
        world_size: number of GPUs.
        strategy: one of :data:`STRATEGIES`; None = DDP (what torchrun/accelerate run by default) for more
            than one GPU.
        offload: one of :data:`OFFLOADS`; None = ``"none"``.
        layers: the model's decoder layers, to check a split.
        deepspeed: whether the command names DeepSpeed (None: not a command, e.g. the flags alone).
        fsdp_version: 1 or 2 under FSDP (``plan -- <command>`` passes the command's; see :class:`Parallelism`).

    Raises:
        PlanInputError: a combination that cannot run; the message says what would.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise PlanInputError(f"--gpus must be a whole number of at least 1, got {world_size!r}")
    if world_size > MAX_WORLD:
        raise PlanInputError(f"--gpus {world_size} is more than the planner handles ({MAX_WORLD})")
    strat = (strategy or "ddp").lower()
    if strat not in STRATEGIES:
        raise PlanInputError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    off = (offload or "none").lower()
    if off not in OFFLOADS:
        raise PlanInputError(f"unknown offload {offload!r}; choose one of {', '.join(OFFLOADS)}")
    if strat.startswith("zero") and deepspeed is False:
        raise PlanInputError(f"{STRATEGY_NAMES[strat]} is DeepSpeed's, but the command does not use DeepSpeed; "
                             "add --deepspeed ds_config.json (or accelerate's deepspeed config), or plan fsdp")
    if off not in ALLOWED_OFFLOAD[strat]:
        allowed = [o for o in ALLOWED_OFFLOAD[strat] if o != "none"]
        hint = (f"{STRATEGY_NAMES[strat]} offloads only {allowed[0]}: use --offload {allowed[0]}" if allowed
                else f"{STRATEGY_NAMES[strat]} cannot offload; use fsdp (params) or zero2/zero3 (optimizer)")
        raise PlanInputError(f"--offload {off} does not apply to {STRATEGY_NAMES[strat]}; {hint}")
    if strat == "split":
        if world_size < 2:
            raise PlanInputError("a split model needs --gpus 2 or more (on one GPU, plan without --strategy)")
        if layers is not None and world_size > layers:
            raise PlanInputError(f"cannot split {layers} decoder layers over {world_size} GPUs; "
                                 f"use at most --gpus {layers}, or a data-parallel strategy")
    return Parallelism(world_size=world_size, strategy=strat, offload=off, fsdp_version=fsdp_version)


@dataclass(frozen=True)
class RankEstimate:
    """One GPU of a distributed run (for data-parallel strategies every rank is alike: rank 0 stands for all).

    ``parts`` holds bytes per component at this GPU's peak: the single-GPU names (sharded or not) and
    ``gathered_params`` (units gathered whole for compute), ``comm_buffers`` (gradient buckets, reduce
    buffers), ``nccl_buffers`` (outside the allocator). ``host_bytes`` is what this rank keeps in host memory.
    ``load_device_bytes`` is the most this GPU holds while the model loads, at ``load_moment``
    (:mod:`vramscope.planner.parallel_loading`); the GPU's peak is the larger of it and the step's ``device_bytes``.
    """

    gpu: int
    layers: int
    holds: str
    peak_phase: str
    parts: dict[str, int]
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    device_bytes: int
    host_bytes: int = 0
    host_parts: dict[str, int] = field(default_factory=dict)
    load_device_bytes: int = 0
    load_moment: str = ""

    @property
    def peak_device_bytes(self) -> int:
        """What this GPU must hold: the step's peak or the loading's, whichever is larger."""
        return max(self.device_bytes, self.load_device_bytes)

    @property
    def loading_sets_peak(self) -> bool:
        return self.load_device_bytes > self.device_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "layers": self.layers, "holds": self.holds, "peak_phase": self.peak_phase,
                "breakdown": dict(self.parts), "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "process_bytes": self.process_bytes,
                "device_bytes": self.device_bytes, "host_bytes": self.host_bytes,
                "host_breakdown": dict(self.host_parts), "load_device_bytes": self.load_device_bytes,
                "load_moment": self.load_moment, "peak_device_bytes": self.peak_device_bytes,
                "loading_sets_peak": self.loading_sets_peak}


@dataclass(frozen=True)
class DistributedEstimate:
    """Every GPU of one run: ``ranks`` (one entry for data-parallel strategies, one per GPU for a split), and how
    the strategy loads the model (``loading``, in words)."""

    parallelism: Parallelism
    batch_size: int
    seq_len: int
    ranks: tuple[RankEstimate, ...]
    sharding: dict[str, str]
    loading: str = ""

    @property
    def worst(self) -> RankEstimate:
        """The GPU that runs out first: the job fails on its largest rank, loading or stepping."""
        return max(self.ranks, key=lambda r: r.peak_device_bytes)

    @property
    def host_bytes(self) -> int:
        """Host memory the offload needs on one machine (every rank's share)."""
        per = sum(r.host_bytes for r in self.ranks)
        return per * (self.parallelism.world_size if len(self.ranks) == 1 else 1)

    def to_dict(self) -> dict[str, Any]:
        return {**self.parallelism.to_dict(), "batch_size": self.batch_size, "seq_len": self.seq_len,
                "per_gpu": [r.to_dict() for r in self.ranks], "sharding": dict(self.sharding),
                "worst_device_bytes": self.worst.device_bytes, "host_bytes": self.host_bytes,
                "loading": self.loading, "worst_load_device_bytes": self.worst.load_device_bytes,
                "worst_peak_device_bytes": self.worst.peak_device_bytes}


@dataclass(frozen=True)
class _Sizes:
    """Per-layer and root sizes of the static components, read off a breakdown and the shape."""

    layers: int
    root_unquant: int  # embeddings, lm_head, final norm
    layer_unquant: int  # norms, biases, experts of all layers
    layer_norms: int  # the per-layer norm weights alone (ZeRO-3 keeps these whole: below its threshold)
    lm_head: int
    embedding: int
    unit: int  # one decoder layer's parameters, gathered whole (4-bit storage + unquantized + LoRA)


def _sizes(shape: ModelShape, bd: Breakdown) -> _Sizes:
    per_norm = shape.hidden * (2 if shape.norm_bias else 1)
    unq_params = (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params
                  + shape.expert_params)
    per_param = bd.unquantized_params / unq_params if unq_params else 0.0  # the single-GPU model's dtype
    root = round(per_param * (shape.embedding_params + shape.lm_head_params + per_norm))
    layer_unq = bd.unquantized_params - root
    layer_norms = round(per_param * shape.layers * shape.norms_per_layer * per_norm)
    L = max(shape.layers, 1)
    unit = math.ceil((bd.quantized_weights + layer_unq + bd.lora_weights) / L)
    return _Sizes(layers=L, root_unquant=root, layer_unquant=layer_unq, layer_norms=layer_norms,
                  lm_head=round(per_param * shape.lm_head_params), embedding=round(per_param * shape.embedding_params),
                  unit=unit)


def _phase_breakdowns(est: Estimate) -> dict[str, Breakdown]:
    # Older or rewritten single-GPU models may not give every phase; the peak's breakdown alone still works.
    phases = getattr(est, "phase_breakdowns", None) or {}
    return dict(phases) if phases else {est.peak_phase: est.breakdown}


def _shard_phase(par: Parallelism, shape: ModelShape, bd: Breakdown, phase: str, sz: _Sizes,
                 bytes_per_grad: float) -> tuple[dict[str, int], dict[str, int]]:
    """(GPU parts, host parts) of one phase for a data-parallel strategy."""
    n = par.world_size
    s = par.strategy
    p = {name: int(getattr(bd, name)) for name in Breakdown.ALLOCATED}
    p["optimizer_states_paged"] = bd.optimizer_states_paged
    host: dict[str, int] = {}
    is_opt = phase == OPTIMIZER_PHASE
    lora_grads_all = bd.lora_weights  # the same count and dtype as the weights
    gathered = comm = 0

    def shard(name: str, value: int | None = None) -> None:
        p[name] = math.ceil((p[name] if value is None else value) / n)

    if s == "ddp":
        comm = lora_grads_all  # the reducer's flat buckets cover every trainable gradient
    else:
        # Gradients: reduced into each rank's partition as backward goes; the optimizer step holds 1/N.
        shard("lora_gradients")
        shard("optimizer_states")
        shard("optimizer_states_paged")
        if is_opt:
            shard("temporaries")  # the optimizer's own temporaries scale with the states it steps
    if s == "zero2" or s == "zero3":
        elems = par.zero_reduce_bucket_elements or shape.hidden * shape.hidden
        trainable = lora_grads_all / bytes_per_grad if bytes_per_grad else 0.0
        comm = 2 * round(min(elems, trainable) * bytes_per_grad)  # ipg buffers, double under overlap_comm
    if s in ("fsdp", "zero3"):
        shard("quantized_weights")
        shard("lora_weights")
        if s == "fsdp":
            shard("unquantized_params")
        else:
            # Parameters below stage3_param_persistence_threshold (the norms) stay whole on every rank.
            p["unquantized_params"] = sz.layer_norms + math.ceil((bd.unquantized_params - sz.layer_norms) / n)
        if not is_opt:
            if s == "zero3":
                prefetch = round(par.zero3_prefetch_bucket_elements or 0.9 * shape.hidden * shape.hidden) * 2
                unit_z3 = sz.unit - math.ceil(sz.layer_norms / sz.layers)
                gathered = unit_z3 + max(unit_z3, prefetch) + (sz.lm_head if phase in LOSS_PHASES else 0)
            else:
                gathered = _fsdp_units(par, bd, phase) * sz.unit + sz.root_unquant
                if par.offload == "params" and par.fsdp_version == 1:
                    # FSDP1's pre_unshard copies the next unit's CPU shard to the GPU as the all-gather's input
                    gathered += math.ceil(sz.unit / n)
            if phase not in LOSS_PHASES:  # the layers' backward
                comm += math.ceil(lora_grads_all / sz.layers)  # one unit's unsharded gradients, reduce-scattered
    if par.offload == "optimizer":
        for name in ("optimizer_states", "optimizer_states_paged"):
            host[name], p[name] = p[name], 0
        host["lora_gradients"] = math.ceil(lora_grads_all / n)  # DeepSpeed keeps the fp32 partition on the CPU
        p["lora_gradients"] = 0
        if is_opt:
            p["temporaries"] = 0  # the step runs on the CPU
    elif par.offload == "params":
        for name in ("quantized_weights", "unquantized_params", "lora_weights", "lora_gradients",
                     "optimizer_states", "optimizer_states_paged"):
            host[name], p[name] = p[name], 0
        host["lora_gradients"] = math.ceil(lora_grads_all / n)
        if is_opt:
            p["temporaries"] = 0
    p["gathered_params"] = gathered
    p["comm_buffers"] = comm
    return p, host


def _fsdp_units(par: Parallelism, bd: Breakdown, phase: str) -> int:
    """Decoder layers (units) FSDP holds gathered in ``phase``, besides the root.

    In a layer's forward or backward: the layer computing and ``fsdp_prefetch_units`` more (FSDP2 in forward: the
    layer's unsharded parameters and its own all-gather output, whose free waits for the next all-gather). At the
    loss FSDP2 holds one: every layer is resharded, but the last layer's all-gather output is freed only in the
    root's post-forward (``FSDPCommContext.all_gather_state``), after the loss; in the loss backward, what the
    root's pre-backward prefetches of the last layers (``_backward_prefetch``). FSDP1 keeps the fuller count, and
    so does one rank (FSDP2 at world size 1 copies instead of gathering and defers no free; not modelled apart).
    """
    at_loss = phase in LOSS_PHASES and bd.logits_and_loss > 0  # not a layer's own forward temporaries
    if par.fsdp_version == 2 and at_loss and par.world_size > 1:
        return 1 if phase == "forward" else par.fsdp_prefetch_units
    return 1 + par.fsdp_prefetch_units


def _pow2_ceil(size: int) -> int:
    return 1 << (size - 1).bit_length() if size > 1 else size


def _root_blocks(sz: _Sizes) -> list[int]:
    """Bytes of the root's parameters: embeddings, lm_head (untied), final norm."""
    return [b for b in (sz.embedding, sz.lm_head, sz.root_unquant - sz.embedding - sz.lm_head) if b > 0]


def _pinned_offload(shape: ModelShape, spec: QLoraSpec, bd: Breakdown, sz: _Sizes, par: Parallelism,
                    host: dict[str, int]) -> dict[str, int]:
    """What FSDP's parameter offload pins on one rank's host beyond the shards ``host`` already counts.

    ``frozen_gradient_buffers``: FSDP1's ``_cpu_grad`` of every flat parameter, frozen ones too (the LoRA
    gradients are already ``host["lora_gradients"]``). ``pinned_rounding``: each pinned block rounded up to a
    power of two by torch's pinned-host allocator. FSDP1 pins one block per flat parameter: a decoder layer (its
    4-bit weights and norms), the root, and each LoRA matrix (PEFT's ``fsdp_auto_wrap_policy`` wraps every
    trainable leaf apart, as FSDP1 needs one ``requires_grad`` per flat parameter). FSDP2 pins every parameter's
    shard, and the gradients of the trainable ones. The optimizer's states are not pinned (``zeros_like`` of a
    pinned tensor is not).
    """
    n = par.world_size
    L = sz.layers
    elems = lora_tensors(shape, spec) if bd.lora_weights else []
    per_elem = bd.lora_weights / sum(elems) if elems else 0.0
    trainable = [math.ceil(e * per_elem / n) for e in elems]
    if par.fsdp_version == 1:
        layer_unit = (bd.quantized_weights + sz.layer_unquant) / L
        frozen = [math.ceil(layer_unit / n)] * L + [math.ceil(sum(_root_blocks(sz)) / n)]
        frozen_copies = 2  # the shard and its _cpu_grad
    else:
        sizes = [lin.in_features * lin.out_features for lin in shape.linears] if bd.quantized_weights else []
        per_layer = [bd.quantized_weights / L * s / sum(sizes) for s in sizes]
        norms = shape.norms_per_layer
        per_layer += [sz.layer_norms / (L * norms)] * norms if norms else []
        per_layer.append((sz.layer_unquant - sz.layer_norms) / L)  # biases, experts: one block, roughly
        frozen = [math.ceil(b / n) for b in per_layer if b > 0] * L + [math.ceil(b / n) for b in _root_blocks(sz)]
        frozen_copies = 1
    rounding = (frozen_copies * sum(_pow2_ceil(b) - b for b in frozen)
                + 2 * sum(_pow2_ceil(b) - b for b in trainable))
    out = {"pinned_rounding": rounding}
    if par.fsdp_version == 1:
        out["frozen_gradient_buffers"] = host.get("quantized_weights", 0) + host.get("unquantized_params", 0)
    return out


def _totals(parts: dict[str, int], overhead: int, context: int, nccl: int, paged_in_process: int) -> tuple[int, ...]:
    allocated = sum(parts.get(name, 0) for name in ALLOCATED)
    reserved = allocated + overhead
    process = reserved + context + nccl + paged_in_process
    return allocated, reserved, process, process - paged_in_process


def _data_parallel(shape: ModelShape, spec: QLoraSpec, est: Estimate, par: Parallelism,
                   hw: Hardware) -> RankEstimate:
    bd0 = est.breakdown
    sz = _sizes(shape, bd0)
    bytes_per_grad = bd0.lora_weights / est.trainable_params if est.trainable_params else 4.0
    best: tuple[int, str, dict[str, int], dict[str, int]] | None = None
    for phase, bd in _phase_breakdowns(est).items():
        parts, host = _shard_phase(par, shape, bd, phase, sz, bytes_per_grad)
        allocated = sum(parts.get(name, 0) for name in ALLOCATED)
        if best is None or allocated > best[0]:
            best = (allocated, phase, parts, host)
    assert best is not None
    _, phase, parts, host = best
    if par.strategy == "fsdp" and par.offload == "params":
        host.update(_pinned_offload(shape, spec, bd0, sz, par, host))
    # The peak's calibration applies to the whole step; keep it beside the re-sharded parts.
    parts["calibration"] = bd0.calibration
    overhead = bd0.allocator_overhead
    nccl = par.nccl()
    paged = est.paged_in_process_bytes and parts.get("optimizer_states_paged", 0)
    context = bd0.cuda_context  # the framework's measured context, or the Hardware override
    allocated, reserved, process, device = _totals(parts, overhead, context, nccl, int(paged))
    parts.update(allocator_overhead=overhead, cuda_context=context, nccl_buffers=nccl)
    host_total = sum(host.values())
    load = _data_parallel_loading(shape, spec, est, par, sz, bytes_per_grad)
    return RankEstimate(gpu=0, layers=shape.layers, holds="every rank alike", peak_phase=phase, parts=parts,
                        peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, process_bytes=process,
                        device_bytes=device, host_bytes=host_total, host_parts=host,
                        load_device_bytes=load.device_bytes if load else 0, load_moment=load.moment if load else "")


# The parameters a rank keeps once wrapped (what it holds of them when a 16-bit model is sharded from the host).
_PARAMS = ("quantized_weights", "quantization_constants", "unquantized_params", "lora_weights")


def _data_parallel_loading(shape: ModelShape, spec: QLoraSpec, est: Estimate, par: Parallelism, sz: _Sizes,
                           bytes_per_grad: float) -> parallel_loading.RankLoading | None:
    """One rank's loading (:mod:`vramscope.planner.parallel_loading`); None where the single-GPU model gave no
    optimizer step to load from (loading is then not planned, as on one GPU)."""
    phases = _phase_breakdowns(est)
    if OPTIMIZER_PHASE not in phases:
        return None
    kept, _ = _shard_phase(par, shape, phases[OPTIMIZER_PHASE], OPTIMIZER_PHASE, sz, bytes_per_grad)
    return parallel_loading.data_parallel(shape, spec, est, framework_for(spec), strategy=par.strategy,
                                          fsdp_version=par.fsdp_version, unit=sz.unit,
                                          sharded_params=sum(kept.get(k, 0) for k in _PARAMS))


def loading_of(par: Parallelism, spec: QLoraSpec) -> str:
    """How ``par`` loads the model, in words (:mod:`vramscope.planner.parallel_loading`)."""
    return parallel_loading.how(spec, par.strategy, STRATEGY_NAMES[par.strategy])


def split_layers(layers: int, gpus: int) -> list[int]:
    """Decoder layers per GPU for ``device_map="auto"`` over equal GPUs: as even as possible, the extra
    layers on the first GPUs (the last GPU also carries lm_head and the logits)."""
    base, extra = divmod(layers, gpus)
    return [base + (1 if k < extra else 0) for k in range(gpus)]


def _split(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, par: Parallelism, hw: Hardware,
           full: Estimate) -> tuple[RankEstimate, ...]:
    counts = split_layers(shape.layers, par.world_size)
    sz = _sizes(shape, full.breakdown)
    fw = framework_for(spec)
    out: list[RankEstimate] = []
    for k, n_layers in enumerate(counts):
        first, last = k == 0, k == len(counts) - 1
        # A GPU's share is a model of its own layers; a vocabulary of 1 takes the embeddings and logits out
        # of every GPU but the last, and the first gets its embeddings back.
        sub = replace(shape, layers=n_layers, vocab=shape.vocab if last else 1)
        e = estimate(sub, spec, batch, seq, hw)
        parts = {**e.breakdown.to_dict()}
        holds = f"layers {sum(counts[:k])}-{sum(counts[:k + 1]) - 1}"
        if last:
            parts["unquantized_params"] -= sz.embedding if not shape.tied_embeddings else 0
            holds += ", final norm, lm_head, logits"
        if first:
            parts["unquantized_params"] += sz.embedding
            holds = "embeddings, " + holds
        parts.update(gathered_params=0, comm_buffers=0, nccl_buffers=0)
        allocated, reserved, process, device = _totals(parts, e.breakdown.allocator_overhead, e.breakdown.cuda_context,
                                                       0, e.paged_in_process_bytes)
        load = parallel_loading.split_share(sub, spec, e, fw, embedding_params=shape.embedding_params, first=first,
                                            last=last, tied=shape.tied_embeddings)
        out.append(RankEstimate(gpu=k, layers=n_layers, holds=holds, peak_phase=e.peak_phase, parts=parts,
                                peak_allocated_bytes=allocated, peak_reserved_bytes=reserved, process_bytes=process,
                                device_bytes=device, load_device_bytes=load.device_bytes, load_moment=load.moment))
    return tuple(out)


def sharding(par: Parallelism, bits: int = 4) -> dict[str, str]:
    """Component -> how the strategy keeps it, for people (``"sharded 1/2"``, ``"replicated"``, ``"host"``).

    The weights are named for what they are: 4-bit weights stored as bf16 (``bnb_4bit_quant_storage``, so that
    FSDP can shard them), 8-bit weights, or a 16-bit base's plain weights (no quantization constants)."""
    n = par.world_size
    weights = {4: "4-bit weights (bf16 storage)", 8: "8-bit weights"}.get(bits, "weights")
    sh, rep = (f"sharded 1/{n}" if n > 1 else "whole (one rank)"), "replicated"
    s, off = par.strategy, par.offload
    if s == "split":
        return {"layers": f"divided over {n} GPUs (device_map=auto)", "embeddings": "first GPU",
                "lm_head and logits": "last GPU"}
    params = sh if s in ("fsdp", "zero3") else rep
    others = "unquantized params" if bits in (4, 8) else "embeddings, lm_head, norms"
    out = {weights: params}
    if bits in (4, 8):
        out["quantization constants"] = rep
    out |= {others: params if s == "fsdp" else (f"{sh} (norms whole)" if s == "zero3" else rep),
            "LoRA weights": params, "LoRA gradients": rep if s == "ddp" else sh,
            "optimizer states": rep if s == "ddp" else sh}
    if off == "params":
        for key in (weights, others, "LoRA weights", "LoRA gradients", "optimizer states"):
            out[key] = "host" if n == 1 else f"host ({out[key]})"
    elif off == "optimizer":
        out["optimizer states"] = f"host ({out['optimizer states']})"
        out["LoRA gradients"] = f"host ({out['LoRA gradients']})"
    if s == "fsdp" and off == "params":
        out["host, pinned"] = ("every shard and a gradient buffer for each, frozen too (FSDP1), "
                               if par.fsdp_version == 1 else "every shard, the trainable ones' gradients (FSDP2), ")
        out["host, pinned"] += "in power-of-two blocks"
    if s in ("fsdp", "zero3"):
        out["gathered"] = "one unit computing + one prefetched" + (", root (embeddings, lm_head) through fwd/bwd"
                                                                   if s == "fsdp" else ", lm_head for the loss")
    out["communication"] = {"ddp": "gradient buckets = all LoRA gradients (outside: NCCL)",
                            "fsdp": "one unit's gradients for reduce-scatter (outside: NCCL)",
                            "zero2": "2 x reduce bucket (outside: NCCL)",
                            "zero3": "2 x reduce bucket (outside: NCCL)"}[s]
    return out


def estimate_distributed(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, par: Parallelism,
                         hw: Hardware | None = None, *, single: Estimate | None = None) -> DistributedEstimate:
    """Every GPU's memory for one micro-batch of ``batch`` x ``seq`` tokens per rank under ``par``.

    ``single`` may pass the single-GPU estimate already computed for the same inputs.
    """
    hw = hw or Hardware()
    if par.strategy == "split" and par.world_size > shape.layers:
        raise PlanInputError(f"cannot split {shape.layers} decoder layers over {par.world_size} GPUs; "
                             f"use at most --gpus {shape.layers}")
    est = single or estimate(shape, spec, batch, seq, hw)
    if par.strategy == "split":
        ranks = _split(shape, spec, batch, seq, par, hw, est)
    else:
        ranks = (_data_parallel(shape, spec, est, par, hw),)
    return DistributedEstimate(parallelism=par, batch_size=batch, seq_len=seq, ranks=ranks,
                               sharding=sharding(par, spec.bits), loading=loading_of(par, spec))


__all__ = ["ALLOCATED", "OFFLOADS", "STRATEGIES", "DistributedEstimate", "Parallelism", "RankEstimate",
           "estimate_distributed", "loading_of", "parallelism", "sharding", "split_layers"]
