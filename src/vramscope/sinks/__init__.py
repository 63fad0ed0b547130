"""Where samples go: files (CSV, JSON Lines) and, with the extra, Prometheus."""

from __future__ import annotations

import os

from vramscope.sinks.base import LogPathError, Sink, open_log
from vramscope.sinks.csvlog import CsvSink
from vramscope.sinks.jsonl import JsonlSink

__all__ = ["CsvSink", "JsonlSink", "LogPathError", "Sink", "log_sink", "open_log"]


def log_sink(path: str | os.PathLike[str], fsync: bool = False) -> CsvSink | JsonlSink:
    """A file sink chosen by extension: ``.jsonl``/``.ndjson`` give JSON Lines, anything else CSV."""
    if os.fspath(path).endswith((".jsonl", ".ndjson")):
        return JsonlSink(path, fsync=fsync)
    return CsvSink(path, fsync=fsync)
