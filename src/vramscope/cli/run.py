"""``vramscope run [--log FILE] [--interval S] [--quiet] [--json] -- CMD ARGS...``

What it prints: the command's own output, untouched; warnings on stderr; and, when the command has
ended, the summary: for people on stderr, or with ``--json`` one JSON object on stdout (its last
line; ``schema_version`` 1) instead. ``--json`` is the only thing vramscope ever writes to stdout:
with stderr closed (``2>&-``) its messages are dropped, never sent to stdout. Whatever happens to
vramscope's own stdout or stderr (a closed pipe, a full disk), it exits the way the command did.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import json
import os
import shlex
import sys
import time
from typing import Any, TextIO

from vramscope.cli.common import (
    CommandError,
    UsageError,
    add_exporter_flags,
    add_renamed,
    gpu_list,
    interval,
    log_megabytes,
    open_exporters_from_args,
    set_examples,
)
from vramscope.logs.files import LogPathError, existing_log_files, free_log_name
from vramscope.output.names import OOM_SUFFIX, sibling
from vramscope.run.relay import with_relay
from vramscope.run.runner import ProgramNotFoundError, RunResult, exit_like, inherited_fds, run_monitored
from vramscope.sampling.sampler import DEFAULT_INTERVAL_S
from vramscope.units import gib

SUMMARY_SCHEMA_VERSION = 1


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", metavar="FILE", help="write the memory log here (.csv, or .jsonl for JSON Lines)")
    parser.add_argument("--interval", type=interval, default=DEFAULT_INTERVAL_S, metavar="S",
                        help=f"seconds between samples, at least 0.05 (default {DEFAULT_INTERVAL_S})")
    add_renamed(parser, "--devices", ["--gpus"], dest="gpus", type=gpu_list, metavar="0,1",
                help="only these GPUs (NVML indices)")
    parser.add_argument("--quiet", action="store_true", help="print nothing unless something goes wrong")
    parser.add_argument("--json", action="store_true",
                        help="print the end summary as one JSON object on stdout instead of the text on stderr")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a log (and its step log) that already exists; without it, that is refused")
    parser.add_argument("--fsync", action="store_true", help="force every row to disk (slower; survives power loss)")
    parser.add_argument("--max-log-mb", dest="max_log_bytes", type=log_megabytes, metavar="MIB",
                        help="start a new log file (FILE.1, FILE.2, ...) before one passes this size; keeps every row")
    parser.add_argument("--no-inject", dest="inject", action="store_false",
                        help="do not attach the step-aligned callback to HF Trainers inside the command")
    parser.add_argument("--oom-snapshot", metavar="DIR", nargs="?", const="",
                        help="on a CUDA OOM in the command, write an allocator snapshot and a report into DIR "
                             "(default: beside --log, or ./vramscope-oom)")
    add_exporter_flags(parser)  # every flag of every row of exporters/registry.EXPORTERS
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the command to run")
    set_examples(parser,
                 "vramscope run --log mem.csv -- python train.py --per_device_train_batch_size 4",
                 "vramscope run --log mem.jsonl --devices 0 --oom-snapshot -- accelerate launch train.py",
                 "vramscope run --json --quiet -- python -c 'print(1)'")


def run(args: argparse.Namespace) -> int:
    inherited = inherited_fds()  # before vramscope opens anything of its own
    _fill_closed_std_streams()
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run; put it after '--', e.g. vramscope run --log mem.csv -- python train.py")
    if args.max_log_bytes is not None and args.log is None:
        raise UsageError("--max-log-mb limits the log's files; add --log FILE")
    if args.log is not None and not args.overwrite:
        _refuse_existing_logs(args.log, steps=args.inject)
    env = dict(os.environ)
    if args.inject:
        env.update(_injection_env(args))
    # Before the command starts: a port in use must not cost a run (and leaves no OOM folder behind).
    exporters = open_exporters_from_args(args, announce=False, run=True)
    oom_dir: str | None = None
    oom_dir_is_ours = False  # created by this run: removed afterwards if nothing was written into it
    if args.oom_snapshot is not None:  # read by the child (HF injection, OomRecorder.from_env)
        from vramscope.oom import ENV_VAR, snapshot_env

        existing = _oom_folder(args.oom_snapshot, args.log)
        oom_dir_is_ours = not os.path.lexists(existing)
        try:
            snapshot = snapshot_env(args.oom_snapshot, args.log)
        except ValueError as exc:
            for sink in exporters:
                sink.close()
            raise UsageError(str(exc)) from None
        env.update(snapshot)
        oom_dir = snapshot[ENV_VAR]
    if not args.quiet:
        for sink in exporters:
            _say(f"vramscope: {getattr(sink, 'where', type(sink).__name__)}", sys.stderr)
    exporters = with_relay(exporters, env) if args.inject else exporters  # the Trainers' step series (run/relay.py)
    started = time.time()
    try:
        # run_monitored closes the exporters, within its bounded clean-up time.
        result = run_monitored(command, log_path=args.log, interval=args.interval, gpus=args.gpus, env=env,
                               fsync=args.fsync, extra_sinks=exporters, max_log_bytes=args.max_log_bytes,
                               overwrite=args.overwrite, pass_fds=inherited)
    except ProgramNotFoundError as exc:
        _remove_if_empty(oom_dir, oom_dir_is_ours)
        raise CommandError(str(exc), exit_code=exc.exit_code) from None
    except LogPathError as exc:
        _remove_if_empty(oom_dir, oom_dir_is_ours)
        raise UsageError(str(exc)) from None
    _remove_if_empty(oom_dir, oom_dir_is_ours)
    files = files_written(result, started, oom_dir)
    if args.json:
        _say(json.dumps(summary_json(result, files), separators=(",", ":")), sys.stdout)
    elif not args.quiet:
        _say(format_summary(result, files), sys.stderr)
    return exit_like(result)


def _fill_closed_std_streams() -> None:
    """Give a closed stdin, stdout or stderr (``2>&-``) a /dev/null of vramscope's own.

    Python leaves ``sys.stderr`` None when descriptor 2 was closed, and ``print(file=None)`` writes to
    stdout: the summary would land in the user's ``> out.txt``. And the first file vramscope opened
    would take the free number 2 and receive whatever is written to "stderr". The /dev/null taken
    here is close-on-exec, so the command still starts with the descriptor closed, as without vramscope.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        with contextlib.suppress(OSError):
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one (lower ones are open)
            if opened != fd:
                os.dup2(opened, fd, inheritable=False)
                os.close(opened)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  (for the life of the process)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115


def _oom_folder(given: str, log: str | None) -> str:
    """The folder ``--oom-snapshot`` names, as :func:`vramscope.oom.snapshot_env` resolves it."""
    from vramscope.oom import DEFAULT_DIR

    return os.path.abspath(given or (sibling(log, suffix=OOM_SUFFIX) if log else DEFAULT_DIR))


def _remove_if_empty(folder: str | None, ours: bool) -> None:
    """Remove the OOM folder this run created when nothing was written into it (no OOM, no GPU)."""
    if folder is None or not ours:
        return
    with contextlib.suppress(OSError):  # not empty, or gone: leave it as it is
        os.rmdir(folder)


def _refuse_existing_logs(log: str, steps: bool) -> None:
    """An existing log (or, with injection, the step log beside it) is refused, with a free name to use."""

    def taken(path: str) -> list[str]:
        found = existing_log_files(path)
        if steps:
            from vramscope.run.inject import steps_log_path

            found += existing_log_files(steps_log_path(path))
        return found

    existing = taken(log)
    if not existing:
        return
    others = [p for p in existing if os.path.abspath(p) != os.path.abspath(log)]
    if len(others) < len(existing):
        what = f"log {log} already exists" + (f" (and {len(others)} more of its files)" if others else "")
    else:
        what = f"{existing[0]} (written beside log {log}) already exists"
    free = free_log_name(log, taken=lambda name: bool(taken(name)))
    raise UsageError(f"{what}; give a new name, e.g. --log {free}, or add --overwrite to replace it")


def _say(text: str, stream: TextIO) -> None:
    """Print for people or programs; a stream that fails (closed pipe, full disk) is muted, never fatal.

    The command's exit code must win over vramscope's own output: after a failure the stream's file
    descriptor points at /dev/null, so that nothing later (logging, the flush at exit) fails again.
    """
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def _injection_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment that makes HF Trainers inside the child log step-aligned memory (training integration)."""
    try:
        inject = importlib.import_module("vramscope.run.inject")
    except ModuleNotFoundError:
        return {}
    env: dict[str, str] = inject.child_env(log_path=args.log)
    return env


def files_written(result: RunResult, started: float, oom_dir: str | None = None) -> list[str]:
    """The files this run wrote: the log (every rotated part), then what the command's HF Trainers wrote
    beside it (``mem.steps.csv``, its analysis and warnings, other ranks' and trainers' logs)."""
    files = list(result.log_files)
    if result.log_path is not None:
        from vramscope.run.inject import steps_log_path

        stem = sibling(steps_log_path(result.log_path), suffix="")  # mem.steps: the start of every file beside it
        for path in sorted(glob.glob(glob.escape(stem) + "*")):
            try:
                if os.path.isfile(path) and os.stat(path).st_mtime >= started - 1:
                    files.append(os.path.relpath(path) if not os.path.isabs(result.log_path) else path)
            except OSError:
                continue
    if oom_dir and _has_entries(oom_dir):
        files.append(oom_dir)
    return files


def _has_entries(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _used_gpus(result: RunResult) -> list[Any]:
    """The GPUs the command's processes used (memory on them at some sample), by index."""
    return [g for g in sorted(result.peaks.gpus.values(), key=lambda g: g.index) if g.process_bytes]


def summary_json(result: RunResult, files: list[str]) -> dict[str, Any]:
    """The end summary as data (``vramscope run --json``); bytes are integers, None is unknown."""
    peaks = result.peaks
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "command": result.command,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "duration_s": round(result.duration_s, 3),
        "samples": peaks.samples,
        "files": files,
        "gpus_watched": len(peaks.gpus),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "total_bytes": g.total_bytes,
                "process_peak_bytes": g.process_bytes,
                "process_peak_at_s": g.process_peak_elapsed_s,
                "device_used_peak_bytes": g.device_used_bytes,
            }
            for g in _used_gpus(result)
        ],
        "tree_gpu_peak_bytes": peaks.tree_gpu_bytes,
        "host_rss_peak_bytes": peaks.host_rss_bytes,
        "gpu_error": result.gpu_error,
        "still_running": [{"pid": pid, "name": name} for pid, name in result.still_running],
        "left_behind": result.left_behind,
    }


def format_summary(result: RunResult, files: list[str] | None = None) -> str:
    peaks = result.peaks
    how = f"was killed by signal {result.signal}" if result.signal is not None else f"exited with {result.exit_code}"
    lines = [f"vramscope: {shlex.join(result.command)} {how} after {result.duration_s:.1f} s"]
    used = _used_gpus(result)
    if not peaks.gpus:
        why = f" ({result.gpu_error})" if result.gpu_error else ""
        lines.append(f"  no NVIDIA GPU seen{why}; host memory only")
    elif not used:
        lines.append(f"  the command used no GPU memory ({len(peaks.gpus)} GPU{'s' * (len(peaks.gpus) > 1)} watched)")
    for gpu in used:
        at = f" at {gpu.process_peak_elapsed_s:.1f} s" if gpu.process_peak_elapsed_s is not None else ""
        lines.append(
            f"  GPU {gpu.index} {gpu.name or ''}: peak of this command {gib(gpu.process_bytes)}{at}, "
            f"device used peak {gib(gpu.device_used_bytes)} of {gib(gpu.total_bytes)}"
        )
    if len(used) > 1:
        lines.append(f"  all GPUs together: peak {gib(peaks.tree_gpu_bytes)}")
    lines.append(f"  host RSS peak (process tree): {gib(peaks.host_rss_bytes)}")
    written = files if files is not None else result.log_files
    if result.log_path:
        lines.append(f"  samples: {peaks.samples}, log: {result.log_path}")
    else:  # the peaks above are all that is left: say so, and how to keep the samples next time
        lines.append(f"  samples: {peaks.samples}, none kept (no --log); to keep them: "
                     "vramscope run --log mem.csv -- ...")
    if written:
        lines.append("  wrote: " + ", ".join(written))
    if result.still_running:
        pids = ", ".join(str(pid) for pid, _ in result.still_running[:10])
        lines.append(f"  still running, started by the command: pid {pids} (not measured after it exited)")
    return "\n".join(lines)
