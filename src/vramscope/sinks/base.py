"""What a sink is: something that takes samples, one at a time, and can be closed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from vramscope.types import Sample


@runtime_checkable
class Sink(Protocol):
    """Receives every sample. ``write`` may raise; the sampler reports it once and carries on."""

    def write(self, sample: Sample) -> None: ...

    def close(self) -> None: ...


class LogPathError(ValueError):
    """A log file cannot be created where the user asked."""


def open_log(path: str | os.PathLike[str], append: bool = False) -> IO[str]:
    """Open a log for line-at-a-time writing, with an error that says what to do when it cannot be."""
    target = Path(path)
    if target.is_dir():
        raise LogPathError(f"log path {target} is a directory; give a file name such as {target / 'memory.csv'}")
    if not target.parent.exists():
        raise LogPathError(f"cannot write log {target}: folder {target.parent} does not exist; create it first")
    try:
        # newline="" so that the csv module controls line ends; line buffering is not enough for
        # CSV rows, so sinks flush explicitly after each sample.
        return open(target, "a" if append else "w", encoding="utf-8", newline="")
    except OSError as exc:
        raise LogPathError(f"cannot write log {target}: {exc.strerror or exc}; choose a writable path") from exc
