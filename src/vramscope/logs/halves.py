"""A large log read in two halves at once, each on a core of its own.

A report of a day's log (a million rows) is mostly its read, and pyarrow parses without Python's lock: the
lines are split at a line's start near the middle (:func:`halves`), each half is parsed on a thread of its
own (:func:`read_at_once`: the caller's thread takes the first), and the reader puts the second half's
columns after the first's. On two cores the read's wall time about halves; its CPU time stays as it was.
A small file, or a process that may run on one core only, is read as one stream.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from vramscope.logs.source import BOM, LineStream, LogSource

# Lines past this size are read in two halves: below it the second thread's start is no longer small beside
# the parse (a 4 MiB log's read takes about 10 ms).
SPLIT_FROM = 4 << 20
# The most lines looked at from the middle on for one the second half may start at (_may_start): past them the
# log is read as one stream.
_LOOK_LINES = 64

T = TypeVar("T")


def cores() -> int:
    """The cores this process may run on (a container's, a taskset's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def halves(source: LogSource, start: int) -> list[LineStream]:
    """The file's complete lines from ``start``: one stream, or two split at a line's start near the middle when
    there are :data:`SPLIT_FROM` bytes of them or more and two cores to read them (the first line from the middle
    on that the second may start at, :func:`_may_start`)."""
    body = source.last_line_end - start
    if body < SPLIT_FROM or cores() < 2:
        return [source.lines(start)]
    middle = source.line_start_after(start + body // 2)
    commas = source.header.count(",")
    for _ in range(_LOOK_LINES):
        if middle >= source.last_line_end:
            break
        if _may_start(source.line_at(middle), commas):
            return [source.lines(start, middle), source.lines(middle)]
        middle = source.line_start_after(middle)
    return [source.lines(start)]


def _may_start(line: bytes, commas: int) -> bool:
    """Whether the second half may start at ``line``: pyarrow drops a UTF-8 BOM at a stream's start, so a line that
    begins with one (a log put after another by cat) would lose it from its first cell, which the one stream keeps;
    and a stream that starts on rows of another width is parsed on pyarrow's own thread, where the Python call that
    skips each costs ten times as much (a log's last half of such rows read 0.23 s as one stream, 2.1 s in halves)."""
    return not line.startswith(BOM) and line.count(b",") == commas


def read_at_once(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Every job's result, in order: the first job run in the caller's thread, each other on a thread of its own
    at the same time. The first failure (in job order) is raised once all have ended."""
    results: list[T | None] = [None] * len(jobs)
    failures: list[BaseException | None] = [None] * len(jobs)

    def run(k: int) -> None:
        try:
            results[k] = jobs[k]()
        except BaseException as exc:  # raised in the caller's thread, below
            failures[k] = exc

    workers = [threading.Thread(target=run, args=(k,), name=f"vramscope-log-read-{k}", daemon=True)
               for k in range(1, len(jobs))]
    for worker in workers:
        worker.start()
    if jobs:
        run(0)
    if jobs and isinstance(failures[0], KeyboardInterrupt):
        # Ctrl-C in the caller's half: raised now, not after the other half's parse (a second or more of a
        # large log); its daemon thread ends with the process, or on the closed file when the caller goes on.
        raise failures[0]
    for worker in workers:
        worker.join()
    for failure in failures:
        if failure is not None:
            raise failure
    return cast("list[T]", results)  # every job ended without a failure: each result is set
