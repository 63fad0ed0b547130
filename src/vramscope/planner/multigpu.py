"""How many GPUs, and which way: every strategy's smallest GPU count that fits, its largest micro-batch there,
the target batch across GPUs, and recommendations that compare strategies.

Pure arithmetic over :mod:`vramscope.planner.distributed`; one single-GPU estimate per batch size serves every
data-parallel strategy and GPU count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from vramscope.planner.distributed import (
    STRATEGY_NAMES,
    DistributedEstimate,
    Parallelism,
    estimate_distributed,
)
from vramscope.planner.loading import at_moment
from vramscope.planner.memory import Estimate, Hardware, estimate
from vramscope.planner.search import largest_fitting
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB

MAX_BATCH = 1 << 12
# The rows of the table: every strategy, and FSDP with its parameters on the host (Answer.AI's 70B on 2 x 24 GB,
# with their own loader: transformers 5's loads the whole 4-bit model on each rank first, parallel_loading.py).
TABLE = (("ddp", "none"), ("zero2", "none"), ("zero3", "none"), ("fsdp", "none"), ("fsdp", "params"),
         ("split", "none"))
# GPU counts the search tries: every count to 16, then the usual node sizes.
COUNTS = (*range(1, 17), 24, 32, 48, 64)
SPLIT_MAX = 16  # a split over more GPUs is slower than anything else here; the search stops there
# Said where loading sets a sharded strategy's peak: the loader planned is transformers 5's (parallel_loading.py).
LOADER_NOTE = ("loading is planned as transformers 5 loads: the whole quantized model on every rank's GPU before "
               "FSDP or ZeRO-3 shards it; a loader that quantizes onto the host and shards from there (transformers "
               "4.39+ under fsdp_cpu_ram_efficient_loading or ZeRO-3, Answer.AI's fsdp_qlora train.py) is not modelled")


@dataclass(frozen=True)
class StrategyFit:
    """One row of the table.

    Attributes:
        strategy, offload: the way the run is spread.
        gpus: the GPU count asked for (``--gpus``).
        device_bytes: the largest GPU's memory at ``gpus`` and the plan's micro-batch, the larger of its step and
            its loading (None: cannot run there, e.g. a split over more GPUs than layers).
        fits: at ``gpus``, given a capacity.
        max_batch: the largest micro-batch at ``gpus`` (0: none fits).
        min_gpus: the smallest GPU count that fits the plan's micro-batch (None: none up to the search's end).
        max_batch_at_min: the largest micro-batch at ``min_gpus``.
        micro_batch, grad_accum: reaching ``target_batch`` = micro x accumulation x data-parallel ranks at ``gpus``.
        host_bytes: host memory the offload needs at ``gpus``.
        step_bytes, load_bytes: the largest GPU's step and loading, the two ``device_bytes`` is the larger of;
            ``load_moment`` the loading's largest moment.
    """

    strategy: str
    offload: str
    gpus: int
    device_bytes: int | None
    fits: bool | None = None
    max_batch: int | None = None
    min_gpus: int | None = None
    max_batch_at_min: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    host_bytes: int = 0
    host_bytes_at_min: int = 0
    note: str | None = None
    step_bytes: int | None = None
    load_bytes: int | None = None
    load_moment: str | None = None

    @property
    def loading_sets_peak(self) -> bool:
        """Whether loading the model, not the step, is what this row's GPU must hold."""
        return self.load_bytes is not None and self.step_bytes is not None and self.load_bytes > self.step_bytes

    @property
    def label(self) -> str:
        return STRATEGY_NAMES[self.strategy] + (f" + {self.offload} offload" if self.offload != "none" else "")

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "offload": self.offload, "gpus": self.gpus,
                "device_bytes": self.device_bytes, "fits": self.fits, "max_batch_size": self.max_batch,
                "min_gpus": self.min_gpus, "max_batch_size_at_min_gpus": self.max_batch_at_min,
                "micro_batch_size": self.micro_batch, "grad_accum_steps": self.grad_accum,
                "host_bytes": self.host_bytes, "host_bytes_at_min_gpus": self.host_bytes_at_min, "note": self.note,
                "step_device_bytes": self.step_bytes, "load_device_bytes": self.load_bytes,
                "load_moment": self.load_moment, "loading_sets_peak": self.loading_sets_peak}


@dataclass(frozen=True)
class FitTable:
    """The answer to "how many GPUs, and which way" for one model, recipe and shape."""

    gpus: int
    batch_size: int
    seq_len: int
    capacity_bytes: int | None
    rows: tuple[StrategyFit, ...]
    recommendations: tuple[str, ...] = ()
    target_batch: int | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "capacity_bytes": self.capacity_bytes, "target_batch": self.target_batch,
                "strategies": [r.to_dict() for r in self.rows], "recommendations": list(self.recommendations),
                "notes": list(self.notes)}


class _Planner:
    """Caches the single-GPU estimates: one per micro-batch serves every data-parallel strategy and count."""

    def __init__(self, shape: ModelShape, spec: QLoraSpec, seq: int, hw: Hardware) -> None:
        self.shape, self.spec, self.seq, self.hw = shape, spec, seq, hw
        self.single: Callable[[int], Estimate] = lru_cache(maxsize=None)(
            lambda b: estimate(shape, spec, b, seq, hw))

    def run(self, par: Parallelism, batch: int) -> DistributedEstimate:
        return estimate_distributed(self.shape, self.spec, batch, self.seq, par, self.hw, single=self.single(batch))

    def device(self, par: Parallelism, batch: int) -> int:
        """The largest GPU's peak: its step or its loading, whichever holds more."""
        return self.run(par, batch).worst.peak_device_bytes

    def max_batch(self, par: Parallelism, capacity: int) -> int:
        """Largest micro-batch whose worst GPU fits (memory grows with the batch), 0 if none."""
        return largest_fitting(lambda b: self.device(par, b) <= capacity, MAX_BATCH)


def _runs(shape: ModelShape, strategy: str, n: int) -> bool:
    return strategy != "split" or 2 <= n <= min(shape.layers, SPLIT_MAX)


def _target(target: int, ranks: int, max_micro: int) -> tuple[int | None, int | None, str | None]:
    """(micro-batch, accumulation, note) reaching ``target`` = micro x accumulation x ``ranks``."""
    if max_micro <= 0:
        return None, None, "no micro-batch fits, so accumulation cannot reach the target"
    if target % ranks:
        return None, None, f"target batch {target} is not a multiple of the {ranks} data-parallel ranks"
    per_rank = target // ranks
    micro = max(d for d in range(1, min(max_micro, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro, None


def fit_table(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, gpus: int, capacity: int | None,
              hw: Hardware | None = None, *, target_batch: int | None = None,
              rows: tuple[tuple[str, str], ...] = TABLE) -> FitTable:
    """Every strategy at ``gpus`` GPUs of ``capacity`` bytes, and the smallest count at which each fits.

    ``target_batch`` is split as micro-batch x accumulation x data-parallel ranks at ``gpus``.
    """
    pl = _Planner(shape, spec, seq, hw or Hardware())
    out: list[StrategyFit] = []
    for strategy, offload in rows:
        par = Parallelism(world_size=gpus, strategy=strategy, offload=offload)
        if not _runs(shape, strategy, gpus):
            note = ("a split needs 2 or more GPUs" if gpus < 2 else
                    f"cannot split {shape.layers} layers over {gpus} GPUs" if gpus > shape.layers else
                    f"a split over more than {SPLIT_MAX} GPUs is not planned")
            row = StrategyFit(strategy, offload, gpus, None, note=note)
        else:
            dist = pl.run(par, batch)
            w = dist.worst
            row = StrategyFit(strategy, offload, gpus, w.peak_device_bytes, host_bytes=dist.host_bytes,
                              step_bytes=w.device_bytes, load_bytes=w.load_device_bytes, load_moment=w.load_moment)
        if capacity is not None:
            row = _with_capacity(pl, row, capacity, batch, target_batch)
        out.append(row)
    recs = recommendations(out, capacity, batch) if capacity is not None else ()
    sharded_loads = any(r.loading_sets_peak and r.strategy in ("fsdp", "zero3") for r in out)
    notes = (LOADER_NOTE,) if sharded_loads and spec.bits in (4, 8) else ()
    return FitTable(gpus=gpus, batch_size=batch, seq_len=seq, capacity_bytes=capacity, rows=tuple(out),
                    recommendations=tuple(recs), target_batch=target_batch, notes=notes)


def _with_capacity(pl: _Planner, row: StrategyFit, capacity: int, batch: int, target: int | None) -> StrategyFit:
    fields_: dict[str, Any] = {}
    if row.device_bytes is not None:
        par = Parallelism(world_size=row.gpus, strategy=row.strategy, offload=row.offload)
        fields_["fits"] = row.device_bytes <= capacity
        mb = pl.max_batch(par, capacity)
        fields_["max_batch"] = mb
        if target is not None:
            micro, accum, note = _target(target, par.data_parallel, mb)
            fields_.update(micro_batch=micro, grad_accum=accum, note=note or row.note)
    for n in COUNTS:
        if not _runs(pl.shape, row.strategy, n):
            continue
        par = Parallelism(world_size=n, strategy=row.strategy, offload=row.offload)
        dist = pl.run(par, batch)
        if dist.worst.peak_device_bytes <= capacity:
            fields_.update(min_gpus=n, max_batch_at_min=pl.max_batch(par, capacity), host_bytes_at_min=dist.host_bytes)
            break
    return StrategyFit(**{**row.__dict__, **fields_})


def recommendations(rows: list[StrategyFit], capacity: int, batch: int) -> list[str]:
    """Lines that compare strategies: the cheapest that fits first, then what the others would need.

    Cheapest is the fewest GPUs, then no offload (every step of an offload copies the weights over PCIe: a
    larger micro-batch does not buy that back), then the largest micro-batch: where plain DDP fits one GPU,
    offload is not the first thing said."""
    fitting = sorted((r for r in rows if r.min_gpus is not None),
                     key=lambda r: (r.min_gpus or 0, r.offload != "none", -(r.max_batch_at_min or 0)))
    out: list[str] = []
    for r in fitting[:3]:
        where = "on 1 GPU" if r.min_gpus == 1 else f"over {r.min_gpus} GPUs"
        host = f", {r.host_bytes_at_min / GIB:.0f} GiB of host memory" if r.offload != "none" else ""
        out.append(f"{r.label} {where} fits, up to micro-batch {r.max_batch_at_min}{host}")
    for r in rows:
        if r.min_gpus is None and r.device_bytes is not None:
            # loading's peak is its own, at any micro-batch: say so, with the moment that sets it
            step = (r.step_bytes or 0) / GIB
            why = (f" to load the model (its most {at_moment(r.load_moment or '')}; its step needs {step:.1f} GiB)"
                   if r.loading_sets_peak else "")
            out.append(f"{r.label} does not fit at micro-batch {batch}: it needs GPUs of "
                       f"{r.device_bytes / GIB:.1f} GiB at {r.gpus} GPUs{why} (these have {capacity / GIB:.1f} GiB)")
    return out


__all__ = ["COUNTS", "TABLE", "FitTable", "StrategyFit", "fit_table", "recommendations"]
