"""The signals of ``vramscope run``: passed on to the command once, as if vramscope had exec'd it.

The command runs in vramscope's process group (one job), so the terminal's Ctrl-C, Ctrl-\\ and Ctrl-Z
reach it directly; a signal sent to vramscope from elsewhere is passed on to the command itself (never to
its descendants: a launcher forwards to its workers itself). vramscope follows the command's job-control
state: it stops with the command, so that the shell gets its prompt back, and not otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Signals a terminal sends to its whole foreground process group: the command, in our group, has them.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP)
# Stops that mean "the terminal is not yours now": vramscope stops with the command, as a job does.
JOB_CONTROL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def wait_for_command(child: subprocess.Popen[bytes], forwarder: Forwarder) -> int:
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


class Forwarder:
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


class SignalHandlers:
    """Installs the forwarder for every signal it passes on, and puts the caller's handlers back."""

    def __init__(self, forwarder: Forwarder) -> None:
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
def forward_signals() -> Iterator[tuple[Forwarder, SignalHandlers]]:
    forwarder = Forwarder()
    handlers = SignalHandlers(forwarder)
    handlers.install(ignored=False)
    try:
        yield forwarder, handlers
    finally:
        handlers.restore()
        forwarder.close()
