"""A log's columns, read once: numbers as numpy arrays with a known-mask, text as codes into its distinct cells.

A reader hands :class:`LogTable` one :class:`ColumnData` per column: pyarrow's arrays
(:class:`~vramscope.logs.arrow_columns.ArrowColumn`, what a CSV or JSON Lines file holds), numbers it
computed itself (:class:`NumberColumn`, nvidia-smi's bytes and seconds), or the parts of a rotated log
end to end (:class:`JoinedColumn`). A column is converted once, when it is first asked for, and the
arrays are kept: ``int_column`` / ``float_column`` -> :class:`Column`, ``labels`` -> :class:`Labels`. They are
the table's own: read them, do not change them in place.

``ints()`` / ``floats()`` / ``strings()`` (Python lists, None = unknown) and ``raw`` (text, '' =
unknown) are kept for compatibility while the report and the analysis move to the arrays (issue 15):
thin views made from the arrays, not a second reader.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from vramscope.logs import cells as cellparse
from vramscope.logs.arrow_columns import ArrowColumn, labels_of
from vramscope.logs.cells import Column, Labels, unknown_column

if TYPE_CHECKING:  # the formats' table imports the readers, which build tables
    from vramscope.logs.formats import LogFormat

# What a table made in memory (a test's, say) is called: it holds vramscope's own columns (formats.OWN_CSV).
MADE_IN_MEMORY = "vramscope"


class ColumnData(Protocol):
    """One column of a log, before conversion: it can be made into numbers, text or labels."""

    def __len__(self) -> int: ...
    def filled(self) -> bool: ...
    def ints(self) -> Column: ...
    def floats(self) -> Column: ...
    def texts(self) -> list[str | None]: ...
    def labels(self) -> Labels: ...
    def take(self, rows: np.ndarray) -> ColumnData: ...


class NumberColumn:
    """Numbers a reader computed itself; as text, ints read as they are and floats with ``decimals`` places."""

    def __init__(self, column: Column, decimals: int = 3) -> None:
        self.column = column
        self.decimals = decimals

    def __len__(self) -> int:
        return len(self.column)

    def filled(self) -> bool:
        return self.column.any_known()

    def ints(self) -> Column:
        values, known = self.column.values, self.column.known
        if values.dtype == np.int64:
            return Column(_read_only(values), _read_only(known))  # no copy: the table's arrays are read only
        # As the text "1.037" reads as an int: the whole part, within int64.
        whole = known & (np.abs(values) <= cellparse.MAX_CELL_INT)
        return Column(np.where(whole, np.trunc(np.where(whole, values, 0)), 0).astype(np.int64), whole)

    def floats(self) -> Column:
        values = self.column.values
        return Column(_read_only(values) if values.dtype == np.float64 else values.astype(np.float64),
                      _read_only(self.column.known))

    def texts(self) -> list[str | None]:
        values: list[int | float] = self.column.values.tolist()
        known = self.column.known.tolist()
        if self.column.values.dtype == np.int64:
            return [str(v) if k else None for v, k in zip(values, known, strict=True)]
        spec = f".{self.decimals}f"
        return [format(v, spec) if k else None for v, k in zip(values, known, strict=True)]

    def labels(self) -> Labels:
        return labels_of(pa.array(self.texts(), type=pa.string()))

    def take(self, rows: np.ndarray) -> NumberColumn:
        return NumberColumn(Column(self.column.values[rows], self.column.known[rows]), self.decimals)


def _read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be written: the table hands out its arrays, not copies (a million-row
    column copied cost a report more than reading it)."""
    view: np.ndarray = array.view()
    view.flags.writeable = False
    return view


class JoinedColumn:
    """One column of a rotated log: its parts end to end (None for a part without the column)."""

    def __init__(self, parts: Sequence[ColumnData | None], sizes: Sequence[int]) -> None:
        self.parts = list(parts)
        self.sizes = list(sizes)

    def __len__(self) -> int:
        return sum(self.sizes)

    def filled(self) -> bool:
        return any(p is not None and p.filled() for p in self.parts)

    def _numbers(self, dtype: type, how: str) -> Column:
        pieces = [getattr(p, how)() if p is not None else unknown_column(n, dtype)
                  for p, n in zip(self.parts, self.sizes, strict=True)]
        return Column(np.concatenate([c.values for c in pieces]).astype(dtype, copy=False),
                      np.concatenate([c.known for c in pieces]))

    def ints(self) -> Column:
        return self._numbers(np.int64, "ints")

    def floats(self) -> Column:
        return self._numbers(np.float64, "floats")

    def texts(self) -> list[str | None]:
        out: list[str | None] = []
        for part, n in zip(self.parts, self.sizes, strict=True):
            out.extend(part.texts() if part is not None else [None] * n)
        return out

    def labels(self) -> Labels:
        return cellparse.merge_labels([p.labels() if p is not None else Labels(np.full(n, -1, dtype=np.int32), [])
                                       for p, n in zip(self.parts, self.sizes, strict=True)])

    def take(self, rows: np.ndarray) -> JoinedColumn:
        parts: list[ColumnData | None] = []
        sizes = []
        offset = 0
        for part, n in zip(self.parts, self.sizes, strict=True):
            mine = rows[(rows >= offset) & (rows < offset + n)] - offset
            parts.append(part.take(mine) if part is not None else None)
            sizes.append(len(mine))
            offset += n
        return JoinedColumn(parts, sizes)


class LogTable:
    """A log's columns (see the module's docstring) and the format it was read as.

    Args:
        path: the file it was read from.
        columns: header -> the column's data, or its cells as strings ('' = unknown).
        rows: the number of rows (needed only when there are no columns).
        log_format: the format it was read as; a reader leaves it out, and the format's entry sets it
            (:meth:`vramscope.logs.formats.LogFormat.load`). None: made in memory.
    """

    def __init__(self, path: str, columns: Mapping[str, ColumnData | Sequence[str]], rows: int | None = None,
                 log_format: LogFormat | None = None) -> None:
        self.path = path
        self.log_format = log_format
        self._data: dict[str, ColumnData] = {
            name: ArrowColumn.of_texts(data) if isinstance(data, list | tuple) else data  # type: ignore[misc]
            for name, data in columns.items()
        }
        self._rows = rows if rows is not None else len(next(iter(self._data.values()))) if self._data else 0
        self._ints: dict[str, Column] = {}
        self._floats: dict[str, Column] = {}
        self._labels: dict[str, Labels] = {}
        # The compatibility views, made once.
        self._int_lists: dict[str, list[int | None]] = {}
        self._float_lists: dict[str, list[float | None]] = {}
        self._text_lists: dict[str, list[str | None]] = {}
        self._raw_lists: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return self._rows

    @property
    def kind(self) -> str:
        """The format's name ("vramscope", "nvidia-smi", "jsonl", "hand-written", "mapped"), as people read it.

        What a log *is* is asked of :attr:`log_format`'s fields, not of this name."""
        return self.log_format.kind if self.log_format is not None else MADE_IN_MEMORY

    @property
    def columns(self) -> list[str]:
        return list(self._data)

    def column_data(self, column: str) -> ColumnData | None:
        """The column before conversion (a reader joining rotated parts; None when the log lacks it)."""
        return self._data.get(column)

    def has(self, column: str) -> bool:
        """True when the column exists and holds at least one known value."""
        data = self._data.get(column)
        return data is not None and data.filled()

    # -- the arrays -------------------------------------------------------------------------------------

    def int_column(self, column: str) -> Column:
        """The column as int64 numbers with a known-mask (a missing column is all unknown); made once."""
        if column not in self._ints:
            data = self._data.get(column)
            self._ints[column] = data.ints() if data is not None else unknown_column(self._rows, np.int64)
        return self._ints[column]

    def float_column(self, column: str) -> Column:
        """The column as float64 numbers with a known-mask (a missing column is all unknown); made once."""
        if column not in self._floats:
            data = self._data.get(column)
            self._floats[column] = data.floats() if data is not None else unknown_column(self._rows, np.float64)
        return self._floats[column]

    def labels(self, column: str) -> Labels:
        """A text column (phase, time, ...) as codes into its distinct non-empty cells, in order of appearance."""
        if column not in self._labels:
            data = self._data.get(column)
            self._labels[column] = (data.labels() if data is not None
                                    else Labels(np.full(self._rows, -1, dtype=np.int32), []))
        return self._labels[column]

    def gpus(self) -> list[int | None]:
        """The distinct GPU indices in order of appearance (None for host-only rows)."""
        gpu = self.int_column("gpu")
        keys = np.where(gpu.known, gpu.values, np.int64(-(2**63)))  # unknown: a key no index can be
        _, first = np.unique(keys, return_index=True)
        first.sort()
        return [int(gpu.values[i]) if gpu.known[i] else None for i in first.tolist()]

    def select(self, **equals: object) -> LogTable:
        """The rows where each named column equals the value (compared as text; None matches empty)."""
        keep = np.ones(self._rows, dtype=bool)
        for name, value in equals.items():
            want = "" if value is None else str(value)
            if name not in self._data:
                keep &= not want  # a missing column is all empty
                continue
            found = self.labels(name)
            code = -1 if not want else found.names.index(want) if want in found.names else None
            keep &= False if code is None else found.codes == code
        rows = np.flatnonzero(keep)
        return LogTable(self.path, {c: d.take(rows) for c, d in self._data.items()}, rows=len(rows),
                        log_format=self.log_format)

    # -- kept for compatibility (issue 15): list views over the arrays --------------------------------

    def ints(self, column: str) -> list[int | None]:
        """The column as ints, None for empty or unreadable cells (compatibility: prefer :meth:`int_column`)."""
        if column not in self._int_lists:
            self._int_lists[column] = self.int_column(column).tolist()  # type: ignore[assignment]
        return self._int_lists[column]

    def floats(self, column: str) -> list[float | None]:
        """The column as floats, None for empty or unreadable cells (compatibility: prefer :meth:`float_column`)."""
        if column not in self._float_lists:
            self._float_lists[column] = self.float_column(column).tolist()
        return self._float_lists[column]

    def strings(self, column: str) -> list[str | None]:
        """The column as text, None for empty cells (compatibility: prefer :meth:`labels`)."""
        if column not in self._text_lists:
            data = self._data.get(column)
            self._text_lists[column] = data.texts() if data is not None else [None] * self._rows
        return self._text_lists[column]

    def text_cells(self, column: str) -> list[str]:
        """The column's text, '' for unknown (compatibility: what ``raw[column]`` gives)."""
        if column not in self._raw_lists:
            self._raw_lists[column] = ["" if s is None else s for s in self.strings(column)]
        return self._raw_lists[column]

    @property
    def raw(self) -> Mapping[str, list[str]]:
        """Header -> the column's text, '' for unknown (compatibility: tests and the old report read it)."""
        return _RawText(self)


class _RawText(Mapping[str, list[str]]):
    def __init__(self, table: LogTable) -> None:
        self._table = table

    def __getitem__(self, name: str) -> list[str]:
        if name not in self._table.columns:
            raise KeyError(name)
        return self._table.text_cells(name)

    def __contains__(self, name: object) -> bool:
        return name in self._table.columns  # without making the column's text

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.columns)

    def __len__(self) -> int:
        return len(self._table.columns)


def step_series(table: LogTable, column: str, gpu: int | None = None) -> tuple[list[int], list[int]]:
    """(steps, values) of the rows that have a step and a value for ``column`` (one GPU if given)."""
    steps, values = table.int_column("step"), table.int_column(column)
    keep = steps.known & values.known
    if gpu is not None:
        gpus = table.int_column("gpu")
        keep &= gpus.known & (gpus.values == gpu)
    return steps.values[keep].tolist(), values.values[keep].tolist()
