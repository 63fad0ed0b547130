"""Run a command under the memory monitor: ``vramscope run -- python train.py``.

Replaces ``nvidia-smi ... -l 5 > log.csv &`` + ``pkill``: the sampler lives exactly as long as the
command, watches the command's whole process tree (launchers, workers, dataloader forks), forwards
signals to it, and returns its exit code.

The command is the user's, and vramscope stands beside it the way ``time`` or ``nice`` do:

* it runs in vramscope's own process group, so the terminal's Ctrl-C, Ctrl-Z and job control reach it
  (and its workers) directly, and a pipeline (``vramscope run -- seq 1 9 | less``) keeps the terminal;
  a signal sent to vramscope from elsewhere (``kill``) is passed on to the command itself, once, as if
  vramscope had exec'd it (a launcher forwards to its workers itself);
* vramscope follows the command's job-control state: it stops when the command stops (so that the shell
  gets its prompt back) and not otherwise (a command that ignores Ctrl-Z keeps its monitor);
* the command gets what it would have had without vramscope: the caller's ignored signals, every
  inherited file descriptor, its ``argv[0]`` as typed, and the shell's exit codes for exec errors
  (126: not executable, a directory; 127: not found, a bad ``#!`` interpreter; no ``#!``: ``/bin/sh``);
* vramscope ends the way the command did: its exit code, or death by the same signal (see
  :func:`exit_like`);
* nothing holds vramscope up once the command has ended: a sink that blocks (a FIFO nobody reads, a
  Pushgateway that answers slowly) is left behind after ``cleanup_limit_s`` with one warning, and a
  signal during that time ends the wait at once;
* processes the command started that outlive it (daemons, reparented away from the tree) are found by
  a marker in their environment (``VRAMSCOPE_RUN_ID``) and named in the result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.sinks import CsvSink, JsonlSink, log_sink
from vramscope.run.signals import forward_signals, wait_for_command
from vramscope.run.spawn import ProgramNotFoundError, inherited_fds, resolve_program, spawn
from vramscope.sampling.peaks import PeakTracker
from vramscope.sampling.sampler import DEFAULT_INTERVAL_S, Collector, Sampler
from vramscope.types import Sink

__all__ = ["CLEANUP_LIMIT_S", "ENV_RUN_ID", "ProgramNotFoundError", "RunResult", "exit_like", "inherited_fds",
           "resolve_program", "run_monitored"]

log = logging.getLogger("vramscope.runner")  # the logger name users filter on, kept from before the move

CLEANUP_LIMIT_S = 3.0  # the most vramscope waits for its sinks once the command has ended
ENV_RUN_ID = "VRAMSCOPE_RUN_ID"  # marks every process the command starts, daemons included


@dataclass
class RunResult:
    exit_code: int  # the command's exit code; 128+N when signal N ended it, as shells report it
    peaks: PeakTracker
    log_path: str | None
    duration_s: float
    command: list[str]
    notes: list[str] = field(default_factory=list)
    gpu_error: str | None = None  # why no GPU could be read (no driver, nvidia-ml-py missing), for the summary
    signal: int | None = None  # the signal that ended the command, if one did
    log_files: list[str] = field(default_factory=list)  # the log's files (more than one once rotated)
    still_running: list[tuple[int, str]] = field(default_factory=list)  # (pid, name) it left running
    left_behind: list[str] = field(default_factory=list)  # sinks still blocked when vramscope gave up on them


def run_monitored(
    command: Sequence[str],
    log_path: str | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    gpus: Sequence[int] | None = None,
    env: dict[str, str] | None = None,
    extra_sinks: Sequence[Sink] = (),
    nvml: NvmlBackend | None = None,
    fsync: bool = False,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    max_log_bytes: int | None = None,
    *,
    overwrite: bool = True,
    cleanup_limit_s: float = CLEANUP_LIMIT_S,
    collector: Callable[[int, NvmlBackend], Collector] | None = None,
    fast: bool = False,
    pass_fds: Sequence[int] | None = None,
) -> RunResult:
    """Start ``command``, sample it until it ends, and return its exit code and peaks.

    The log is opened before the command starts, so a bad log path fails without running anything.
    ``max_log_bytes`` rotates it into ``log``, ``log.1``, ``log.2``... (every row kept). The sinks in
    ``extra_sinks`` are closed here too, within the same bounded time.

    Args:
        overwrite: replace a log that already holds data (False: ``LogExistsError`` before anything runs).
        cleanup_limit_s: the most time spent closing the sinks after the command ended.
        collector: builds the collector from the command's pid and the NVML backend (soak tests inject
            a clock and host readings here).
        fast: allow intervals below the minimum (compressed-time soaks only).
        pass_fds: descriptors above 2 the command inherits (default: :func:`inherited_fds` now).

    Raises:
        ProgramNotFoundError: the command does not exist (nothing was started).
        LogPathError: the log cannot be written, exists (``overwrite=False``) or is being written by
            another process (nothing was started).
    """
    if not command:
        raise ProgramNotFoundError("no command given; put it after '--', e.g. vramscope run -- python train.py")
    keep_fds = inherited_fds() if pass_fds is None else tuple(pass_fds)
    program = resolve_program(command[0])
    sinks: list[Sink] = []
    log_file: CsvSink | JsonlSink | None = None
    try:
        if log_path is not None:
            log_file = log_sink(log_path, fsync=fsync, max_bytes=max_log_bytes, overwrite=overwrite)
            sinks.append(log_file)
    except BaseException:
        _close_quickly(list(extra_sinks), cleanup_limit_s)
        raise
    peaks = PeakTracker()
    sinks.append(peaks)
    sinks.extend(extra_sinks)

    run_id = uuid.uuid4().hex
    child_env = dict(os.environ if env is None else env)
    child_env[ENV_RUN_ID] = run_id
    started = time.monotonic()
    backend = nvml if nvml is not None else NvmlBackend(gpus=gpus)
    # Signals are caught before the child exists, so that one arriving during start-up is not lost:
    # it is delivered to the child as soon as there is one.
    with forward_signals() as (forwarder, handlers):
        try:
            child = spawn(program, list(command), child_env, keep_fds)
        except BaseException:
            _close_quickly(sinks, cleanup_limit_s)
            raise
        handlers.install(ignored=True)  # the command started with them ignored; from now on, passed on
        forwarder.attach(child.pid)
        reader = collector(child.pid, backend) if collector else Collector(nvml=backend, host=HostBackend(child.pid))
        sampler = Sampler(reader, sinks, interval=interval, fast=fast)
        # The first sample too is the thread's: a sink that blocks (a full FIFO) never holds this thread,
        # which waits for the command and must stay free to act on signals.
        sampler.start()
        if on_start is not None:
            on_start(child)
        status = wait_for_command(child, forwarder)
        forwarder.child_ended()
        still_running = _processes_marked(run_id)
        left_behind = _close_sampler(sampler, cleanup_limit_s, forwarder.abandon)
    signum = -status if status < 0 else None
    code = status if status >= 0 else 128 - status  # killed by signal N -> 128+N, as shells do
    if still_running:
        log.warning("vramscope: %s", _still_running_message(still_running))
    return RunResult(
        exit_code=code,
        peaks=peaks,
        log_path=log_path,
        duration_s=time.monotonic() - started,
        command=list(command),
        gpu_error=backend.init_error,
        signal=signum,
        log_files=_log_files(log_file),
        still_running=still_running,
        left_behind=left_behind,
    )


def exit_like(result: RunResult) -> int:
    """End this process the way the command ended: by its signal when one killed it, else its code.

    A shell stops a loop (``for f in *; do vramscope run -- ...; done``) on Ctrl-C only when the
    command it ran *died* of SIGINT; an exit code of 130 is not the same. Returns the exit code when
    the signal cannot end this process (it is ignored or blocked here).
    """
    if result.signal is None:
        return result.exit_code
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        # The command may have dumped core; vramscope dying of the same signal must not add its own.
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(Exception):  # SIGKILL has no handler to reset
        signal.signal(result.signal, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {result.signal})
    with contextlib.suppress(Exception):
        os.kill(os.getpid(), result.signal)
        time.sleep(0.1)  # a pending signal is acted on at the latest when this sleep starts
    return result.exit_code


def _log_files(sink: CsvSink | JsonlSink | None) -> list[str]:
    if sink is None:
        return []
    from vramscope.logs.sinks import part_path

    return [part_path(sink.path, part) for part in range(sink.parts)]


def _close_sampler(sampler: Sampler, limit_s: float, abandon: threading.Event) -> list[str]:
    """Stop the sampler and close its sinks, giving up after ``limit_s`` (or at a signal).

    Returns the names of the sinks still blocked then (a write to a FIFO nobody reads, a push to a
    gateway that answers slowly): they are left to their daemon threads, which end with the process.
    """
    done = threading.Event()

    def close() -> None:
        try:
            sampler.close()
        finally:
            done.set()

    threading.Thread(target=close, name="vramscope-close", daemon=True).start()
    deadline = time.monotonic() + limit_s
    while not done.is_set() and not abandon.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        done.wait(min(remaining, 0.05))
    if done.is_set():
        return []
    stuck = sampler.writing
    names = [_sink_name(stuck) if stuck is not None else "the sampler"]
    why = "a signal asked vramscope to end" if abandon.is_set() else f"still blocked after {limit_s:g} s"
    log.warning("vramscope: gave up on %s (%s) so as not to hold up the end of the command; "
                "the rows it had not taken yet are not in it", ", ".join(names), why)
    return names


def _close_quickly(sinks: Sequence[Sink], limit_s: float) -> None:
    """Close sinks when the command never started, within the same bound as after a run."""
    done = threading.Event()

    def close() -> None:
        for sink in sinks:
            with contextlib.suppress(Exception):
                sink.close()
        done.set()

    threading.Thread(target=close, name="vramscope-close", daemon=True).start()
    done.wait(limit_s)


def _sink_name(sink: object) -> str:
    path = getattr(sink, "path", None)
    if isinstance(path, str):
        return path
    url = getattr(sink, "url", None)
    return f"{type(sink).__name__} {url}" if isinstance(url, str) else type(sink).__name__


def _processes_marked(run_id: str) -> list[tuple[int, str]]:
    """(pid, name) of live processes, other than this one, whose environment carries this run's marker.

    A daemon the command started (double fork, reparented to init) is no longer in its process tree,
    but it keeps the environment it was started with. Reads ``/proc`` (Linux); elsewhere, nothing.
    """
    needle = f"{ENV_RUN_ID}={run_id}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
            if needle not in environ.split(b"\0"):
                continue
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # gone, or another user's
            continue
        name, _, rest = stat.partition(b"(")[2].rpartition(b")")
        if rest.split()[:1] == [b"Z"]:  # a zombie waiting for its parent holds no memory
            continue
        found.append((int(entry), name.decode(errors="replace")))
    return sorted(found)


def _still_running_message(processes: list[tuple[int, str]]) -> str:
    named = ", ".join(f"{pid} ({name})" for pid, name in processes[:10])
    more = f" and {len(processes) - 10} more" if len(processes) > 10 else ""
    count = len(processes)
    return (f"{count} process{'es' if count > 1 else ''} started by the command still "
            f"run{'s' if count == 1 else ''} after it exited: pid {named}{more}; "
            "its memory from now on is not measured (it left the command's process tree)")
