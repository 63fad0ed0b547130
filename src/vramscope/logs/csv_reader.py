"""vramscope's CSV log read into columns: cells located in the file's bytes, or, when the file needs
quoting rules (quotes, mixed line ends, ragged or blank lines), split by the csv module and packed into
a buffer of the same form. Either way the columns are :class:`~vramscope.logs.table.TextColumn` and
every conversion after that is one code path (:mod:`vramscope.logs.cells`).

A last line cut by a crash is dropped; a row of another width (a torn or foreign line in the middle)
is dropped by the csv module, so that it shifts no column.
"""

from __future__ import annotations

import csv
import io

from vramscope.logs.errors import LogFormatError
from vramscope.logs.locate import locate
from vramscope.logs.schema import FLOAT_COLUMNS, INT_COLUMNS
from vramscope.logs.table import ColumnData, LogTable, TextColumn


def read_csv(name: str, data: bytes) -> LogTable:
    """A vramscope CSV log from its bytes (header first)."""
    located = locate(data)
    if located is not None:
        # The schema's number columns are parsed now, all together (Located.numbers says why); other
        # columns, and these as another type, when they are asked for.
        index = {h: j for j, h in enumerate(located.header)}  # a name twice: the last one wins, as it always did
        kinds = {j: "int" if h in INT_COLUMNS else "float" for h, j in index.items()
                 if h in INT_COLUMNS or h in FLOAT_COLUMNS}
        numbers = located.numbers(kinds)
        columns: dict[str, ColumnData] = {h: TextColumn(located.column(j), numbers.get(j)) for h, j in index.items()}
        return LogTable(name, columns, rows=located.rows)
    header, rows = csv_columns(name, data.decode("utf-8", errors="replace"), "is it a vramscope log?")
    return LogTable(name, dict(zip(header, map(TextColumn.of, rows), strict=True)), rows=len(rows[0]) if rows
                    else 0)


def complete_lines(text: str) -> str:
    """The text up to its last line end: a crash can cut the last line mid-row."""
    if text.endswith("\n"):
        return text
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else ""


def csv_columns(name: str, text: str, hint: str, skip_initial_space: bool = False) -> tuple[list[str], list[list[str]]]:
    """The header and the columns of the complete lines of the header's width, by the csv module.

    Raises:
        LogFormatError: the csv module refuses the text (a cell over its size limit), with ``hint``.
    """
    # newline="": the csv module finds line ends itself (a stray "\r" is then a line end, not an error).
    reader = csv.reader(io.StringIO(complete_lines(text), newline=""), skipinitialspace=skip_initial_space)
    try:
        header = next(reader, [])
        width = len(header)
        columns: list[list[str]] = [[] for _ in header]
        appends = [c.append for c in columns]
        for row in reader:
            if len(row) == width:  # a torn or foreign row would shift every column after it
                for append, cell in zip(appends, row, strict=True):
                    append(cell)
    except csv.Error as exc:  # e.g. a cell over the csv module's size limit: not a log we wrote
        raise LogFormatError(f"{name} cannot be read as CSV ({exc}); {hint}") from None
    return header, columns
