"""A text column of a few distinct cells (a vramscope log's phase) held as codes into its names.

pyarrow reads such a column as its dictionary type (each block: int32 indices into that block's distinct
cells), which costs less than text (no copy of each cell); :class:`LabelBuilder` puts the blocks' codes
end to end, numbered across the whole column in order of first appearance, which is what
:func:`~vramscope.logs.arrow_columns.labels_of` makes of the same cells as text. :class:`LabelColumn` then
answers as an :class:`~vramscope.logs.arrow_columns.ArrowColumn` of those cells would: the same texts,
labels and numbers (the per-cell rules, applied once per distinct cell).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from vramscope.logs.arrow_columns import ArrowColumn, _floats, _ints, numpy_filled
from vramscope.logs.cells import Column, Labels

LABEL_TYPE = pa.dictionary(pa.int32(), pa.string())


class LabelBuilder:
    """One label column made from a reader's blocks (pyarrow dictionary arrays) as they come."""

    def __init__(self) -> None:
        self.capacity = 0  # rows expected
        self._codes: np.ndarray | None = None  # -1: no text (an empty cell, or a block without one)
        self._index: dict[str, int] = {}
        self._names: list[str] = []

    def add(self, at: int, array: pa.DictionaryArray) -> None:
        """One block's cells, rows ``at`` on, after the rows before."""
        n = len(array)
        if array.null_count == n:
            return  # an empty block: its rows stay -1
        local = numpy_filled(array.indices, -1)
        names = array.dictionary.to_pylist()
        # The block's names that occur, in order of their first row: new ones are numbered in that order.
        remap = np.full(len(names) + 1, -1, dtype=np.int32)  # the last entry: what -1 picks
        for k in _in_order_of_first_row(local, len(names)):
            remap[k] = self._index.setdefault(names[k], len(self._index))
        self._names = list(self._index)
        if self._codes is None:
            self._codes = np.full(max(at + n, self.capacity), -1, dtype=np.int32)
        elif at + n > len(self._codes):
            self._codes = _grown(self._codes, at + n)
        self._codes[at : at + n] = remap[local]

    def extend(self, at: int, other: LabelBuilder, rows: int) -> None:
        """``other``'s ``rows`` rows (a builder over the lines after this one's), rows ``at`` on: its names numbered on
        after this one's, in its order of first appearance, as adding its blocks here would have. ``other`` is
        emptied."""
        if other._codes is None:
            return  # no cell in any of its blocks
        remap = np.full(len(other._names) + 1, -1, dtype=np.int32)  # the last entry: what -1 picks
        for k, name in enumerate(other._names):
            remap[k] = self._index.setdefault(name, len(self._index))
        self._names = list(self._index)
        codes = other._codes[:rows]
        end = at + len(codes)
        if self._codes is None:
            self._codes = np.full(max(end, self.capacity), -1, dtype=np.int32)
        elif end > len(self._codes):
            self._codes = _grown(self._codes, end)
        self._codes[at:end] = remap[codes]
        other._codes = None

    def column(self, rows: int) -> LabelColumn | ArrowColumn:
        """The column of ``rows`` rows; an empty text column (a count of rows) when no block had a cell."""
        if self._codes is None:
            return ArrowColumn([rows] if rows else [], pa.string())
        if rows > len(self._codes):
            self._codes = _grown(self._codes, rows)
        return LabelColumn(self._codes[:rows], self._names, numbered=True)


def _in_order_of_first_row(local: np.ndarray, names: int) -> list[int]:
    """The codes (0 to ``names`` - 1) that occur in ``local``, in order of their first row. A few names (a phase's):
    each one's first row by one comparison and argmax, cheaper than sorting the block (np.unique)."""
    if names <= 8:
        firsts = []
        for k in range(names):
            hit = local == k
            at = int(np.argmax(hit))
            if hit[at]:
                firsts.append((at, k))
        return [k for _, k in sorted(firsts)]
    seen, first = np.unique(local[local >= 0], return_index=True)
    ordered: list[int] = seen[np.argsort(first, kind="stable")].tolist()
    return ordered


def _grown(codes: np.ndarray, rows: int) -> np.ndarray:
    bigger = np.full(max(rows, 2 * len(codes)), -1, dtype=np.int32)
    bigger[: len(codes)] = codes
    return bigger


class LabelColumn:
    """Codes (int32, -1: no text) into ``names``; ``numbered``: every name occurs, numbered in order of first
    appearance (as the builder makes it), so that the codes are already the column's labels. The arrays are
    the table's: read-only."""

    __slots__ = ("codes", "names", "numbered")

    def __init__(self, codes: np.ndarray, names: list[str], numbered: bool = False) -> None:
        codes.flags.writeable = False
        self.codes = codes
        self.names = names
        self.numbered = numbered

    def __len__(self) -> int:
        return len(self.codes)

    def filled(self) -> bool:
        return bool(len(self.codes)) and int(self.codes.max()) >= 0

    def labels(self) -> Labels:
        if self.numbered:
            return Labels(self.codes, list(self.names))
        known = self.codes >= 0
        seen, first = np.unique(self.codes[known], return_index=True)
        order = seen[np.argsort(first, kind="stable")]
        remap = np.full(len(self.names) + 1, -1, dtype=np.int32)
        remap[order] = np.arange(len(order), dtype=np.int32)
        return Labels(remap[self.codes], [self.names[k] for k in order.tolist()])

    def texts(self) -> list[str | None]:
        lookup: list[str | None] = [*self.names, None]
        return [lookup[c] for c in self.codes.tolist()]

    def _numbers(self, convert: type[int] | type[float]) -> Column:
        names = pa.array(self.names, type=pa.string())
        each = _ints(names, names.type) if convert is int else _floats(names, names.type)
        values = np.append(each.values, each.values.dtype.type(0))  # code -1: unknown, 0
        known = np.append(each.known, False)
        return Column(values[self.codes], known[self.codes])

    def ints(self) -> Column:
        return self._numbers(int)

    def floats(self) -> Column:
        return self._numbers(float)

    def take(self, rows: np.ndarray) -> LabelColumn:
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        in_order = n == 0 or (rows[0] == 0 and rows[-1] == n - 1 and bool((rows[1:] > rows[:-1]).all()))
        if n == len(self.codes) and in_order:
            return self  # every row, in order: the same cells (a column is never changed)
        return LabelColumn(self.codes[rows], self.names)
