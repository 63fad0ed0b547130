"""A text column's cells, found in a buffer of bytes, made into numbers, text or labels for the whole column.

Every reader of this package ends in :class:`CellRanges`: cell ``i`` is ``data[starts[i]:ends[i]]`` (an
empty range is an unknown cell). A vramscope CSV points into the file's own bytes (:mod:`.locate`); the
csv module's rows, JSON Lines values and hand-written logs are packed into a buffer of their own
(:func:`pack`). The conversions are then one code path for every format:

* numbers are parsed from the bytes with whole-column numpy operations wherever a cell is plain
  (digits, at most one ``.``), and only the other cells ("-4", "1.5e9", "1024.0", damage) go through
  :func:`int_of` / :func:`float_of` one by one. Both give the same value for a plain cell: an integer of at
  most 16 digits is exact in int64, and ``m / 10**k`` with ``m`` below 2**53 is one correctly rounded
  IEEE division, the float that ``float(cell)`` gives;
* text and labels are copied out of the buffer in whole-column gathers.

A cell is a number only when it is ASCII and within int64 (:func:`int_of`): a 400-digit cell from a
damaged or hostile log would overflow every float the analysis makes of it, and ``int()`` also reads
other scripts' digits ("٤"), which no writer of these logs produces. Such cells are unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import isfinite
from typing import Protocol

import numpy as np

MAX_CELL_INT = 2**63 - 1
# A packed buffer starts with this many bytes of padding, so that every cell has 16 bytes before its
# end: the integer parser reads two 8-byte words back from a cell's end.
PAD = 16
_ZERO = 48
_DOT_LESS_ZERO = (46 - _ZERO) % 256  # '.' as a digit window holds it (uint8 bytes less '0')
_INT_DIGITS = 16  # two 8-byte words; 10**16 bytes is 10 PB
_FLOAT_DIGITS = 15  # 10**15 < 2**53: the mantissa is exact in a double
_POW10 = 10 ** np.arange(_FLOAT_DIGITS + 2, dtype=np.int64)
_POW10_FLOAT = 10.0 ** np.arange(_FLOAT_DIGITS + 1)
# _KEEP_HIGH_BYTES[k]: a mask of the k highest bytes of a uint64 (the last k bytes of 8 read little-endian).
_KEEP_HIGH_BYTES = np.array([~((1 << (8 * (8 - k))) - 1) & (2**64 - 1) for k in range(9)], dtype=np.uint64)
_ASCII_ZEROS = np.uint64(0x3030303030303030)
_BELOW_0X80_IF_AT_MOST_9 = np.uint64(0x4646464646464646)
_BIT7 = np.uint64(0x8080808080808080)
# Digit bytes d0 d1 ... d7 (d0 lowest) into one number: adjacent bytes into 2-digit lanes (d0 * 10 + d1),
# those into 4-digit lanes, then 8: each step masks the lanes, multiplies by 1 + 10^k << lane, and shifts.
_COMBINE = [
    (np.uint64(0x0F0F0F0F0F0F0F0F), np.uint64(10 * 2**8 + 1), np.uint64(8)),
    (np.uint64(0x00FF00FF00FF00FF), np.uint64(100 * 2**16 + 1), np.uint64(16)),
    (np.uint64(0x0000FFFF0000FFFF), np.uint64(10000 * 2**32 + 1), np.uint64(32)),
]
# Text is copied out this many rows at a time: the gather's index costs 8 bytes per byte copied.
_TEXT_CHUNK_ROWS = 1 << 16
# Bytes that may end each cell when a column's text is packed for one split; the first not found in
# the column's cells is used.
_SEPARATORS = (b",", b"\n", b"\x00", b"\x1f")
# Labels are found by sorting the cells' keys up to this width; wider text is coded by a dict.
_LABEL_WIDTH = 64
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd: a bijective mixing step


@dataclass(frozen=True)
class Column:
    """One log column as numbers for whole-column work: ``values[i]`` means something only where ``known[i]``.

    Unknown cells (empty, damaged, out of range) hold 0 in ``values``; ``values`` is int64 for the byte,
    step and count columns and float64 for seconds.
    """

    values: np.ndarray
    known: np.ndarray  # bool, one per row

    def __len__(self) -> int:
        return len(self.values)

    def any_known(self) -> bool:
        return bool(self.known.any())

    def all_known(self) -> bool:
        return bool(self.known.all())

    def tolist(self) -> list[int | float | None]:
        """The cells as Python numbers, None where unknown (the JSON edge, tests)."""
        if self.known.all():
            return self.values.tolist()  # type: ignore[no-any-return]
        if not self.known.any():
            return [None] * len(self.values)
        out = np.full(len(self.values), None, dtype=object)
        out[self.known] = self.values[self.known].tolist()
        return out.tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Labels:
    """A text column as codes into its distinct cells: ``names[codes[i]]``, code -1 for an empty cell."""

    codes: np.ndarray  # int32
    names: list[str]

    def __len__(self) -> int:
        return len(self.codes)

    def tolist(self) -> list[str | None]:
        table: list[str | None] = [*self.names, None]  # code -1 picks the None at the end
        return [table[c] for c in self.codes.tolist()]


def unknown_column(n: int, dtype: type) -> Column:
    return Column(np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool))


@dataclass(frozen=True)
class CellRanges:
    """A text column: cell ``i`` is ``data[starts[i]:ends[i]]`` (int64 offsets; empty = unknown)."""

    data: bytes
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)

    def cell(self, i: int) -> str:
        return self.data[int(self.starts[i]) : int(self.ends[i])].decode("utf-8", errors="replace")

    def filled(self) -> bool:
        return bool((self.ends > self.starts).any())

    def ranges(self) -> CellRanges:
        """Itself (a :class:`CellSource` that is made already)."""
        return self


class CellSource(Protocol):
    """A text column's cells, found but perhaps not yet made into ranges (a located file's column)."""

    def __len__(self) -> int: ...
    def filled(self) -> bool: ...
    def ranges(self) -> CellRanges: ...


def pack(cells: Sequence[str]) -> CellRanges:
    """Strings (``''`` = unknown) as ranges of one UTF-8 buffer (the csv module's rows, JSON values, tests)."""
    joined = "".join(cells)
    data = joined.encode("utf-8", errors="replace")
    if len(data) == len(joined):  # ASCII: each cell's bytes are its characters
        lengths = np.fromiter(map(len, cells), dtype=np.int64, count=len(cells))
    else:
        encoded = [c.encode("utf-8", errors="replace") for c in cells]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(cells))
        data = b"".join(encoded)
    ends = np.cumsum(lengths) + PAD
    return CellRanges(b"0" * PAD + data, ends - lengths, ends)


# -- one cell at a time: the definition the whole-column parsers agree with ---------------------------


def int_of(text: str) -> int | None:
    """A cell as an int: ``"1024"``, and ``"1.2e9"`` or ``"1024.0"`` from another writer; None if not a number
    (empty, damaged, not ASCII, beyond int64)."""
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        number = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None  # a damaged cell is unknown, not a failed report
        if not isfinite(value) or abs(value) > MAX_CELL_INT:
            return None
        number = int(value)
    return number if abs(number) <= MAX_CELL_INT else None


def float_of(text: str) -> float | None:
    """A cell as a finite float, or None (empty, damaged, not ASCII, inf or nan)."""
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if isfinite(value) else None


# -- whole columns ---------------------------------------------------------------------------------------


def ints(cells: CellRanges, one: Callable[[str], int | None] | None = None) -> Column:
    """The cells as int64: plain runs of digits parsed from the bytes, every other cell by ``one`` (default
    :func:`int_of`)."""
    starts, ends = cells.starts, cells.ends
    lengths = ends - starts
    filled = lengths > 0
    if not filled.any():
        return unknown_column(len(cells), np.int64)  # a column never logged: nothing to parse
    plain = filled & (lengths <= _INT_DIGITS) & (ends >= _INT_DIGITS)
    at = np.where(plain, ends, _INT_DIGITS)  # where a cell is not plain, a harmless place to read
    keep = np.where(plain, lengths, 0)
    two_words = bool((keep > 8).any())
    span = 16 if two_words else 8
    # The 8 or 16 bytes before each cell's end, in one gather: a column of a large file is a cache miss a
    # row, so its bytes are fetched once, not once a word. A buffer too short for a plain cell reads zeros.
    if len(cells.data) >= _INT_DIGITS:
        window = np.lib.stride_tricks.sliding_window_view(np.frombuffer(cells.data, dtype=np.uint8), span)
        words = window[at - span].view("<u8")
    else:
        words = np.zeros((len(cells), span // 8), dtype="<u8")
    values, digits_only = _eight_digits(words[:, -1], np.minimum(keep, 8))
    if two_words:
        high, high_ok = _eight_digits(words[:, 0], np.clip(keep - 8, 0, 8))
        digits_only &= high_ok
        high *= np.uint64(10**8)
        values += high
    known = plain & digits_only
    out = values.view(np.int64)
    out[~known] = 0
    return _per_cell(cells, Column(out, known), filled, one or int_of)


def floats(cells: CellRanges, one: Callable[[str], float | None] | None = None) -> Column:
    """The cells as float64: digits with at most one '.' parsed from the bytes, every other cell by ``one``
    (default :func:`float_of`)."""
    starts, ends = cells.starts, cells.ends
    n = len(starts)
    lengths = ends - starts
    filled = lengths > 0
    if not filled.any():
        return unknown_column(n, np.float64)
    short = filled & (lengths <= _FLOAT_DIGITS + 1)
    width = int(lengths[short].max()) if short.any() else 1
    plain = short & (ends >= width)
    out = np.zeros(n, dtype=np.float64)
    known = np.zeros(n, dtype=bool)
    if plain.any():
        rows = np.flatnonzero(plain)
        chars = np.lib.stride_tricks.sliding_window_view(np.frombuffer(cells.data, dtype=np.uint8), width)[
            ends[rows] - width] - np.uint8(_ZERO)
        inside = np.arange(width)[None, :] >= (width - lengths[rows])[:, None]  # a cell is right-aligned
        dot = inside & (chars == _DOT_LESS_ZERO)
        digit = inside & ~dot
        dots = dot.sum(axis=1)
        digits = digit.sum(axis=1)
        # "1.2.3", a sign or a letter, too many digits for an exact mantissa, or a lone ".": one by one.
        good = ~((chars > 9) & digit).any(axis=1) & (dots <= 1) & (digits <= _FLOAT_DIGITS) & (digits > 0)
        # Read with the dot as a 0, "12.34" is 12034: the 2 decimals stay, the part above them drops one 0.
        with_zero = _number(chars, digit & good[:, None])
        decimals = np.where(dots == 1, width - 1 - dot.argmax(axis=1), 0)
        decimals = np.where(good, decimals, 0)
        scale = _POW10[decimals]
        mantissa = np.where(dots == 1, with_zero // (scale * 10) * scale + with_zero % scale, with_zero)
        out[rows] = np.where(good, mantissa / _POW10_FLOAT[decimals], 0.0)
        known[rows] = good
    return _per_cell(cells, Column(out, known), filled, one or float_of)


def _per_cell(cells: CellRanges, parsed: Column, filled: np.ndarray,
              convert: Callable[[str], int | float | None]) -> Column:
    """``parsed`` with the filled cells it could not vouch for converted one by one (``int_of``/``float_of``)."""
    odd = np.flatnonzero(filled & ~parsed.known)
    if not len(odd):
        return parsed
    seen: dict[str, int | float | None] = {}  # a damaged column repeats its odd cells
    for i in odd.tolist():
        text = cells.cell(i)
        if text not in seen:
            seen[text] = convert(text)
        value = seen[text]
        if value is not None:
            parsed.values[i] = value
            parsed.known[i] = True
    return parsed


def _eight_digits(word: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The number in the last ``keep`` of each word's 8 bytes (the rest read as '0'); whether all are digits.

    SWAR: the 8 bytes are loaded as one little-endian uint64 (first byte lowest) and combined in three
    multiply-shift steps, pairs, then fours, then eights, for the whole column at once. The steps work in
    place: a fresh 8 MB array per step would cost more than its arithmetic.
    """
    word = np.ascontiguousarray(word)  # a column of the gathered rows: made its own, then changed in place
    other = _KEEP_HIGH_BYTES[keep]
    word &= other
    np.invert(other, out=other)
    other &= _ASCII_ZEROS
    word |= other  # bytes outside the cell read as '0'
    # Every byte 0x30-0x39: adding 0x46 leaves bit 7 clear (no byte carries: ASCII), and so does
    # subtracting 0x30 (a byte below 0x30 borrows, and sets it).
    np.add(word, _BELOW_0X80_IF_AT_MOST_9, out=other)
    word -= _ASCII_ZEROS
    other |= word
    other &= _BIT7
    digits_only = other == 0
    for mask, factor, shift in _COMBINE:
        word &= mask
        word *= factor
        word >>= shift
    return word, digits_only


def _number(digits: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Each row's kept digits read as one base-10 number (int64), column by column (an int64 copy of the
    whole window would be 8x its bytes)."""
    total = np.zeros(len(digits), dtype=np.int64)
    for k in range(digits.shape[1]):
        total *= 10
        total += np.where(keep[:, k], digits[:, k], 0)
    return total


def texts(cells: CellRanges) -> list[str | None]:
    """The cells as strings, None for empty ones: copied out in chunks, each packed and split in one go."""
    out: list[str | None] = []
    data = np.frombuffer(cells.data, dtype=np.uint8)
    for first in range(0, len(cells), _TEXT_CHUNK_ROWS):
        starts = cells.starts[first : first + _TEXT_CHUNK_ROWS]
        ends = cells.ends[first : first + _TEXT_CHUNK_ROWS]
        out.extend(_text_chunk(cells, data, starts, ends))
    return out


def _text_chunk(cells: CellRanges, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str | None]:
    lengths = ends - starts
    if not lengths.any():
        return [None] * len(starts)
    width = int(lengths[0])
    if (lengths == width).all():  # cells of one width (a time, a UUID): copied as rows, no gather index
        rows = fixed_rows(cells.data, starts, width + 1)
        for separator in _SEPARATORS:
            if not (rows[:, :width] == separator[0]).any():
                rows[:, width] = separator[0]
                return rows.tobytes().decode("utf-8", errors="replace").split(separator.decode())[:-1]  # type: ignore[return-value]
    # Each cell's bytes and one byte after it, end to end: output byte k comes from data[k + shift[row]].
    spans = lengths + 1
    out_ends = np.cumsum(spans)
    out_starts = out_ends - spans
    index = np.arange(int(out_ends[-1]), dtype=np.int64)
    index += np.repeat(starts - out_starts, spans)
    index[out_ends - 1] = 0  # the byte after each cell: made a separator below
    packed = data[index]
    for separator in _SEPARATORS:
        mark = separator[0]
        packed[out_ends - 1] = mark
        if int(np.count_nonzero(packed == mark)) == len(starts):  # the separator occurs in no cell
            parts = packed.tobytes().decode("utf-8", errors="replace").split(separator.decode())[:-1]
            return [p or None for p in parts]
    return [cells.data[s:e].decode("utf-8", errors="replace") or None  # every separator is in some cell
            for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def labels(cells: CellRanges) -> Labels:
    """The cells as codes into their distinct non-empty texts, numbered in order of first appearance."""
    n = len(cells)
    lengths = cells.ends - cells.starts
    filled = lengths > 0
    if not filled.any():
        return Labels(np.full(n, -1, dtype=np.int32), [])
    width = int(lengths.max())
    if width > _LABEL_WIDTH:
        return _labels_by_dict(texts(cells))
    rows = np.flatnonzero(filled)
    first, inverse = _distinct(cells, rows, lengths[rows], width)
    order = np.argsort(first, kind="stable")  # distinct cells by first appearance
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    codes = np.full(n, -1, dtype=np.int32)
    codes[rows] = rank[inverse]
    firsts = rows[first[order]]  # each distinct cell where it first appears, in that order
    names = texts(CellRanges(cells.data, cells.starts[firsts], cells.ends[firsts]))
    return Labels(codes, names)  # type: ignore[arg-type]  # no name is empty: none is None


def _distinct(cells: CellRanges, rows: np.ndarray, lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For the cells at ``rows``: the index (into ``rows``) of each distinct cell's first appearance, and each
    cell's distinct number, as ``np.unique(..., return_index, return_inverse)`` gives them.

    Each cell becomes a fixed-width row of 8-byte words (zeros after its end) and one 64-bit key: the cell
    itself when it is at most 7 bytes (its length in the eighth), else a hash of its words. Hashed keys
    are checked against the rows they stand for, and on any collision the rows themselves are sorted.
    """
    words = -(-(width + 1) // 8)  # room for the length byte too
    keyed = np.zeros((len(rows), words * 8), dtype=np.uint8)
    keyed[:, :width] = fixed_rows(cells.data, cells.starts[rows], width)
    keyed[:, :width][np.arange(width)[None, :] >= lengths[:, None]] = 0
    keyed[:, -1] = lengths  # at most 64: one byte
    lanes = keyed.view(np.uint64)
    if words == 1:
        key = lanes[:, 0]
    else:
        key = np.zeros(len(rows), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for k in range(words):
                key ^= lanes[:, k]
                key *= _HASH_MULTIPLIER
                key ^= key >> np.uint64(29)
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    if words > 1 and not (lanes == lanes[first[inverse]]).all():  # two cells, one hash: sort the cells
        voids = np.ascontiguousarray(keyed).view(np.dtype((np.void, words * 8))).ravel()
        _, first, inverse = np.unique(voids, return_index=True, return_inverse=True)
        inverse = inverse.ravel()
    return first, inverse


def fixed_rows(data: bytes, starts: np.ndarray, width: int) -> np.ndarray:
    """A (rows, width) copy of the bytes from each start; past the buffer's end they read 0."""
    view = np.frombuffer(data, dtype=np.uint8)
    fits = starts + width <= len(view)
    out = np.zeros((len(starts), width), dtype=np.uint8)
    if len(view) >= width:
        # Row i of the sliding view is data[i : i + width]: picking rows copies each cell in one go.
        out[fits] = np.lib.stride_tricks.sliding_window_view(view, width)[starts[fits]]
    for i in np.flatnonzero(~fits).tolist():  # the last cells of the buffer only
        piece = view[int(starts[i]) :]
        out[i, : len(piece)] = piece
    return out


def _labels_by_dict(values: Sequence[str | None]) -> Labels:
    index: dict[str, int] = {}
    codes = np.fromiter((-1 if v is None else index.setdefault(v, len(index)) for v in values), dtype=np.int32,
                        count=len(values))
    return Labels(codes, list(index))


def merge_labels(parts: Sequence[Labels]) -> Labels:
    """Labels of consecutive row blocks as one column's (names in order of first appearance)."""
    index: dict[str, int] = {}
    pieces = []
    for part in parts:
        remap = np.array([index.setdefault(name, len(index)) for name in part.names] + [-1], dtype=np.int32)
        pieces.append(remap[part.codes])  # code -1 picks the -1 at the end
    codes = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return Labels(codes.astype(np.int32, copy=False), list(index))
