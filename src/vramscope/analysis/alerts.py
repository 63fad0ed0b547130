"""Warnings shown while training: one line each, throttled, and saved beside the log.

A monitor re-analyses every few dozen steps; without a throttle the same "leak" line would flood the
training output. Each kind of warning (``leak``, ``oom``, ``longest_batch``, ``caching``) is shown the
first time, then again only when it got clearly worse (a smaller ``urgency``, e.g. steps to OOM, at
most half of what was last shown) or after ``repeat_s`` seconds. When the condition goes away
(:meth:`Alerts.clear`), its next occurrence is shown at once.

Every shown warning is also appended, as one JSON object per line, to ``<log stem>.warnings.jsonl``,
so it survives the terminal scrollback and reaches ``vramscope report``. A line is a :class:`ShownWarning`
(``to_json``/``from_json``); :func:`read_warnings` reads the file back.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from vramscope.output.names import WARNINGS_SUFFIX, sibling

DEFAULT_REPEAT_S = 600.0


def warnings_path(log_path: str | os.PathLike[str]) -> str:
    """``runs/mem.csv`` -> ``runs/mem.warnings.jsonl`` (the file beside a log)."""
    return sibling(log_path, suffix=WARNINGS_SUFFIX)


@dataclass(frozen=True)
class ShownWarning:
    """One warning shown while training: one line of ``mem.warnings.jsonl``.

    ``time``: when it was shown (Unix seconds); ``step``: the training step it refers to (None: none);
    ``kind``: its family (``leak``, ``oom``, ...; the throttle is per kind); ``message``: the line shown.
    """

    time: float
    step: int | None
    kind: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """The file's line as a JSON object: its keys in the order they have always been written."""
        return {"time": self.time, "step": self.step, "kind": self.kind, "message": self.message}

    @classmethod
    def from_json(cls, data: object) -> ShownWarning:
        """One line read back.

        Raises:
            ValueError: not a JSON object with a number ``time``, a whole ``step`` (or null) and text ``kind`` and
                ``message``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a warning is a JSON object, not {type(data).__name__}")
        at, step, kind, message = (data.get(k) for k in ("time", "step", "kind", "message"))
        if not isinstance(at, (int, float)) or isinstance(at, bool):
            raise ValueError(f"a warning's time is a number of seconds, not {at!r}")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError(f"a warning's step is a whole number or null, not {step!r}")
        if not isinstance(kind, str) or not isinstance(message, str):
            raise ValueError("a warning's kind and message are text")
        return cls(time=at, step=step, kind=kind, message=message)  # as read: an int time stays one


def read_warnings(path: str | os.PathLike[str]) -> list[ShownWarning]:
    """Every warning of a ``mem.warnings.jsonl``, in the order shown.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line that is not a warning (its number says which).
    """
    with open(path, encoding="utf-8") as lines:
        out = []
        for number, line in enumerate(lines, 1):
            try:
                out.append(ShownWarning.from_json(json.loads(line)))
            except ValueError as exc:  # json's own error is a ValueError too
                raise ValueError(f"{os.fspath(path)} line {number}: {exc}") from None
        return out


@dataclass
class _Shown:
    at: float
    message: str
    urgency: float | None


class Alerts:
    """Shows and records throttled one-line warnings.

    Args:
        path: where shown warnings are appended (JSON Lines); None keeps them off disk.
        stream: where they are printed; None prints nothing (they are still recorded).
        repeat_s: the same kind of warning is repeated at most this often, unless it got worse.
        prefix: put before each printed line.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        stream: TextIO | None = sys.stderr,
        repeat_s: float = DEFAULT_REPEAT_S,
        prefix: str = "vramscope: ",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = os.fspath(path) if path is not None else None
        self._stream = stream
        self._repeat_s = repeat_s
        self._prefix = prefix
        self._clock = clock
        self._shown: dict[str, _Shown] = {}
        self.history: list[ShownWarning] = []  # every warning shown, in order
        self.suppressed = 0
        self._failed_write = False

    def warn(self, kind: str, message: str, step: int | None = None, urgency: float | None = None) -> bool:
        """Show ``message`` unless the same kind was shown recently and is not clearly worse.

        Args:
            kind: the warning's family; throttling is per kind.
            message: one line, saying what is wrong and what to do.
            step: the training step it refers to, if any.
            urgency: smaller is worse (steps to OOM, say); halving it shows the warning again.

        Returns:
            True when the warning was shown.
        """
        now = self._clock()
        last = self._shown.get(kind)
        if last is not None:
            worse = urgency is not None and last.urgency is not None and urgency <= last.urgency / 2
            if not worse and now - last.at < self._repeat_s:
                self.suppressed += 1
                return False
        self._shown[kind] = _Shown(now, message, urgency)
        record = ShownWarning(time=time.time(), step=step, kind=kind, message=message)
        self.history.append(record)
        if self._stream is not None:
            where = f"step {step}: " if step is not None else ""
            try:
                print(f"{self._prefix}{where}{message}", file=self._stream, flush=True)
            except (OSError, ValueError):  # a closed stream must not stop training
                pass
        self._record(record)
        return True

    def clear(self, kind: str) -> None:
        """The condition is gone: show its next occurrence at once."""
        self._shown.pop(kind, None)

    def active(self) -> list[str]:
        """Kinds shown and not cleared."""
        return list(self._shown)

    def _record(self, record: ShownWarning) -> None:
        if self.path is None or self._failed_write:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
        except OSError as exc:
            self._failed_write = True
            if self._stream is not None:
                print(f"{self._prefix}cannot save warnings to {self.path} ({exc.strerror}); they are only shown",
                      file=self._stream)
