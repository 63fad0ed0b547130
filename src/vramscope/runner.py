"""Run a command under the memory monitor: ``vramscope run -- python train.py``.

Replaces ``nvidia-smi ... -l 5 > log.csv &`` + ``pkill``: the sampler lives exactly as long as the
command, watches the command's whole process tree (launchers, workers, dataloader forks), forwards
signals to it, and returns its exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType

from vramscope.analysis.peaks import PeakTracker
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.sampler import DEFAULT_INTERVAL_S, Collector, Sampler
from vramscope.sinks import log_sink
from vramscope.sinks.base import Sink

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


class ProgramNotFoundError(FileNotFoundError):
    """The command to run does not exist or is not executable."""


@dataclass
class RunResult:
    exit_code: int
    peaks: PeakTracker
    log_path: str | None
    duration_s: float
    command: list[str]
    notes: list[str] = field(default_factory=list)
    gpu_error: str | None = None  # why no GPU could be read (no driver, nvidia-ml-py missing), for the summary


def resolve_program(program: str) -> str:
    """The full path of ``program``, or a :class:`ProgramNotFoundError` that says what to check."""
    if os.sep in program:
        if os.path.isfile(program) and os.access(program, os.X_OK):
            return program
        if os.path.exists(program):
            raise ProgramNotFoundError(f"{program} is not an executable file; check its permissions (chmod +x)")
        raise ProgramNotFoundError(f"{program} does not exist; check the path")
    found = shutil.which(program)
    if found is None:
        raise ProgramNotFoundError(f"command not found: {program}; check the name or give its full path")
    return found


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
) -> RunResult:
    """Start ``command``, sample it until it ends, and return its exit code and peaks.

    The log is opened before the command starts, so a bad log path fails without running anything.
    ``max_log_bytes`` rotates it into ``log``, ``log.1``, ``log.2``... (every row kept).
    """
    if not command:
        raise ProgramNotFoundError("no command given; put it after '--', e.g. vramscope run -- python train.py")
    program = resolve_program(command[0])
    sinks: list[Sink] = []
    if log_path is not None:
        sinks.append(log_sink(log_path, fsync=fsync, max_bytes=max_log_bytes))
    peaks = PeakTracker()
    sinks.append(peaks)
    sinks.extend(extra_sinks)

    started = time.monotonic()
    # Signals are caught before the child exists, so that one arriving during start-up is not lost:
    # it is delivered to the child as soon as there is one.
    with _terminal_handed_to_child() as hand_over, _forward_signals() as forwarder:
        child = _spawn([program, *command[1:]], env)
        forwarder.attach(child.pid)
        hand_over(child.pid)
        backend = nvml if nvml is not None else NvmlBackend(gpus=gpus)
        collector = Collector(nvml=backend, host=HostBackend(child.pid))
        sampler = Sampler(collector, sinks, interval=interval)
        sampler.sample_now()
        sampler.start()
        if on_start is not None:
            on_start(child)
        exit_code = _wait(child)
        sampler.close()
    code = exit_code if exit_code >= 0 else 128 - exit_code  # killed by signal N -> 128+N, as shells do
    return RunResult(
        exit_code=code,
        peaks=peaks,
        log_path=log_path,
        duration_s=time.monotonic() - started,
        command=list(command),
        gpu_error=backend.init_error,
    )


def _spawn(argv: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    # Its own process group, so that a forwarded signal reaches its workers too, as a terminal's would.
    if sys.version_info >= (3, 11):
        return subprocess.Popen(argv, env=env, process_group=0)
    return subprocess.Popen(argv, env=env, preexec_fn=os.setpgrp)  # pragma: no cover - Python 3.10


def _wait(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # pragma: no cover - SIGINT is handled by the forwarder
            continue


class _Forwarder:
    """Sends the signals vramscope receives to the child's process group (its workers too)."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.pending: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.pgid is None:
            self.pending.append(signum)
            return
        try:
            os.killpg(self.pgid, signum)
        except ProcessLookupError:
            pass

    def attach(self, pgid: int) -> None:
        self.pgid = pgid
        for signum in self.pending:
            self(signum, None)
        self.pending.clear()


@contextlib.contextmanager
def _forward_signals() -> Iterator[_Forwarder]:
    forwarder = _Forwarder()
    previous = {}
    for sig in FORWARDED_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, forwarder)
        except (ValueError, OSError):  # not the main thread: leave signals alone
            pass
    try:
        yield forwarder
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _terminal_handed_to_child() -> Iterator[Callable[[int], None]]:
    """When run from an interactive terminal, make the child's group the foreground one.

    The child runs in its own process group (so that signals reach its workers); without this, a child
    that reads the terminal would be stopped (SIGTTIN) and Ctrl-C would reach only vramscope.
    """
    fd = None
    original_pgrp = None
    try:
        if sys.stdin is not None and sys.stdin.isatty():
            fd = sys.stdin.fileno()
            original_pgrp = os.tcgetpgrp(fd)
            if original_pgrp != os.getpgrp():
                fd = None  # we run in the background ourselves: leave the terminal alone
    except (OSError, ValueError):
        fd = None

    def hand_over(child_pgid: int) -> None:
        if fd is None:
            return
        with _ignoring(signal.SIGTTOU):
            try:
                os.tcsetpgrp(fd, child_pgid)
            except OSError:
                pass

    try:
        yield hand_over
    finally:
        if fd is not None and original_pgrp is not None:
            with _ignoring(signal.SIGTTOU):
                try:
                    os.tcsetpgrp(fd, original_pgrp)
                except OSError:
                    pass


@contextlib.contextmanager
def _ignoring(sig: signal.Signals) -> Iterator[None]:
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(sig, previous)
