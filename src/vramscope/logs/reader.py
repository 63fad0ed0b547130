"""Reading a memory log back, whatever its format (:data:`vramscope.logs.formats.FORMATS`).

The format is decided from the file's first line and head (a UTF-8 BOM skipped); a log rotated by
``--max-log-mb`` is read whole from its first file. The file is read once into columns
(:class:`~vramscope.logs.table.LogTable`); a column becomes numpy arrays the first time it is asked for.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence

from vramscope.logs import formats
from vramscope.logs.errors import LogFormatError
from vramscope.logs.files import log_parts
from vramscope.logs.formats import MAPPED, LogFormat, format_of, own_called, own_refusal, refusal
from vramscope.logs.imports import read_with_columns
from vramscope.logs.mapping import BYTE_FIELDS, ColumnSpec
from vramscope.logs.source import LogSource
from vramscope.logs.table import JoinedColumn, LogTable

_NOT_SPACE = re.compile(rb"[^ \t\n\r\x0b\x0c\x1c-\x1f]")  # what str.isspace() calls space, in ASCII


def read_log(path: str | os.PathLike[str], only: Collection[str] | None = None) -> LogTable:
    """Read one log of vramscope's own formats (or nvidia-smi's CSV), its rotated parts after it.

    ``only``: the columns wanted (a report's :data:`~vramscope.analysis.columns.ANALYSED_COLUMNS`, say); a
    reader that can skip the others (vramscope's CSV) leaves them out of the table. None: every column.

    A vramscope log rotated by ``--max-log-mb`` is read whole from its first file: ``mem.csv`` brings
    ``mem.csv.1``, ``mem.csv.2``, ... after it (up to the first missing one, or one with another header).

    Raises:
        LogFormatError: missing file, empty file, or (:class:`~vramscope.logs.errors.UnknownLogError`) a header that
            none of vramscope's own formats knows, naming each of :data:`~vramscope.logs.formats.FORMATS` and what
            writes it (:func:`~vramscope.logs.formats.own_refusal`).
    """
    name = os.fspath(path)
    with LogSource(name, own_called(), only) as source:
        found = _format(source, imported=False)
        if found is None:
            raise own_refusal(source)
        table = found.load(source)
        header = source.header
    return _with_parts(table, found, header, only)


def read_any_log(path: str | os.PathLike[str], columns: Sequence[ColumnSpec] | None = None,
                 only: Collection[str] | None = None) -> LogTable:
    """Read a log of any format of the table, or any CSV through ``columns``; ``only`` as for :func:`read_log`.

    Raises:
        LogFormatError: the file cannot be read; the message says what was expected and names ``--columns``.
    """
    name = os.fspath(path)
    with LogSource(name, "a memory log (a CSV)", only) as source:
        if columns is not None:
            return MAPPED.adopt(read_with_columns(source, columns))
        found = _format(source, imported=False)
        if found is not None:
            table = found.load(source)
            # Its header recognised, but none of its memory columns (vramscope's "time" and "gpu" alone): someone
            # else's CSV, for the imported formats.
            if not found.memory_column_needed or any(c in BYTE_FIELDS.values() for c in table.columns):
                return _with_parts(table, found, source.header, only)
        found = next((f for f in formats.FORMATS if f.imported and f.sniff(source)), None)
        if found is None:
            raise refusal(source)
        return found.load(source)


def _format(source: LogSource, imported: bool) -> LogFormat | None:
    if _NOT_SPACE.search(source.head) is None and source.size - source.offset <= len(source.head):
        raise LogFormatError(f"log {source.name} is empty; was the run started with --log?")
    return format_of(source, imported)


def _with_parts(table: LogTable, found: LogFormat, header: str, only: Collection[str] | None) -> LogTable:
    """The log's rotated parts after it, while they continue it (same format; same header for a CSV)."""
    if found.rotated == "no":
        return table
    tables = [table]
    for part in log_parts(table.path)[1:]:
        try:
            with LogSource(part, own_called(), only) as source:
                if _format(source, imported=False) is not found or (
                        found.rotated == "same-header" and source.header != header):
                    break  # not a continuation of this log
                tables.append(found.load(source))
        except LogFormatError:  # an empty last part: the writer stopped as it began it
            break
    return tables[0] if len(tables) == 1 else found.adopt(_joined(tables))


def _joined(tables: list[LogTable]) -> LogTable:
    names = list(dict.fromkeys(c for t in tables for c in t.columns))
    sizes = [len(t) for t in tables]
    columns = {c: JoinedColumn([t.column_data(c) for t in tables], sizes) for c in names}
    return LogTable(tables[0].path, columns, rows=sum(sizes))
