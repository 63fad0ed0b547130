"""``vramscope tune --gpus N [--gpu-memory SIZE] -- <launcher command>``: rehearse N GPUs on one (see
:mod:`vramscope.tune.rehearse`) and print the micro-batch per GPU, rank 0's peaks and what a rehearsal cannot see.
DeepSpeed commands are planned, not rehearsed: one line says why, then the per-GPU plan."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from vramscope.cli.command import SPEC_FIELDS, explicit, read_command
from vramscope.cli.common import TUNE_SCHEMA_VERSION, CommandError, UsageError
from vramscope.cli.tune_command import search_settings
from vramscope.commands import CommandReadError
from vramscope.planner.loading import at_moment
from vramscope.units import gib

_NOT_WITH_A_COMMAND = ("model_dir", "target_batch", "device", *SPEC_FIELDS)


def run_rehearsal(args: argparse.Namespace, argv: Sequence[str]) -> int:
    given = explicit(args)
    clash = [name for name in _NOT_WITH_A_COMMAND if name in given]
    if clash:
        flags = ", ".join({"device": "--devices"}.get(n, "--" + n.replace("_", "-")) for n in clash)
        raise UsageError(f"{flags} do not apply to a rehearsal: the command's own flags set the model and the recipe, "
                         "--gpu-memory the memory of each GPU")
    inputs = read_command(args, argv)
    parsed = inputs.parsed
    from vramscope.tune.rehearse import RehearsalRefused, nccl_share, refuse, worker_of

    try:
        launch = worker_of(parsed, args.gpus)
    except CommandReadError as exc:
        raise UsageError(str(exc)) from None
    try:
        refuse(launch)
    except RehearsalRefused as exc:
        if launch.world_size < 2:
            raise UsageError(str(exc)) from None
        return _plan_only(args, parsed, launch, str(exc))
    from vramscope.tune.cuda import cuda_missing

    why = cuda_missing()  # creates no CUDA context: the trials need the GPU's memory
    if why is not None:
        raise UsageError(f"a rehearsal runs trial steps of the command's worker on a CUDA GPU and {why}; "
                         f"plan it without a GPU: vramscope plan --gpus {args.gpus} -- <command>")
    from vramscope.tune.command import CommandTrial, TrialFailed
    from vramscope.tune.rehearse import rehearse
    from vramscope.tune.search import NoSizeFitsError

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    noun = "length" if args.max_seq_len else "batch"
    count = [0]

    def progress(outcome: CommandTrial, size: int) -> None:
        count[0] += 1
        t = outcome.trial
        if t.ok and t.peak_reserved_bytes is not None:
            say(f"  trial {count[0]}: {noun} {size}: ok, peak allocated {gib(t.peak_bytes or 0)}, reserved "
                f"{gib(t.peak_reserved_bytes)} ({t.seconds:.0f} s, a fresh rank 0)")
        else:
            say(f"  trial {count[0]}: {noun} {size}: out of memory ({t.error}) ({t.seconds:.0f} s)")

    name = launch.strategy.upper() if launch.strategy else "one process"
    if launch.fsdp_version is not None:
        name = f"FSDP{launch.fsdp_version}"
    say(f"vramscope tune --gpus {args.gpus}: {' '.join(argv[:3])} ... rehearsed as rank 0 of {args.gpus} "
        f"({name}{' + offload' if launch.offload else ''}, torch's fake process group) on this GPU")
    say(f"  worker: {' '.join(launch.argv)[:200]}")
    say(f"  NCCL share per rank (modelled, outside the allocator): {gib(nccl_share(launch))}")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = rehearse(parsed, args.gpus, search_settings(args, given), gpu_memory_bytes=args.gpu_memory,
                              on_trial=progress)
    except RehearsalRefused as exc:
        raise UsageError(str(exc)) from None
    except TrialFailed as exc:
        raise CommandError(str(exc)) from None
    except NoSizeFitsError as exc:
        raise CommandError(f"{exc} on a rank of {args.gpus}; try more GPUs, CPU offload or a shorter length"
                           ) from None
    out: dict[str, Any] = {"schema_version": TUNE_SCHEMA_VERSION, **result.to_dict()}
    out["command"] = inputs.to_dict()
    print(json.dumps(out, indent=2, default=str) if args.json else format_rehearsal(out))
    return 0


def format_rehearsal(out: dict[str, Any]) -> str:
    """The human summary of a rehearsal (``RehearsalResult.to_dict()``)."""
    from vramscope.cli.tune_command import format_command_result

    r = out["rehearsal"]
    n = r["world_size"]
    lines = [f"per GPU of {n} ({r['strategy']}{' + offload' if r['offload'] else ''}, rehearsed as rank 0 on "
             f"torch's fake process group):", format_command_result(out)]
    for rank in r["ranks"]:
        line = (f"  rank {rank['rank']} at the answer: peak allocated {_g(rank['peak_allocated_bytes'])}, "
                f"reserved {_g(rank['peak_reserved_bytes'])}")
        if rank["process_bytes"] is not None:
            line += (f"; on the GPU {_g(rank['device_used_bytes'])} + NCCL {_g(rank['nccl_bytes_modelled'])} "
                     f"(modelled) = process {_g(rank['process_bytes'])}")
        if rank["host_rss_bytes"] is not None:
            line += f"; host RSS {_g(rank['host_rss_bytes'])}"
        lines.append(line)
        if rank.get("parameters") and rank.get("parameters_held") is not None:
            lines.append(f"  rank {rank['rank']} holds {rank['parameters_held'] / 1e6:.1f}M of the model's "
                         f"{rank['parameters'] / 1e6:.1f}M parameters")
    plan = r.get("planned")
    if plan:
        host = f", host {_g(plan['host_bytes'])}" if plan["host_bytes"] else ""
        lines.append(f"  planned (vramscope plan, {plan['strategy']} over {n}, batch {plan['batch_size']} x "
                     f"{plan['seq_len']}): allocated {_g(plan['peak_allocated_bytes'])}, process "
                     f"{_g(plan['process_bytes'])}{host}")
        if plan.get("loading_sets_peak"):  # the rehearsal measures the steps only (its peaks reset after loading)
            lines.append(f"  planned loading holds more than the step: {_g(plan['load_device_bytes'])} "
                         f"{at_moment(plan['load_moment'])}, before the first step (not rehearsed)")
    lines.append("  a rehearsal cannot see:")
    lines += [f"    - {text}" for text in r["cannot_see"]]
    lines += [f"  note: {text}" for text in r["notes"]]
    return "\n".join(lines)


def _g(value: int | None) -> str:
    return "-" if value is None else gib(value)


def _plan_only(args: argparse.Namespace, parsed: Any, launch: Any, why: str) -> int:
    """DeepSpeed: the reason on stderr, the planner's per-GPU figures on stdout."""
    from vramscope.planner.distributed import estimate_distributed, parallelism
    from vramscope.planner.errors import PlanInputError
    from vramscope.planner.shapes import shape_from_config

    print(f"vramscope tune --gpus {args.gpus}: {why}", file=sys.stderr)
    if not parsed.model_config:
        raise CommandError("cannot plan it either: the command's model is not a local folder with a config.json; "
                           f"vramscope plan --gpus {args.gpus} --strategy zero3 --model NAME ... plans it", exit_code=2)
    strategy = launch.strategy if launch.strategy in ("zero2", "zero3") else "zero2"
    offload = "optimizer" if launch.offload else "none"
    batch = args.batch_size if "batch_size" in explicit(args) else parsed.batch_size
    seq = args.seq_len or parsed.seq_len
    if seq is None:
        raise UsageError("the command sets no maximum length: give --seq-len S to plan it")
    try:
        dist = estimate_distributed(shape_from_config(parsed.model_config), parsed.spec, batch, seq,
                                    parallelism(args.gpus, strategy, offload, deepspeed=True))
    except PlanInputError as exc:
        raise UsageError(str(exc)) from None
    w = dist.worst
    out = {"schema_version": TUNE_SCHEMA_VERSION, "rehearsed": False, "why": why,
           "plan": dist.to_dict(), "peak_allocated_bytes": w.peak_allocated_bytes,
           "process_bytes": w.process_bytes,
           "load_device_bytes": w.load_device_bytes, "load_moment": w.load_moment,
           "peak_device_bytes": w.peak_device_bytes, "loading_sets_peak": w.loading_sets_peak,
           # the run's peak on the GPU: loading, where it holds more than the step, must fit too
           "fits": None if args.gpu_memory is None else w.peak_device_bytes <= args.gpu_memory}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        verdict = "" if out["fits"] is None else ("; fits" if out["fits"] else "; does NOT fit") + \
            f" in {gib(args.gpu_memory)} per GPU"
        loading = (f"; loading the model holds more: {gib(w.load_device_bytes)} {at_moment(w.load_moment)}"
                   if w.loading_sets_peak else "")
        print(f"planned per GPU of {args.gpus} ({strategy}{' + optimizer offload' if launch.offload else ''}, "
              f"batch {batch} x {seq}): peak allocated {gib(w.peak_allocated_bytes)}, process "
              f"{gib(w.process_bytes)}{loading}{verdict}")
    return 0
