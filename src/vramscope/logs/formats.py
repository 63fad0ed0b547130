"""The log formats vramscope reads, in one table: how each is recognised, read, and called, and what it says.

A new format is one module with a ``sniff(source) -> bool`` and a ``read(source) -> LogTable`` (see
:class:`~vramscope.logs.source.LogSource`) and one line in :data:`FORMATS` (whose ``called`` the one-line
:func:`refusal` of an unknown file names it by). The table is tried in order
(the first format whose sniff says yes reads the file); :func:`vramscope.logs.reader.read_log` takes
vramscope's own formats, :func:`~vramscope.logs.reader.read_any_log` the imported ones after them.
A reader does not name its format: :meth:`LogFormat.load` sets the table's
:attr:`~vramscope.logs.table.LogTable.log_format`, and whoever asks what a log is (the report, the reader
of rotated parts) reads the entry's fields, never its ``kind`` as a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from vramscope.logs import csv_reader, imports, jsonl_reader, smi_reader
from vramscope.logs.errors import LogFormatError
from vramscope.logs.mapping import EXAMPLE
from vramscope.logs.source import LogSource
from vramscope.logs.table import LogTable

# How the parts a ``--max-log-mb`` rotation wrote (``LOG.1``, ``LOG.2``) join the first: "no" (never
# rotated), "same" (parts of the same format), "same-header" (and the same header line).
Rotated = Literal["no", "same", "same-header"]


@dataclass(frozen=True)
class LogFormat:
    """One format: ``kind`` (its name, as the report shows it), how to recognise it, how to read it, and what it
    says about a log.

    ``rotated``: how a rotation's parts join the first (:data:`Rotated`).
    ``imported``: not written by vramscope (tried only by ``read_any_log``, after vramscope's own).
    ``memory_column_needed``: its sniff sees only names that others' CSVs have too (vramscope's ``time`` and
    ``gpu``), so a file is this format only when it holds one of the memory columns; without one,
    ``read_any_log`` tries the imported formats.
    ``total_from``: what the log's GPU total (``device_total_bytes``) was read from, as the report's caption of
    a device's capacity names it ("GPU total, NVML"): vramscope's sampler reads NVML, nvidia-smi its
    ``memory.total``; a log that vramscope did not write says its own total, read from one of its columns.
    ``called``: how :func:`refusal` names it to someone whose file no format read ("an nvidia-smi --query-gpu
    CSV"); formats called the same are named once. Empty: never named (a format only asked for, as ``MAPPED``).
    """

    kind: str
    sniff: Callable[[LogSource], bool]
    read: Callable[[LogSource], LogTable]
    rotated: Rotated = "no"
    imported: bool = False
    memory_column_needed: bool = False
    total_from: str = "NVML"
    called: str = ""

    def load(self, source: LogSource) -> LogTable:
        """The file read as this format, the table saying so."""
        return self.adopt(self.read(source))

    def adopt(self, table: LogTable) -> LogTable:
        """``table``, marked as read in this format: the one place a table's format is set."""
        table.log_format = self
        return table


def _needs_a_mapping(source: LogSource) -> LogTable:
    raise refusal(source)  # a CSV read "as mapped" without the mapping: what every unknown CSV is told


_NVIDIA_SMI_TOTAL = "nvidia-smi memory.total"
# The user's own log (their loop's, their CSV's): its total is whatever their code wrote in that column.
_HAND_WRITTEN_TOTAL = "your log's total column"  # a header cell naming a total (imports.guess_columns)
_MAPPED_TOTAL = "your log's --columns total= column"
_OWN_LOG = "a vramscope log"
_SMI_CSV = "an nvidia-smi --query-gpu CSV"
# vramscope's CSV: also what a table made in memory (a test's, a live monitor's columns) holds.
OWN_CSV = LogFormat("vramscope", csv_reader.sniff, csv_reader.read_csv, rotated="same-header",
                    memory_column_needed=True, called=_OWN_LOG)
# Any CSV read through a ``--columns`` mapping (``read_any_log``'s ``columns``): never recognised, only asked for.
MAPPED = LogFormat("mapped", lambda _source: False, _needs_a_mapping, imported=True, total_from=_MAPPED_TOTAL)

FORMATS: tuple[LogFormat, ...] = (
    LogFormat("jsonl", jsonl_reader.sniff, jsonl_reader.read, rotated="same", called=_OWN_LOG),
    LogFormat("nvidia-smi", smi_reader.sniff, smi_reader.read, total_from=_NVIDIA_SMI_TOTAL, called=_SMI_CSV),
    OWN_CSV,
    LogFormat("nvidia-smi", imports.sniff_headerless_smi, imports.read_headerless_smi, imported=True,
              total_from=_NVIDIA_SMI_TOTAL, called=_SMI_CSV),
    LogFormat("hand-written", imports.sniff_hand_written, imports.read_hand_written, imported=True,
              total_from=_HAND_WRITTEN_TOTAL, called="a datetime,step,allocated,reserved log"),
)


def format_of(source: LogSource, imported: bool) -> LogFormat | None:
    """The first format that recognises the file (imported ones too when ``imported``)."""
    return next((f for f in FORMATS if (imported or not f.imported) and f.sniff(source)), None)


def refusal(source: LogSource) -> LogFormatError:
    """What no format read, in one line that names every format of :data:`FORMATS` (by its ``called``) and
    ``--columns``."""
    called = list(dict.fromkeys(f.called for f in FORMATS if f.called))
    said = called[-1] if len(called) == 1 else f"{', '.join(called[:-1])} or {called[-1]}"
    return LogFormatError(
        f"{source.name} is not {said} (its first line is {source.header[:80]!r}); read any CSV with {EXAMPLE} "
        "(0-based columns or header names, a unit for each memory column)"
    )
