"""vramscope's JSON Lines log read into columns: a key's cells are kept as they come, with their rows, in one
pyarrow array for the whole file.

Each key's cells are kept as they come (with their rows once a row lacks the key), never padded per
row: padding every known column for every row made a log whose rows each bring a new key cost rows x
keys cells (a 2.6 MiB file took 2.2 GiB). Memory follows the cells in the file, and a column is made
whole only when it is asked for. A torn or foreign line in the middle (two writers) is skipped.
"""

from __future__ import annotations

import json
from array import array

import numpy as np
import pyarrow as pa

from vramscope.logs.arrow_columns import ArrowColumn, SparseColumn
from vramscope.logs.csv_reader import complete_lines
from vramscope.logs.errors import LogFormatError
from vramscope.logs.schema import COLUMNS
from vramscope.logs.source import LogSource
from vramscope.logs.table import ColumnData, LogTable


def sniff(source: LogSource) -> bool:
    """A JSON object first: ``{`` is the first byte that is not a space."""
    return source.head.lstrip()[:1] == b"{"


def read(source: LogSource) -> LogTable:
    return read_jsonl(source.name, source.data().decode("utf-8", errors="replace"))


def read_jsonl(name: str, text: str) -> LogTable:
    """A JSON Lines log from its text; the schema's columns are always there (empty when never logged)."""
    columns: dict[str, _Cells] = {c: _Cells() for c in COLUMNS}
    count = 0
    for line in complete_lines(text).splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, too many digits, nesting too deep
            continue
        if not isinstance(row, dict):
            continue
        for key, value in row.items():
            column = columns.get(key)
            if column is None:  # a key first met here (even as null) is a column, as it always was
                column = columns[key] = _Cells()
            if value is not None:
                column.add(count, str(value))
        count += 1
    if count == 0:
        raise LogFormatError(f"{name} holds no complete JSON row; is it a vramscope .jsonl log?")
    return LogTable(name, _packed(columns, count), rows=count)


def _packed(columns: dict[str, _Cells], count: int) -> dict[str, ColumnData]:
    """Every key's cells in one pyarrow array; a key on every row is a slice of it, any other a sparse column."""
    shared = pa.array([value for cells in columns.values() for value in cells.values], type=pa.string())
    rows = array("q")  # one array for every key's rows: a numpy array per key would cost more than its cells
    for cells in columns.values():
        rows.extend(cells.rows if cells.rows is not None else range(len(cells.values)))
    where = np.frombuffer(rows, dtype=np.int64) if rows else np.zeros(0, dtype=np.int64)
    out: dict[str, ColumnData] = {}
    lo = 0
    for key, cells in columns.items():
        hi = lo + len(cells.values)
        if cells.rows is None and hi - lo == count:
            out[key] = ArrowColumn([shared.slice(lo, hi - lo)], pa.string())
        else:
            out[key] = SparseColumn(shared, where, lo, hi, count)
        lo = hi
    return out


class _Cells:
    """One key's cells in order of their rows; the rows themselves only once some row lacked the key."""

    __slots__ = ("rows", "values")

    def __init__(self) -> None:
        self.values: list[str] = []
        self.rows: array[int] | None = None  # None: the cells are rows 0, 1, 2, ... (no gap yet)

    def add(self, row: int, value: str) -> None:
        if self.rows is None:
            if len(self.values) == row:
                self.values.append(value)
                return
            self.rows = array("q", range(len(self.values)))
        self.rows.append(row)
        self.values.append(value)
