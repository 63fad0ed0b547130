"""A log column held by pyarrow, made into numpy arrays (:class:`~vramscope.logs.cells.Column`, ``Labels``) when asked.

A column is a list of pieces, each a pyarrow array (int64, float64 or text) or a count of rows that hold
nothing: a log's columns that were never logged (a run without the allocator has eight) then cost no
memory at all, where an int64 array of nulls costs 8 bytes a row.

The schema's number columns are typed (:mod:`vramscope.logs.schema`): their text is their number
(``str`` of the int, ``repr`` of the float), as the sink wrote it. Any other column is text, and its
numbers follow the per-cell rules of :func:`~vramscope.logs.cells.int_of` / ``float_of``: plain cells
(an optional ``-`` and at most 18 digits; digits with at most one ``.``) are cast by pyarrow for the
whole column, and only the other cells that could be numbers at all go through the rules one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from vramscope.logs import cells as cellparse
from vramscope.logs.cells import Column, Labels

Piece: TypeAlias = "pa.Array | int"  # an array, or that many rows with nothing in them
INT64_MIN = -(2**63)  # int_of refuses it (beyond +-MAX_CELL_INT); pyarrow's parser reads it
_PLAIN_INT = r"^-?[0-9]{1,18}$"  # within int64, read alike by pyarrow's cast and int()
_PLAIN_FLOAT = r"^[0-9]{1,15}(\.[0-9]{0,15})?$|^\.[0-9]{1,15}$"  # cast and float() round alike (correctly)
# A cell with any other character is no number for int_of/float_of (letters spell only inf and nan,
# which are not finite): it needs no call.
_MAYBE_NUMBER = r"^[0-9.eE+_\-\s\x0b\x1c-\x1f]{1,64}$"


# Between numpy and pyarrow through buffers: pa.array(), pa.scalar() and Array.to_numpy() import pandas
# when it is installed (pyarrow asks whether the object is a pandas one), a second or more of a report's start.
_NUMPY_OF = {pa.int64(): np.int64, pa.int32(): np.int32, pa.float64(): np.float64}


def numpy_of(array: pa.Array) -> np.ndarray:
    """A copy of an int, float or bool array without nulls, as numpy."""
    data = array.buffers()[1]
    if pa.types.is_boolean(array.type):
        bits = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
        flags: np.ndarray = np.unpackbits(bits, bitorder="little", count=array.offset + len(array))
        return flags[array.offset :].astype(bool)
    dtype = np.dtype(_NUMPY_OF[array.type])
    if data is None or len(array) == 0:
        return np.zeros(len(array), dtype=dtype)
    copied: np.ndarray = np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize).copy()
    return copied


def numpy_filled(array: pa.Array, fill: int) -> np.ndarray:
    """An int array as numpy, its nulls ``fill``: ``pc.fill_null(array, -1)`` without the Python scalar, which
    made pyarrow import pandas (tens of MB and a large part of a second, for a report that never uses it)."""
    values = numpy_of(array)
    if array.null_count:
        values[~numpy_of(pc.is_valid(array))] = fill
    return values


def array_of(values: np.ndarray, known: np.ndarray | None = None) -> pa.Array:
    """int64 or float64 values (their known mask, if any) as a pyarrow array."""
    kind = pa.int64() if values.dtype == np.int64 else pa.float64()
    validity = None if known is None or known.all() else pa.py_buffer(np.packbits(known, bitorder="little"))
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(np.ascontiguousarray(values))])


class ArrowColumn:
    """One column of a log (a :class:`~vramscope.logs.table.ColumnData`), its pieces end to end."""

    def __init__(self, pieces: Sequence[Piece], kind: pa.DataType) -> None:
        self.pieces = list(pieces)
        self.kind = kind
        self._bounds = np.cumsum([0, *(p if isinstance(p, int) else len(p) for p in self.pieces)])  # pieces' starts
        self._rows = int(self._bounds[-1])

    @classmethod
    def of_texts(cls, values: Sequence[str | None]) -> ArrowColumn:
        """Text cells, '' or None for unknown (the csv module's rows, a hand-written log's, tests)."""
        return cls([pa.array([v or None for v in values], type=pa.string())], pa.string())

    @classmethod
    def of_numbers(cls, column: Column) -> ArrowColumn:
        """Numbers already made (int64 or float64 values with their known mask)."""
        array = array_of(column.values, column.known)
        return cls([array], array.type)

    def __len__(self) -> int:
        return self._rows

    def whole(self) -> pa.Array:
        """The column as one array (the empty pieces as nulls)."""
        arrays = [pa.nulls(p, self.kind) if isinstance(p, int) else p for p in self.pieces]
        if not arrays:
            return pa.array([], type=self.kind)
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    def filled(self) -> bool:
        return any(not isinstance(p, int) and p.null_count < len(p) for p in self.pieces)

    def _each(self, convert: type[int] | type[float]) -> Column:
        dtype = np.int64 if convert is int else np.float64
        parts = [cellparse.unknown_column(p, dtype) if isinstance(p, int) else
                 (_ints if convert is int else _floats)(p, self.kind) for p in self.pieces]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cellparse.unknown_column(0, dtype)
        return Column(np.concatenate([c.values for c in parts]), np.concatenate([c.known for c in parts]))

    def ints(self) -> Column:
        return self._each(int)

    def floats(self) -> Column:
        return self._each(float)

    def texts(self) -> list[str | None]:
        if pa.types.is_string(self.kind):
            return self.whole().to_pylist()  # type: ignore[no-any-return]
        column = self.ints() if pa.types.is_integer(self.kind) else self.floats()
        values: list[int | float] = column.values.tolist()
        return [repr(v) if k else None for v, k in zip(values, column.known.tolist(), strict=True)]

    def labels(self) -> Labels:
        if pa.types.is_integer(self.kind):  # int64 cast to text is str() of each: no Python list
            number = self.ints()
            return labels_of(pc.cast(array_of(number.values, number.known), pa.string()))
        if not pa.types.is_string(self.kind):
            return labels_of(pa.array(self.texts(), type=pa.string()))
        if len(self.pieces) == 1 and not isinstance(self.pieces[0], int):
            return labels_of(self.pieces[0])
        return _labels_of_pieces(self.pieces, self._rows)

    def take(self, rows: np.ndarray) -> ArrowColumn:
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        if n == self._rows and (n == 0 or (rows[0] == 0 and rows[-1] == n - 1 and bool((rows[1:] > rows[:-1]).all()))):
            return self  # every row, in order: the same cells (a column is never changed)
        if len(self.pieces) <= 1 or (n and int(rows.min()) < 0):
            return ArrowColumn([self.whole().take(array_of(rows))], self.kind)
        if n == 1 and int(rows[0]) < self._rows:  # one cell (the time of a peak): a slice of its piece, no copy
            at = int(np.searchsorted(self._bounds, rows[0], side="right")) - 1
            piece = self.pieces[at]
            local = int(rows[0] - self._bounds[at])
            return ArrowColumn([1] if isinstance(piece, int) else [piece.slice(local, 1)], self.kind)
        return ArrowColumn([_take_from_pieces(self.pieces, self._bounds, rows, self.kind)], self.kind)


def _take_from_pieces(pieces: Sequence[Piece], bounds: np.ndarray, rows: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The cells of ``rows`` (in their order) from the pieces (starting at ``bounds``), piece by piece: never
    the whole column in one array (a million time stamps copied to read a few thousand of them)."""
    if not len(rows):
        return pa.array([], type=kind)
    if int(rows.max()) >= bounds[-1]:
        raise IndexError(f"row {int(rows.max())} of a column of {int(bounds[-1])} rows")
    which = np.searchsorted(bounds, rows, side="right") - 1
    order = np.argsort(which, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(which[order])) + 1)
    parts = []
    for group in groups:
        at = int(which[group[0]])
        piece = pieces[at]
        parts.append(pa.nulls(len(group), kind) if isinstance(piece, int)
                     else piece.take(array_of(rows[group] - bounds[at])))
    taken = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
    if len(rows) == 1 or bool((rows[1:] >= rows[:-1]).all()):
        return taken  # in order already
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return taken.take(array_of(back))


def _labels_of_pieces(pieces: Sequence[Piece], rows: int) -> Labels:
    """:func:`labels_of` of a column in pieces, without making it one array: pyarrow's dictionary encoding of
    the pieces in turn numbers the texts in order of first appearance, across pieces."""
    arrays = [p for p in pieces if not isinstance(p, int)]
    codes = np.full(rows, -1, dtype=np.int32)
    if not arrays:
        return Labels(codes, [])
    encoded = pa.chunked_array(arrays).dictionary_encode()
    at = 0
    chunks = iter(encoded.chunks)
    for piece in pieces:
        if isinstance(piece, int):
            at += piece
            continue
        indices = next(chunks).indices
        codes[at : at + len(piece)] = numpy_filled(indices, -1).astype(np.int32, copy=False)
        at += len(piece)
    names: list[str] = encoded.chunks[-1].dictionary.to_pylist() if encoded.num_chunks else []
    return Labels(codes, names)


class NumpyColumn:
    """A number column its reader already made into numpy (:class:`Column`): read as an :class:`ArrowColumn`
    of the same cells would be, without a second copy of them.

    ``kind`` is what the cells were read as (int64 or float64); ``odd`` the rows whose cell was there but is no
    number (int64's lowest value, "nan", "inf"): unknown, yet the column counts as filled by them, as pyarrow's
    null count says of an :class:`ArrowColumn`. The arrays are the table's: read-only.
    """

    __slots__ = ("column", "kind", "odd")

    def __init__(self, column: Column, kind: pa.DataType, odd: np.ndarray | None = None) -> None:
        column.values.flags.writeable = False
        column.known.flags.writeable = False
        self.column = column
        self.kind = kind
        self.odd = odd if odd is not None else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.column)

    def filled(self) -> bool:
        return bool(self.odd.size) or self.column.any_known()

    def ints(self) -> Column:
        if pa.types.is_integer(self.kind):
            return self.column
        values, known = self.column.values, self.column.known  # as _ints reads a float column
        whole = known & (np.abs(values) <= cellparse.MAX_CELL_INT)
        return Column(np.trunc(np.where(whole, values, 0)).astype(np.int64), whole)

    def floats(self) -> Column:
        if pa.types.is_floating(self.kind):
            return self.column
        return Column(self.column.values.astype(np.float64), self.column.known)

    def _arrow(self) -> ArrowColumn:
        return ArrowColumn.of_numbers(self.column)

    def texts(self) -> list[str | None]:
        return self._arrow().texts()

    def labels(self) -> Labels:
        return self._arrow().labels()

    def take(self, rows: np.ndarray) -> NumpyColumn:
        odd = np.flatnonzero(np.isin(rows, self.odd)) if self.odd.size else None
        return NumpyColumn(Column(self.column.values[rows], self.column.known[rows]), self.kind, odd)


class NumberBuilder:
    """A number column made from a reader's blocks as they come, straight into numpy: the cells read as
    :class:`ArrowColumn` reads them (:func:`_ints` / :func:`_floats`), without keeping pyarrow's arrays.

    Memory the process touches for the first time is what a report pays for most here (a page fault of a
    fresh page costs about as much as parsing the cells it holds), so nothing is written that need not be:
    the arrays are allocated zeroed for the rows ``capacity`` expects (doubled if more come), a column
    whose every cell is the same number (the GPU's index, its total, the OOM count) is one value
    broadcast, and a known-mask where every cell is known is one True broadcast; an empty block is
    written nowhere.
    """

    def __init__(self, kind: pa.DataType) -> None:
        self.kind = kind
        self.dtype = np.dtype(np.int64 if pa.types.is_integer(kind) else np.float64)
        self.capacity = 0
        self._end = 0  # the rows up to the last block with a cell
        self._same: int | float | None = None  # every row so far is known and holds it
        self._values: np.ndarray | None = None  # once the rows differ (unknown rows hold 0)
        self._known: np.ndarray | None = None  # once a row is unknown
        self._odd: list[np.ndarray] = []

    def add(self, at: int, array: pa.Array) -> None:
        """One block's cells, rows ``at`` on (typed by pyarrow as ``kind``, or text), after the rows before."""
        n = len(array)
        if array.null_count == n:
            return  # nothing in this block: its rows stay zero and unknown
        odd = None
        known: np.ndarray | None = None  # None: every cell of the block is a number
        if pa.types.is_string(array.type):
            number = _ints(array, array.type) if self.dtype == np.int64 else _floats(array, array.type)
            values, known = number.values, number.known
        else:
            values = _values_view(array, self.dtype)
            if array.null_count or not _all_numbers(values):
                known = values != INT64_MIN if self.dtype == np.int64 else np.isfinite(values)
                if array.null_count:
                    valid = numpy_of(pc.is_valid(array))
                    known &= valid
                    odd = valid & ~known
                else:
                    odd = ~known
        every = known is None or bool(known.all())
        if not every and odd is not None and odd.any():  # there, but no number: unknown, yet a filled cell
            self._odd.append(np.flatnonzero(odd) + at)
        self._put(at, values, None if every else known)

    def extend(self, at: int, other: NumberBuilder) -> None:
        """``other``'s rows (a builder of the same kind over the lines after this one's), rows ``at`` on: what
        adding its blocks here would have made. ``other`` is emptied, so that its arrays go as they are copied."""
        if other._values is None and other._same is None:
            return  # no cell in any of its blocks
        n = other._end
        values = (np.broadcast_to(np.array(other._same, dtype=self.dtype), (n,)) if other._values is None
                  else other._values[:n])
        known = None if other._known is None else other._known[:n]
        self._odd.extend(rows + at for rows in other._odd)
        if n:
            self._put(at, values, None if known is None or bool(known.all()) else known)
        other._values = other._known = other._same = None
        other._odd = []

    def _put(self, at: int, values: np.ndarray, known: np.ndarray | None) -> None:
        """Rows ``at`` on hold ``values``; ``known``: which of them are numbers (None: all)."""
        n = len(values)
        every = known is None
        # Rows without a number: the mask is needed; a mask there already grows with the rows (more rows than
        # expected come when the lines get shorter: written past its end, the mask was cut short).
        if at > self._end or not every or self._known is not None:
            self._known_array(at + n)
        if self._known is not None:
            self._known[at : at + n] = True if known is None else known
        if self._values is None and every and at == 0 == self._end and values[0] == values.min() == values.max():
            self._same = values[0].item()  # the first block: one value
        elif self._values is None and self._same is not None and every and self._known is None and (
                values.min() == values.max() == self._same):
            pass  # the same value again
        else:
            target = self._values_array(at + n)
            target[at : at + n] = values
            if not every and known is not None:
                target[at : at + n][~known] = 0
        self._end = at + n

    def _known_array(self, rows: int) -> None:
        if self._known is None:
            self._known = np.zeros(max(rows, self.capacity), dtype=bool)
            self._known[: self._end] = True  # every row before was known
            self._values_array(rows)  # unknown rows hold 0: the value is no longer the same everywhere
        elif rows > len(self._known):
            self._known = _grown(self._known, rows)
            self._values_array(rows)  # the values cover the mask's rows (unknown ones 0)

    def _values_array(self, rows: int) -> np.ndarray:
        if self._values is None:
            self._values = np.zeros(max(rows, self.capacity), dtype=self.dtype)
            if self._same is not None:
                self._values[: self._end] = self._same
                self._same = None
        elif rows > len(self._values):
            self._values = _grown(self._values, rows)
        return self._values

    def column(self, rows: int) -> ArrowColumn | NumpyColumn:
        """The column of ``rows`` rows: nothing kept when no block had a cell."""
        if self._values is None and self._same is None:
            return ArrowColumn([rows] if rows else [], self.kind)
        if rows > self._end:  # empty blocks at the end
            self._known_array(rows)
        values = np.broadcast_to(np.array(self._same, dtype=self.dtype), (rows,)) if self._values is None \
            else self._values[:rows]
        known = np.broadcast_to(np.True_, (rows,)) if self._known is None else self._known[:rows]
        odd = np.concatenate(self._odd) if self._odd else None
        return NumpyColumn(Column(values, known), self.kind, odd)


class TextBuilder:
    """A text column made from a reader's blocks as they come, into one array of its own (numpy's memory): no
    piece per block kept in the allocator's heap, where the blocks' freed buffers around them could not be
    given back (the system allocator's RSS grew by a third of the file). Cells as pyarrow read them."""

    def __init__(self) -> None:
        self.capacity = 0  # rows expected
        self.bytes_per_row = 0.0
        self._end = 0
        self._used = 0  # text bytes written
        self._offsets: np.ndarray | None = None
        self._data: np.ndarray | None = None
        self._valid: np.ndarray | None = None  # once a row is empty (None: every row so far has text)

    def add(self, at: int, array: pa.Array) -> bool:
        """One block's cells, rows ``at`` on; False when the column would pass 2 GiB of text (then: pieces)."""
        n = len(array)
        if array.null_count == n:
            return True  # an empty block: its rows stay empty
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=n + 1, offset=array.offset * 4)
        first, last = int(offsets[0]), int(offsets[-1])
        if self._used + last - first >= 2**31:
            return False
        if self._offsets is None:
            rows = max(at + n, self.capacity)
            self._offsets = np.zeros(rows + 1, dtype=np.int32)
            self._data = np.zeros(int((last - first) / n * rows * 9 / 8) + 4096, dtype=np.uint8)
        self._reserve(at + n, self._used + last - first)
        assert self._offsets is not None and self._data is not None
        self._offsets[self._end + 1 : at + 1] = self._used  # the empty rows between: no text
        if at > self._end or array.null_count or self._valid is not None:  # a mask there grows with the rows
            self._valid_rows(at + n)
        if self._valid is not None:
            self._valid[at : at + n] = numpy_of(pc.is_valid(array)) if array.null_count else True
        if last > first:
            self._data[self._used : self._used + last - first] = np.frombuffer(
                array.buffers()[2], dtype=np.uint8, count=last - first, offset=first)
        self._offsets[at + 1 : at + n + 1] = offsets[1:] - (first - self._used)
        self._used += last - first
        self._end = at + n
        return True

    def _reserve(self, rows: int, used: int) -> None:
        assert self._offsets is not None and self._data is not None
        if rows + 1 > len(self._offsets):
            self._offsets = _grown(self._offsets, rows + 1)
        if used > len(self._data):
            self._data = _grown(self._data, used)

    def _valid_rows(self, rows: int) -> None:
        if self._valid is None:
            assert self._offsets is not None
            self._valid = np.zeros(len(self._offsets) - 1, dtype=bool)
            self._valid[: self._end] = True
        if rows > len(self._valid):
            self._valid = _grown(self._valid, rows)

    def array(self, rows: int) -> pa.Array | None:
        """The column of ``rows`` rows as one string array; None when no block had a cell."""
        if self._offsets is None or self._data is None:
            return None
        self._reserve(rows, self._used)
        self._offsets[self._end + 1 : rows + 1] = self._used
        if rows > self._end:
            self._valid_rows(rows)
        validity = None
        if self._valid is not None:
            validity = pa.py_buffer(np.packbits(self._valid[:rows], bitorder="little"))
        offsets = self._offsets[: rows + 1]
        data = self._data[: self._used]
        return pa.Array.from_buffers(pa.string(), rows, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])


def _grown(array: np.ndarray, rows: int) -> np.ndarray:
    bigger = np.zeros(max(rows, 2 * len(array)), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger


def _all_numbers(values: np.ndarray) -> bool:
    """Every value is a number (no int64 lowest, no NaN or infinity), found by one reduction, no array made:
    a sum of floats is finite only when every float is (an overflow to infinity says no, wrongly but safely:
    the caller then looks cell by cell)."""
    if values.dtype == np.int64:
        return bool(values.min() != INT64_MIN)
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 + 1e308, inf - inf: no warning, just "no"
        return bool(np.isfinite(np.add.reduce(values)))


def _values_view(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """An int64 or float64 array's values as numpy, no copy (a null's slot holds anything)."""
    data = array.buffers()[1]
    view: np.ndarray = np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    return view


class SparseColumn:
    """Text cells of a few of ``rows`` rows (JSON Lines keys that come and go): the rest are unknown.

    The cells are ``cells[lo:hi]``, on rows ``where[lo:hi]`` (increasing), of an array shared by every such
    column of the log: a log whose every row brings a new key then costs the cells in the file and a few
    numbers a key, not rows x keys, nor arrays of its own for each key.
    """

    __slots__ = ("cells", "hi", "lo", "rows", "where")

    def __init__(self, cells: pa.Array, where: np.ndarray, lo: int, hi: int, rows: int) -> None:
        self.cells = cells
        self.where = where
        self.lo, self.hi = lo, hi
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def filled(self) -> bool:
        return bool(self.cells.slice(self.lo, self.hi - self.lo).null_count < self.hi - self.lo)

    def _whole(self) -> ArrowColumn:
        index = np.full(self.rows, -1, dtype=np.int64)
        index[self.where[self.lo : self.hi]] = np.arange(self.lo, self.hi)
        picks = array_of(index, index >= 0)
        return ArrowColumn([self.cells.take(picks)], pa.string())

    def ints(self) -> Column:
        return self._whole().ints()

    def floats(self) -> Column:
        return self._whole().floats()

    def texts(self) -> list[str | None]:
        return self._whole().texts()

    def labels(self) -> Labels:
        return self._whole().labels()

    def take(self, rows: np.ndarray) -> ArrowColumn:
        return self._whole().take(rows)


def labels_of(array: pa.Array) -> Labels:
    """Text cells as codes into their distinct non-null cells, numbered in order of first appearance."""
    names = pc.unique(array.drop_null())
    codes = numpy_filled(pc.index_in(array, value_set=names), -1)
    return Labels(codes.astype(np.int32, copy=False), names.to_pylist())


def _known(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    return numpy_of(pc.is_valid(array))


def _ints(array: pa.Array, kind: pa.DataType) -> Column:
    if pa.types.is_integer(kind):
        values = numpy_of(pc.fill_null(array, 0)).astype(np.int64, copy=False)
        known = _known(array) & (values != INT64_MIN)
        values[~known] = 0
        return Column(values, known)
    if pa.types.is_floating(kind):  # as the text "1.037" reads as an int: the whole part, within int64
        number = _floats(array, kind)
        whole = number.known & (np.abs(number.values) <= cellparse.MAX_CELL_INT)
        return Column(np.trunc(np.where(whole, number.values, 0)).astype(np.int64), whole)
    return numbers_by_rule(array, np.int64, _PLAIN_INT, pa.int64(), cellparse.int_of, _MAYBE_NUMBER)


def _floats(array: pa.Array, kind: pa.DataType) -> Column:
    if pa.types.is_integer(kind):
        number = _ints(array, kind)
        return Column(number.values.astype(np.float64), number.known)
    if pa.types.is_floating(kind):
        values = numpy_of(pc.fill_null(array, 0.0)).astype(np.float64, copy=False)
        known = _known(array) & np.isfinite(values)  # "nan", "inf", "1e999": unknown, as float_of says
        values[~known] = 0.0
        return Column(values, known)
    return numbers_by_rule(array, np.float64, _PLAIN_FLOAT, pa.float64(), cellparse.float_of, _MAYBE_NUMBER)


def numbers_by_rule(array: pa.Array, dtype: type, plain_pattern: str, kind: pa.DataType, one: object,
                    maybe_pattern: str | None = None) -> Column:
    """Text cells as numbers: cells matching ``plain_pattern`` cast for the whole column, the others (those matching
    ``maybe_pattern``; every filled one when None) by ``one``, once per distinct text (a damaged column repeats its
    odd cells)."""
    n = len(array)
    if array.null_count == n:
        return cellparse.unknown_column(n, dtype)
    plain = pc.fill_null(pc.match_substring_regex(array, plain_pattern), False)
    known = numpy_of(plain)
    values: np.ndarray = np.zeros(n, dtype=dtype)
    values[known] = numpy_of(pc.cast(pc.filter(array, plain), kind))
    others = pc.is_valid(array) if maybe_pattern is None else pc.fill_null(
        pc.match_substring_regex(array, maybe_pattern), False)
    odd = np.flatnonzero(numpy_of(pc.and_(pc.invert(plain), others)))
    seen: dict[str, int | float | None] = {}
    for i, text in zip(odd.tolist(), array.take(array_of(odd.astype(np.int64))).to_pylist(), strict=True):
        if text not in seen:
            seen[text] = one(text)  # type: ignore[operator]
        value = seen[text]
        if value is not None:
            values[i] = value
            known[i] = True
    values[~known] = 0
    return Column(values, known)
