"""The log formats vramscope reads, in one table: how each is recognised, read, and called.

A new format is one module with a ``sniff(source) -> bool`` and a ``read(source) -> LogTable`` (see
:class:`~vramscope.logs.source.LogSource`) and one line in :data:`FORMATS`. The table is tried in order
(the first format whose sniff says yes reads the file); :func:`vramscope.logs.reader.read_log` takes
vramscope's own formats, :func:`~vramscope.logs.reader.read_any_log` the imported ones after them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vramscope.logs import csv_reader, imports, jsonl_reader, smi_reader
from vramscope.logs.source import LogSource
from vramscope.logs.table import LogTable


@dataclass(frozen=True)
class LogFormat:
    """One format: ``kind`` (what ``LogTable.kind`` says), how to recognise it, how to read it.

    ``rotated``: how the parts a ``--max-log-mb`` rotation wrote (``LOG.1``, ``LOG.2``) join the first:
    "no" (never rotated), "same" (parts of the same format), "same-header" (and the same header line).
    ``imported``: not written by vramscope (tried only by ``read_any_log``).
    """

    kind: str
    sniff: Callable[[LogSource], bool]
    read: Callable[[LogSource], LogTable]
    rotated: str = "no"
    imported: bool = False


FORMATS: tuple[LogFormat, ...] = (
    LogFormat("jsonl", jsonl_reader.sniff, jsonl_reader.read, rotated="same"),
    LogFormat("nvidia-smi", smi_reader.sniff, smi_reader.read),
    LogFormat("vramscope", csv_reader.sniff, csv_reader.read_csv, rotated="same-header"),
    LogFormat("nvidia-smi", imports.sniff_headerless_smi, imports.read_headerless_smi, imported=True),
    LogFormat("hand-written", imports.sniff_hand_written, imports.read_hand_written, imported=True),
)


def format_of(source: LogSource, imported: bool) -> LogFormat | None:
    """The first format that recognises the file (imported ones too when ``imported``)."""
    return next((f for f in FORMATS if (imported or not f.imported) and f.sniff(source)), None)
