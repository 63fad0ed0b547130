"""The JSON Lines log: the same rows as the CSV log, one JSON object per line, ``null`` = unknown.

Written like the CSV log (a sample at a time, straight to the OS, rotation with ``max_bytes``).
"""

from __future__ import annotations

import json
import os

from vramscope.logs.files import LogFile
from vramscope.logs.schema import sample_rows
from vramscope.types import Sample


class JsonlSink:
    """Writes the JSON Lines log.

    Args:
        path: the file; created (or truncated) on construction.
        fsync: force every sample's rows to the disk.
        max_bytes: rotate to ``path.1``, ``path.2``, ... before a file would grow past this.
        overwrite: replace a log that exists and holds data (False: refuse it with ``LogExistsError``).

    Raises:
        LogPathError: the file cannot be created, with what to do.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fsync: bool = False,
        max_bytes: int | None = None,
        overwrite: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self._log = LogFile(self.path, max_bytes=max_bytes, fsync=fsync, overwrite=overwrite)

    @property
    def parts(self) -> int:
        """How many files the log spans so far (1 until it rotates)."""
        return self._log.part + 1

    def write(self, sample: Sample) -> None:
        self._log.append("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in sample_rows(sample)))

    def close(self) -> None:
        self._log.close()
