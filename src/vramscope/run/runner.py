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
import errno
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.sinks import CsvSink, JsonlSink, log_sink
from vramscope.sampling.peaks import PeakTracker
from vramscope.sampling.sampler import DEFAULT_INTERVAL_S, Collector, Sampler
from vramscope.types import Sink

log = logging.getLogger("vramscope.runner")  # the logger name users filter on, kept from before the move

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Signals a terminal sends to its whole foreground process group: the command, in our group, has them.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP)
# Stops that mean "the terminal is not yours now": vramscope stops with the command, as a job does.
JOB_CONTROL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
CLEANUP_LIMIT_S = 3.0  # the most vramscope waits for its sinks once the command has ended
ENV_RUN_ID = "VRAMSCOPE_RUN_ID"  # marks every process the command starts, daemons included


class ProgramNotFoundError(FileNotFoundError):
    """The command could not be started; :attr:`exit_code` is the shell's code for why (127 or 126)."""

    def __init__(self, message: str, exit_code: int = 127) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # 127: not found (or a bad interpreter); 126: found but cannot be run


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


def resolve_program(program: str) -> str:
    """The path of ``program`` to exec, or a :class:`ProgramNotFoundError` with the shell's exit code."""
    if os.sep in program:
        if os.path.isdir(program):
            raise ProgramNotFoundError(f"{program} is a directory; give the program to run", exit_code=126)
        if os.path.isfile(program) and os.access(program, os.X_OK):
            return program
        if os.path.exists(program):
            raise ProgramNotFoundError(f"{program} is not an executable file; check its permissions (chmod +x)",
                                       exit_code=126)
        raise ProgramNotFoundError(f"{program} does not exist; check the path")
    found = shutil.which(program)
    if found is None:
        # As the shell: a file of that name on PATH that cannot be executed is 126, not "not found".
        for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or os.curdir, program)
            if os.path.isfile(candidate):
                raise ProgramNotFoundError(f"{candidate} is not an executable file; check its permissions "
                                           "(chmod +x)", exit_code=126)
        raise ProgramNotFoundError(f"command not found: {program}; check the name or give its full path")
    return found


def inherited_fds() -> tuple[int, ...]:
    """The file descriptors above 2 this process inherited and would pass on at exec (not close-on-exec).

    ``bash -c 'echo hi >&3' 3>f``, MPI's ``PMI_FD``, make's jobserver, systemd's socket activation:
    the command must get them as it would without vramscope. Call it before vramscope opens anything
    (NVML's device files are opened without close-on-exec by the driver library).
    """
    fds = []
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if not name.isdigit() or int(name) <= 2:
                continue
            try:
                if os.get_inheritable(int(name)):
                    fds.append(int(name))
            except OSError:  # the listing's own descriptor, closed by now
                continue
        break
    return tuple(sorted(fds))


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
    with _forward_signals() as (forwarder, handlers):
        try:
            child = _spawn(program, list(command), child_env, keep_fds)
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
        status = _wait(child, forwarder)
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


def _spawn(program: str, command: list[str], env: dict[str, str], pass_fds: Sequence[int]) -> subprocess.Popen[bytes]:
    """Start the command as a shell would exec it; exec errors become the shell's exit codes.

    ``argv[0]`` is the name as typed (``executable`` is the path found). SIGPIPE and SIGXFSZ start at
    their defaults (``restore_signals``): what the caller had cannot be known inside Python, which
    ignores both before any of its code runs, and the default is what every shell gives a command.
    """
    descriptors = tuple(fd for fd in pass_fds if _still_inheritable(fd))
    try:
        return subprocess.Popen(command, executable=program, env=env, pass_fds=descriptors)
    except OSError as exc:
        if exc.errno == errno.ENOEXEC:  # no #! line: the shell runs it with /bin/sh, and so do we
            if _looks_binary(program):  # ... unless it is a binary of another kind, as bash tells them apart
                raise ProgramNotFoundError(f"cannot execute binary file {command[0]}: Exec format error",
                                           exit_code=126) from None
            try:
                return subprocess.Popen(["/bin/sh", program, *command[1:]], env=env, pass_fds=descriptors)
            except OSError as again:
                raise ProgramNotFoundError(f"cannot run {command[0]} with /bin/sh: {again.strerror}",
                                           exit_code=126) from None
        if exc.errno == errno.ENOENT:  # the program exists (it was found): its #! interpreter does not
            raise ProgramNotFoundError(f"{command[0]}: bad interpreter {_interpreter(program)!r}: no such "
                                       "program; fix the script's #! line", exit_code=127) from None
        raise ProgramNotFoundError(f"cannot execute {command[0]}: {exc.strerror or exc}", exit_code=126) from None


def _still_inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False


def _looks_binary(program: str) -> bool:
    """A NUL byte before the first line end of the first 80 bytes: not a script (bash's test)."""
    try:
        with open(program, "rb") as handle:
            head = handle.read(80)
    except OSError:
        return False
    return b"\0" in head.partition(b"\n")[0]


def _interpreter(program: str) -> str:
    """The program a script's ``#!`` line names (for the message of a bad interpreter)."""
    try:
        with open(program, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return "?"
    if not first.startswith(b"#!"):
        return "?"
    words = first[2:].split()
    return words[0].decode(errors="replace") if words else "?"


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


def _wait(child: subprocess.Popen[bytes], forwarder: _Forwarder) -> int:
    """Wait for the command to end; returns its status as Popen does (-N: killed by signal N).

    A command stopped for job control (Ctrl-Z, or reading the terminal from the background) stops
    vramscope too, so the shell sees its whole job stopped and gives the prompt back; on ``fg`` or
    ``bg`` both continue.
    """
    while True:
        try:
            pid, status = os.waitpid(child.pid, os.WUNTRACED)
        except ChildProcessError:  # reaped elsewhere: Popen knows
            return child.wait()
        if pid != child.pid:
            continue
        if os.WIFSTOPPED(status):
            # Still stopped? A Ctrl-Z stops vramscope by its own handler, and after `fg` the report of
            # the command's stop may come late, when it runs again: then there is nothing to follow.
            if os.WSTOPSIG(status) in JOB_CONTROL_STOPS and not forwarder.stopping and _is_stopped(child.pid):
                forwarder.stop_with_the_command()
            continue
        code = os.waitstatus_to_exitcode(status)
        child.returncode = code
        return code


def _takes_the_default(pid: int, signum: int) -> bool:
    """Whether ``pid`` neither ignores nor catches ``signum`` (its SigIgn and SigCgt in /proc); True if unknown."""
    bit = 1 << (signum - 1)
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            masks = {key: int(value, 16) for key, _, value in (line.partition(b":") for line in handle)
                     if key in (b"SigIgn", b"SigCgt")}
    except (OSError, ValueError):
        return True
    return not any(mask & bit for mask in masks.values())


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[:1] == [b"T"]
    except OSError:
        return False


class _Forwarder:
    """Passes the signals vramscope receives from elsewhere on to the command, once, as exec would.

    Only the command itself gets them: a launcher (torchrun, a nested ``vramscope run``) forwards to its
    workers itself, and a DataLoader worker is not sent a USR1 meant for the main process. Signals from
    the terminal (Ctrl-C, Ctrl-\\, Ctrl-Z) already reached the command, which is in the terminal's
    foreground process group with vramscope: forwarding them would deliver them twice.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.ended = False
        self.abandon = threading.Event()  # set by a signal once the command has ended
        self.stopping = False
        self.ignored_at_start: set[int] = set()  # the caller's ignored signals: the command starts with them ignored
        self._tty: int | None = None
        with contextlib.suppress(OSError):
            self._tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.ended:  # the command is gone: a signal now means "stop waiting for the sinks"
            if signum in self.ignored_at_start or signum == signal.SIGCONT:
                return  # the caller asked vramscope to ignore it; SIGCONT is `fg` or `bg`
            self.abandon.set()
            if signum == signal.SIGTSTP:
                self._stop_self()
            return
        if self.pid is None:
            self.pending.append(signum)
            return
        if signum == signal.SIGCONT:
            # vramscope was continued by the kernel; so was the command if it came to the whole job (`fg`).
            if _is_stopped(self.pid):
                self._send(signum)
            return
        if not (signum in TERMINAL_SIGNALS and self._in_terminal_foreground()):
            self._send(signum)
        if signum == signal.SIGTSTP and _takes_the_default(self.pid, signum):
            # The kernel stops the command as soon as it can: stop with it now. (At once, because a shell
            # caught in vfork, its child stopped before exec, cannot stop until `fg`: the job would hang.)
            self._stop_self()
        # A command that ignores or catches SIGTSTP is followed instead (see _wait): vramscope stops when it
        # stops, so a command that ignores Ctrl-Z keeps its monitor and the shell its foreground job.

    def _send(self, signum: int) -> None:
        assert self.pid is not None
        with contextlib.suppress(OSError):
            os.kill(self.pid, signum)

    def _in_terminal_foreground(self) -> bool:
        if self._tty is None:
            return False
        try:
            return os.tcgetpgrp(self._tty) == os.getpgrp()
        except OSError:
            return False

    def stop_with_the_command(self) -> None:
        """The command stopped for job control: stop vramscope too, then continue the command with it."""
        self._stop_self()
        if self.pid is not None and _is_stopped(self.pid):  # `kill -CONT` to vramscope alone
            self._send(signal.SIGCONT)

    def _stop_self(self) -> None:
        self.stopping = True
        try:
            os.kill(os.getpid(), signal.SIGSTOP)  # returns once continued (fg, bg, kill -CONT)
        finally:
            self.stopping = False

    def attach(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            self(signum, None)
        self.pending.clear()

    def child_ended(self) -> None:
        self.ended = True

    def close(self) -> None:
        if self._tty is not None:
            with contextlib.suppress(OSError):
                os.close(self._tty)
            self._tty = None


class _SignalHandlers:
    """Installs the forwarder for every signal it passes on, and puts the caller's handlers back."""

    def __init__(self, forwarder: _Forwarder) -> None:
        self._forwarder = forwarder
        self._previous: dict[int, Any] = {}

    def install(self, *, ignored: bool) -> None:
        """``ignored=False`` before the command starts; ``True`` after, for the signals ignored now.

        A signal the caller ignores (``nohup``, ``cmd &`` in a script: SIGINT and SIGQUIT) must be
        ignored when the command starts, as it would be without vramscope (a handler here would be
        reset to the default at exec); once the command runs, vramscope catches it too and passes it
        on, so that a command that installs its own handler gets the ``kill -INT`` sent to the job.
        """
        for sig in (*FORWARDED_SIGNALS, signal.SIGTSTP, signal.SIGCONT):
            if sig in self._previous:
                continue
            try:
                is_ignored = signal.getsignal(sig) == signal.SIG_IGN
                if is_ignored != ignored:
                    continue
                if is_ignored:
                    self._forwarder.ignored_at_start.add(sig)
                self._previous[sig] = signal.signal(sig, self._forwarder)
            except (ValueError, OSError):  # not the main thread: leave signals alone
                return

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)


@contextlib.contextmanager
def _forward_signals() -> Iterator[tuple[_Forwarder, _SignalHandlers]]:
    forwarder = _Forwarder()
    handlers = _SignalHandlers(forwarder)
    handlers.install(ignored=False)
    try:
        yield forwarder, handlers
    finally:
        handlers.restore()
        forwarder.close()


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
