"""Trial children end whole, and a signal to the tuner ends the running one first.

A trial child runs in its own session (so that the terminal's signals reach the tuner alone) and so in its own
process group: whatever it starts, DataLoader workers, torchrun's ranks, a ``sleep`` in a shell script, is in
that group unless it left it. :func:`end_group` ends the child *and* that group, after a normal exit as well as
after a crash, an out-of-memory error or a timeout, so that nothing of one trial holds GPU memory into the next
or outlives the tuner.

:func:`stop_on_signals` makes SIGTERM, SIGHUP (an ssh drop, a scheduler) and SIGINT end the tuner the way an
exception would: the running trial's group is ended and the trial folder removed (by the ``except`` and
``finally`` blocks the signal unwinds through), and then the signal takes its own course: SIGTERM and SIGHUP
are raised again with the caller's handler in place (the default one kills the process, so the shell sees
128+signal), SIGINT leaves as :class:`KeyboardInterrupt`. A signal the caller ignores (``nohup``) stays
ignored. Further signals while that clean-up runs are held, never raised into it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

END_GRACE_S = 5.0  # SIGTERM first: a trainer's own handlers may want to close files; then SIGKILL
_POLL_S = 0.05
_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(BaseException):  # a signal, not an error: a BaseException, as KeyboardInterrupt is
    """The tuner received ``signum``; raised from the signal handler so that ``finally`` blocks clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies waiting for a parent that never reaps
    them, as under a container's bare PID 1, hold nothing and do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member changed its user: it runs
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc: kill(0) is all there is to know
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def end_group(proc: subprocess.Popen[bytes], grace_s: float = END_GRACE_S) -> None:
    """End ``proc`` (the leader of its own process group) and every process left in that group, then reap it.

    SIGTERM to the group, up to ``grace_s`` for the leader to exit and the group to empty, then SIGKILL.
    Returns at once when the leader has exited and its group is empty (the usual end of a trial).
    """
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None and not group_alive(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_alive(pgid):
                return
            time.sleep(_POLL_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


class _Guard:
    """The handlers' state: the first signal raises; later ones, and any inside :func:`held`, wait."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.raised = False
        self.holding = 0

    def handle(self, signum: int, frame: types.FrameType | None) -> None:
        del frame
        if self.signum is None:
            self.signum = signum
        if self.raised or self.holding:
            return
        self.raise_pending()

    def raise_pending(self) -> None:
        if self.signum is None or self.raised:
            return
        self.raised = True
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(self.signum)


_active: _Guard | None = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A signal arriving inside is raised at the end of the block: around ``Popen``, whose child would be left
    running if the handler's exception came between its fork and its return."""
    guard = _active
    if guard is None:
        yield
        return
    guard.holding += 1
    try:
        yield
    finally:
        guard.holding -= 1
    if not guard.holding:
        guard.raise_pending()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM, SIGHUP and SIGINT into exceptions for the block, then let the signal finish the process.

    Outside the main thread (where Python cannot set handlers) or nested, it changes nothing.
    """
    global _active
    try:
        previous: dict[int, Any] = {s: signal.getsignal(s) for s in _SIGNALS}
    except ValueError:
        previous = {}
    if _active is not None or not previous:
        yield
        return
    guard = _Guard()
    installed: dict[int, Callable[..., Any] | int | None] = {}
    try:
        for sig, handler in previous.items():
            if handler is signal.SIG_IGN or handler is None:
                continue  # nohup, a background job: the caller chose to ignore it (None: set outside Python)
            signal.signal(sig, guard.handle)
            installed[sig] = handler
    except ValueError:  # not the main thread
        for sig, handler in installed.items():
            signal.signal(sig, handler)
        yield
        return
    _active = guard
    try:
        yield
    except Stopped:
        pass  # cleaned up: the signal itself finishes below
    finally:
        _active = None
        _restore(installed)
        if guard.signum is not None and guard.signum != signal.SIGINT:
            signal.raise_signal(guard.signum)  # the caller's handler; the default one ends the process here
            raise SystemExit(128 + guard.signum)  # a handler of the caller's returned
        if guard.signum == signal.SIGINT and not guard.raised:
            raise KeyboardInterrupt  # held, and the block then ended by another exception


def _restore(installed: dict[int, Any]) -> None:
    for sig, handler in installed.items():
        signal.signal(sig, handler)
