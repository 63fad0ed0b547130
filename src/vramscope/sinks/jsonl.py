"""The JSON Lines log: the same rows as the CSV log, one JSON object per line, ``null`` = unknown."""

from __future__ import annotations

import json
import os

from vramscope.schema import sample_rows
from vramscope.sinks.base import open_log
from vramscope.types import Sample


class JsonlSink:
    def __init__(self, path: str | os.PathLike[str], fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self._fsync = fsync
        self._file = open_log(self.path)

    def write(self, sample: Sample) -> None:
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in sample_rows(sample))
        self._file.write(text)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
