"""``vramscope run [--log FILE] [--interval S] [--quiet] -- CMD ARGS...``"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys

from vramscope.cli.common import (
    CommandError,
    UsageError,
    gpu_list,
    interval,
    log_megabytes,
    open_exporters_from_args,
)
from vramscope.runner import ProgramNotFoundError, RunResult, run_monitored
from vramscope.sampler import DEFAULT_INTERVAL_S
from vramscope.sinks.base import LogPathError
from vramscope.units import gib


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", metavar="FILE", help="write the memory log here (.csv, or .jsonl for JSON Lines)")
    parser.add_argument("--interval", type=interval, default=DEFAULT_INTERVAL_S, metavar="S",
                        help=f"seconds between samples, at least 0.05 (default {DEFAULT_INTERVAL_S})")
    parser.add_argument("--gpus", type=gpu_list, metavar="0,1", help="only these GPUs (NVML indices)")
    parser.add_argument("--quiet", action="store_true", help="print nothing unless something goes wrong")
    parser.add_argument("--fsync", action="store_true", help="force every row to disk (slower; survives power loss)")
    parser.add_argument("--max-log-mb", dest="max_log_bytes", type=log_megabytes, metavar="MIB",
                        help="start a new log file (FILE.1, FILE.2, ...) before one passes this size; keeps every row")
    parser.add_argument("--no-inject", dest="inject", action="store_false",
                        help="do not attach the step-aligned callback to HF Trainers inside the command")
    parser.add_argument("--oom-snapshot", metavar="DIR", nargs="?", const="",
                        help="on a CUDA OOM in the command, write an allocator snapshot and a report into DIR "
                             "(default: beside --log, or ./vramscope-oom)")
    parser.add_argument("--prometheus", metavar="[HOST:]PORT",
                        help="serve /metrics for Prometheus while the command runs (binds 127.0.0.1 unless HOST)")
    parser.add_argument("--push", metavar="URL", help="push metrics to this Prometheus Pushgateway on a timer")
    parser.add_argument("--push-interval", type=interval, metavar="S", help="seconds between pushes (default 15)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the command to run")


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run; put it after '--', e.g. vramscope run --log mem.csv -- python train.py")
    if args.max_log_bytes is not None and args.log is None:
        raise UsageError("--max-log-mb limits the log's files; add --log FILE")
    env = dict(os.environ)
    if args.inject:
        env.update(_injection_env(args))
    if args.oom_snapshot is not None:  # read by the child (HF injection, OomRecorder.from_env)
        from vramscope.oom import snapshot_env

        try:
            env.update(snapshot_env(args.oom_snapshot, args.log))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    # Before the command starts: a port in use must not cost a run.
    exporters = open_exporters_from_args(args, announce=not args.quiet)
    try:
        result = run_monitored(command, log_path=args.log, interval=args.interval, gpus=args.gpus, env=env,
                               fsync=args.fsync, extra_sinks=exporters, max_log_bytes=args.max_log_bytes)
    except ProgramNotFoundError as exc:
        raise CommandError(str(exc), exit_code=127) from None
    except LogPathError as exc:
        raise UsageError(str(exc)) from None
    finally:
        for sink in exporters:  # the sampler closes them too; closing is idempotent
            sink.close()
    if not args.quiet:
        print(format_summary(result), file=sys.stderr)
    return result.exit_code


def _injection_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment that makes HF Trainers inside the child log step-aligned memory (training integration)."""
    try:
        inject = importlib.import_module("vramscope.integrations.inject")
    except ModuleNotFoundError:
        return {}
    env: dict[str, str] = inject.child_env(log_path=args.log)
    return env


def format_summary(result: RunResult) -> str:
    peaks = result.peaks
    lines = [f"vramscope: {shlex.join(result.command)} exited with {result.exit_code} after {result.duration_s:.1f} s"]
    if not peaks.gpus:
        why = f" ({result.gpu_error})" if result.gpu_error else ""
        lines.append(f"  no NVIDIA GPU seen{why}; host memory only")
    for gpu in sorted(peaks.gpus.values(), key=lambda g: g.index):
        at = f" at {gpu.process_peak_elapsed_s:.1f} s" if gpu.process_peak_elapsed_s is not None else ""
        lines.append(
            f"  GPU {gpu.index} {gpu.name or ''}: peak of this command {gib(gpu.process_bytes)}{at}, "
            f"device used peak {gib(gpu.device_used_bytes)} of {gib(gpu.total_bytes)}"
        )
    if len(peaks.gpus) > 1:
        lines.append(f"  all GPUs together: peak {gib(peaks.tree_gpu_bytes)}")
    lines.append(f"  host RSS peak (process tree): {gib(peaks.host_rss_bytes)}")
    lines.append(f"  samples: {peaks.samples}" + (f", log: {result.log_path}" if result.log_path else ""))
    return "\n".join(lines)
