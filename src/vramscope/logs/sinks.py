"""The log sink: samples to a file (CSV or JSON Lines), chosen by the file's extension."""

from __future__ import annotations

import os

from vramscope.logs.csv_sink import CsvSink
from vramscope.logs.files import (
    LogExistsError,
    LogLockedError,
    LogPathError,
    existing_log_files,
    free_log_name,
    log_parts,
    part_path,
)
from vramscope.logs.jsonl_sink import JsonlSink
from vramscope.types import Sink

__all__ = [
    "CsvSink",
    "JsonlSink",
    "LogExistsError",
    "LogLockedError",
    "LogPathError",
    "Sink",
    "existing_log_files",
    "free_log_name",
    "log_parts",
    "log_sink",
    "part_path",
]


def log_sink(
    path: str | os.PathLike[str], fsync: bool = False, max_bytes: int | None = None, overwrite: bool = True
) -> CsvSink | JsonlSink:
    """A file sink chosen by extension: ``.jsonl``/``.ndjson`` give JSON Lines, anything else CSV.

    ``max_bytes`` rotates the log into ``path``, ``path.1``, ``path.2``... (see :class:`CsvSink`);
    ``overwrite=False`` refuses a log that already holds data.
    """
    if os.fspath(path).endswith((".jsonl", ".ndjson")):
        return JsonlSink(path, fsync=fsync, max_bytes=max_bytes, overwrite=overwrite)
    return CsvSink(path, fsync=fsync, max_bytes=max_bytes, overwrite=overwrite)
