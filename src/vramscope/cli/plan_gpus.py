"""``vramscope plan --gpus N [--strategy S] [--offload O]``: the per-GPU plan and the strategy table.

Kept apart from :mod:`vramscope.cli.plan` so that the single-GPU output and this one change independently.
"""

from __future__ import annotations

import argparse
from typing import Any

from vramscope.cli.common import UsageError
from vramscope.cli.labels import breakdown_labels, totals_lines
from vramscope.planner import PlanInputError
from vramscope.planner.api import Plan, capacity_of, resolve_model
from vramscope.planner.distributed import (
    ALLOCATED,
    OFFLOADS,
    STRATEGIES,
    STRATEGY_NAMES,
    DistributedEstimate,
    estimate_distributed,
    parallelism,
)
from vramscope.planner.loading import at_moment
from vramscope.planner.memory import Hardware
from vramscope.planner.multigpu import FitTable, fit_table
from vramscope.recipe import QLoraSpec
from vramscope.units import gib


def _gpu_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes a number of GPUs such as 2, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--gpus must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("more than one GPU")
    g.add_argument("--gpus", type=_gpu_count, metavar="N",
                   help="plan per GPU for N GPUs and compare strategies (with --gpu/--gpu-memory: how many fit)")
    g.add_argument("--strategy", choices=STRATEGIES,
                   help="ddp, fsdp (FULL_SHARD), zero2, zero3 (DeepSpeed) or split (device_map=auto); needs --gpus")
    g.add_argument("--offload", choices=OFFLOADS,
                   help="move optimizer states (zero2/zero3) or parameters (fsdp/zero3) to the CPU; needs --strategy")
    g.add_argument("--fsdp-version", type=int, choices=(1, 2), default=None, metavar="{1,2}",
                   help="FSDP1 (FullyShardedDataParallel, accelerate's default) or FSDP2 (fully_shard); what "
                        "parameter offload pins on the host differs (default: the command's, else 1)")


def wanted(args: argparse.Namespace) -> bool:
    """Whether the flags ask for the multi-GPU plan; raises UsageError for a strategy without a GPU count."""
    if args.gpus is None:
        if args.strategy is not None or args.offload is not None:
            raise UsageError("--strategy and --offload need --gpus N (the number of GPUs), "
                             "e.g. --gpus 2 --strategy fsdp")
        return False
    if args.offload is not None and args.strategy is None:
        raise UsageError("--offload needs --strategy (fsdp or zero3 for params, zero2 or zero3 for optimizer)")
    if getattr(args, "fsdp_version", None) is not None and args.strategy not in (None, "fsdp"):
        raise UsageError(f"--fsdp-version is for --strategy fsdp, not {args.strategy}")
    return True


def plan_gpus(model: Any, spec: QLoraSpec, args: argparse.Namespace, hardware: Hardware | None
              ) -> tuple[DistributedEstimate | None, FitTable]:
    """The per-GPU estimate for the chosen strategy (None without --strategy) and the table of all of them."""
    try:
        _, shape = resolve_model(model)
        cap, hw = capacity_of(args.gpu_memory, args.gpu)
        if hardware is not None:
            hw = hardware
        dist = None
        if args.strategy is not None:
            par = parallelism(args.gpus, args.strategy, args.offload, layers=shape.layers,
                              fsdp_version=getattr(args, "fsdp_version", None) or 1)  # the flag, or plan -- <command>
            dist = estimate_distributed(shape, spec, args.batch_size, args.seq_len, par, hw)
        table = fit_table(shape, spec, args.batch_size, args.seq_len, args.gpus, cap, hw,
                          target_batch=args.target_batch)
    except PlanInputError as exc:
        raise UsageError(str(exc)) from None
    return dist, table


def format_gpus(p: Plan, dist: DistributedEstimate | None, table: FitTable) -> str:
    """The per-GPU plan (with --strategy) and the strategy table, for a terminal."""
    s = p.spec
    lines = [f"{p.model}: {p.total_params / 1e9:.2f}B params, micro-batch {p.batch_size} x {p.seq_len} tokens per GPU",
             f"  {s.bits}-bit base, LoRA r={s.lora_r} ({p.trainable_params / 1e6:.1f}M trainable), {s.optim}, "
             f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}"]
    if dist is not None:
        lines += ["", *_format_dist(dist, table.capacity_bytes, breakdown_labels(s.bits, s.compute_dtype, p.moe))]
    lines += ["", *_format_table(table)]
    return "\n".join(lines)


def _format_dist(d: DistributedEstimate, capacity: int | None, labels: dict[str, str]) -> list[str]:
    par = d.parallelism
    name = STRATEGY_NAMES[par.strategy] + (f" with {par.offload} offload" if par.offload != "none" else "")
    eff = d.batch_size * par.data_parallel
    lines = [f"  {name} over {par.world_size} GPU{'s' if par.world_size > 1 else ''}: "
             f"{d.batch_size} x {d.seq_len} tokens per micro-batch, {eff} sequence{'s' if eff != 1 else ''} per step "
             "without accumulation"]
    lines += [f"    {what:32} {how}" for what, how in d.sharding.items()]
    if len(d.ranks) > 1:
        lines += ["", f"    {'GPU':4} {'holds':46} {'peak phase':24} {'allocated':>11} {'process':>11}"]
        for r in d.ranks:
            lines.append(f"    {r.gpu:<4} {r.holds:46} {r.peak_phase:24} {gib(r.peak_allocated_bytes):>11} "
                         f"{gib(r.process_bytes):>11}")
    w = d.worst
    who = "each GPU" if len(d.ranks) == 1 else f"GPU {w.gpu}, the largest"
    lines += ["", f"  breakdown of {who} at its peak ({w.peak_phase}):"]
    for key in (*ALLOCATED, "optimizer_states_paged", "allocator_overhead", "cuda_context", "nccl_buffers"):
        value = w.parts.get(key, 0)
        if value:
            label = labels.get(key, key)
            if key == "quantization_constants" and not w.parts.get("quantized_weights"):
                label = "quantization constants (weights on host)"
            lines.append(f"    {label:42} {gib(value):>11}")
    lines += ["", *totals_lines(w)]
    if d.host_bytes:
        lines.append(f"  host memory for the offload: {gib(w.host_bytes)} per rank, "
                     f"{gib(d.host_bytes)} for the machine")
    if w.loading_sets_peak:
        # said only where loading holds more than the step: elsewhere the step's figures above are the peak
        where = "each GPU" if len(d.ranks) == 1 else f"GPU {w.gpu}"
        lines.append(f"  loading the model holds more: {gib(w.load_device_bytes)} on {where} "
                     f"{at_moment(w.load_moment or '')}, before the first step: {d.loading}")
    if capacity is not None:
        verdict = "fits" if w.peak_device_bytes <= capacity else "does NOT fit"
        lines.append(f"  {verdict} in {gib(capacity)} per GPU")
    return lines


def _format_table(t: FitTable) -> list[str]:
    cap = t.capacity_bytes
    head = f"  strategies at {t.gpus} GPU{'s' if t.gpus > 1 else ''}"
    lines = [head + (f" of {gib(cap)}" if cap is not None else "") + f", micro-batch {t.batch_size}:"]
    cols = f"    {'strategy':26} {'per GPU':>11}"
    if cap is not None:
        cols += f" {'fits':>5} {'max batch':>9}   {'fewest GPUs':>11} {'max batch there':>15}"
        if t.target_batch is not None:
            cols += f"   target {t.target_batch}"
    lines.append(cols)
    for r in t.rows:
        row = f"    {r.label:26} {gib(r.device_bytes) if r.device_bytes is not None else '-':>11}"
        if cap is not None:
            fits = "-" if r.fits is None else ("yes" if r.fits else "no")
            row += (f" {fits:>5} {r.max_batch if r.max_batch is not None else '-':>9}   "
                    f"{r.min_gpus if r.min_gpus is not None else 'none':>11} "
                    f"{r.max_batch_at_min if r.max_batch_at_min is not None else '-':>15}")
            if t.target_batch is not None:
                row += (f"   {r.micro_batch} x {r.grad_accum} accum x {t.gpus if r.strategy != 'split' else 1}"
                        if r.micro_batch is not None else "   -")
        if r.note and (r.device_bytes is None or (r.max_batch and r.micro_batch is None)):
            row += f"  ({r.note})"
        if r.loading_sets_peak:
            row += f"  (loading sets it, {at_moment(r.load_moment or '')}; the step: {gib(r.step_bytes or 0)})"
        lines.append(row)
    if t.recommendations:
        lines += ["", "  which way:"] + [f"    - {rec}" for rec in t.recommendations]
    lines += [f"  note: {n}" for n in t.notes]
    if cap is None:
        lines.append("  add --gpu NAME or --gpu-memory SIZE for the GPU counts that fit")
    return lines
