"""A large plain CSV's columns read straight from the file's bytes with numpy (the only numpy import).

Why: a day of samples at 10 Hz is a million rows of about twenty cells. Splitting it into Python
strings makes twenty million objects (1.5 GB) before a single number is known, and converting a
column with ``int()`` then touches a million scattered strings again. Here the file stays one bytes
object: the cell delimiters are found in one vectorized pass, and a column becomes Python values only
when the report asks for it, parsed from the bytes in whole-column numpy operations.

Only what can be vouched for is taken this way; anything else answers None and the caller uses the
string path, so both give the same values cell for cell:

* the file is ASCII, without quotes, its lines end all in "\n" or all in "\r\n" (the csv module's
  default, which our sink writes), and every line has the header's width;
* an integer column holds only empty cells and runs of at most 16 digits (no sign, no exponent);
* a float column holds only empty cells and at most 15 digits with at most one ``.``. Such a cell is
  ``m / 10**k`` with both exact in a double, and one IEEE division of exact operands is correctly
  rounded: the same float that ``float(cell)`` gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vramscope import smi_samples
from vramscope.logfile import SMI_STAMP_DIGITS, SMI_STAMP_SEPARATORS, SMI_STAMP_WIDTH

# Below this size the string path is as fast and needs no numpy import.
MIN_BYTES = 1 << 20

_COMMA, _NEWLINE, _CARRIAGE, _ZERO, _SPACE = 44, 10, 13, 48, 32
# nvidia-smi's "2026/11/29 10:00:00.123": the layout logfile's str path checks, as numpy indices.
_STAMP_MARK_AT = [at for at, _ in SMI_STAMP_SEPARATORS]
_STAMP_MARKS = np.frombuffer("".join(mark for _, mark in SMI_STAMP_SEPARATORS).encode(), dtype=np.uint8)
_STAMP_DIGIT_AT = list(SMI_STAMP_DIGITS)
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_DOT_LESS_ZERO = (46 - _ZERO) % 256  # '.' as a digit window holds it (uint8 bytes less '0')
_INT_DIGITS = 16  # two 8-byte words; 10**16 bytes is 10 PB
_FLOAT_DIGITS = 15  # 10**15 < 2**53: the mantissa is exact in a double
_POW10 = 10 ** np.arange(_FLOAT_DIGITS + 2, dtype=np.int64)
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
_POW10_FLOAT = 10.0 ** np.arange(_FLOAT_DIGITS + 1)
# A column is copied out through a window as wide as its longest cell; past this the window would
# cost more memory than the cells (one pathological row), and Python slicing is used.
_TEXT_WINDOW = 256


class ByteColumns:
    """A plain CSV's cells located in its bytes: cell j of line r (line 0: the header) ends at
    ``line_starts[r] + ends[j][r]``, its offset within its line."""

    def __init__(self, data: bytes, line_starts: Any, ends: Any, header: list[str], crlf: bool) -> None:
        self._bytes = np.frombuffer(data, dtype=np.uint8)
        self._data = data
        self._line_starts = line_starts  # int64, one per line
        # Column-major, each cell's end within its line (uint16): 2 bytes a cell rather than 8, so the
        # index of a file past 2 GiB (whose offsets need int64) costs a fifth of the file, not most of it.
        self._ends = ends
        self._carriage = 1 if crlf else 0  # a "\r" before each line's "\n" ends the last cell early
        self.header = header
        self.rows = ends.shape[1] - 1

    def _bounds(self, j: int) -> tuple[Any, Any]:
        """Start and end (exclusive) offsets of column j's cells, one per data row (int64)."""
        last = len(self.header) - 1
        line_starts = self._line_starts[1:]
        ends = line_starts + self._ends[j, 1:] - (self._carriage if j == last else 0)
        # Cell j starts after the line's previous comma; the first cell where its line starts.
        starts = line_starts + self._ends[j - 1, 1:] + 1 if j > 0 else line_starts.copy()
        return starts, ends

    def filled(self, j: int) -> bool:
        """True when at least one cell of column j is not empty."""
        starts, ends = self._bounds(j)
        return bool((ends > starts).any())

    def text(self, j: int) -> list[str]:
        """Column j as strings, '' for empty cells."""
        starts, ends = self._bounds(j)
        lengths = ends - starts
        if self.rows == 0 or not lengths.any():
            return [""] * self.rows
        width = int(lengths.max()) + 1  # the cell and the byte after it
        chars = self._rows_of_bytes(starts, width)
        if chars is None:
            data = self._data
            return [data[s:e].decode("ascii") for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        # Every cell with the byte after it made a comma, packed in order: "c0,c1,...,cn," splits in C.
        chars[np.arange(self.rows), lengths] = _COMMA
        packed: bytes = chars[np.arange(width)[None, :] <= lengths[:, None]].tobytes()
        return _shared(packed.decode("ascii").split(",")[:-1])

    def _rows_of_bytes(self, firsts: Any, width: int) -> Any | None:
        """A (rows, width) copy of the bytes from each of ``firsts``; None if that is too big or runs off the file."""
        if width > _TEXT_WINDOW or int(firsts.min()) < 0 or int(firsts.max()) + width > len(self._bytes):
            return None
        # Row i of the sliding view is bytes[i : i + width]: picking rows copies each cell in one go,
        # with no (rows x width) index array.
        return np.lib.stride_tricks.sliding_window_view(self._bytes, width)[firsts]

    def ints(self, j: int) -> list[int | None] | None:
        """Column j as ints (None for empty cells), or None if a cell is not a plain run of digits."""
        if self.rows == 0:
            return None  # nothing to parse: the string path gives the empty column
        return self._ints_between(*self._bounds(j))

    def _ints_between(self, starts: Any, ends: Any) -> list[int | None] | None:
        lengths = ends - starts
        if int(lengths.max()) > _INT_DIGITS or int(ends.min()) < _INT_DIGITS:
            return None  # too long for int64 arithmetic, or a cell so near the file's start that no word fits
        # A cell is at most two 8-byte words read back from its end: the 8 digits before the end and the 8 before those.
        values, digits_only = self._eight_digits(ends - 8, np.minimum(lengths, 8))
        if int(lengths.max()) > 8:
            high, high_ok = self._eight_digits(ends - 16, np.clip(lengths - 8, 0, 8))
            digits_only &= high_ok
            high *= np.uint64(10**8)
            values += high
        if not digits_only.all():
            return None
        filled = lengths > 0
        if filled.all() and (values == values[0]).all():
            # A constant column (a GPU's total, the rank): one int object for every row, not a million.
            return [int(values[0])] * len(values)
        return _with_gaps(values.view(np.int64), filled)

    def _eight_digits(self, at: Any, keep: Any) -> tuple[Any, Any]:
        """The number in the last ``keep`` of the 8 bytes at each ``at`` (the rest read as '0'); whether all are digits.

        SWAR: the 8 bytes are loaded as one little-endian uint64 (first byte lowest) and combined in
        three multiply-shift steps, pairs, then fours, then eights, for the whole column at once. The
        steps work in place: a fresh 8 MB array per step would cost more than its arithmetic.
        """
        word = np.ndarray(shape=(len(self._bytes) - 7,), dtype="<u8", buffer=self._data, strides=(1,))[at]
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

    def floats(self, j: int) -> list[float | None] | None:
        """Column j as floats (None for empty cells), or None if a cell is not digits with at most one '.'."""
        window = self._digit_window(j, _FLOAT_DIGITS + 1)
        if window is None:
            return None
        chars, inside, filled = window
        dot = inside & (chars == _DOT_LESS_ZERO)
        digit = inside & ~dot
        if ((chars > 9) & digit).any():
            return None
        dots = dot.sum(axis=1)
        digits = digit.sum(axis=1)
        if (dots > 1).any() or (digits > _FLOAT_DIGITS).any() or (filled & (digits == 0)).any():
            return None  # "1.2.3", too many digits for an exact mantissa, or a lone "."
        # Read with the dot as a 0, "12.34" is 12034: the 2 decimals stay, the part above them drops one 0.
        width = chars.shape[1]
        with_zero = _number(chars, digit)
        decimals = np.where(dots == 1, width - 1 - dot.argmax(axis=1), 0)
        scale = _POW10[decimals]
        mantissa = np.where(dots == 1, with_zero // (scale * 10) * scale + with_zero % scale, with_zero)
        return _with_gaps(mantissa / _POW10_FLOAT[decimals], filled)

    def _digit_window(self, j: int, most: int) -> tuple[Any, Any, Any] | None:
        """The last ``width`` bytes before each cell's end, less '0' (uint8, so other bytes land above 9).

        Returns (chars, inside, filled): ``inside`` marks the bytes that belong to the cell (a cell is
        right-aligned in the window, after bytes of the cells before it); ``filled`` the non-empty cells.
        None when a cell is longer than ``most``.
        """
        if self.rows == 0:
            return None  # nothing to parse: the string path gives the empty column
        starts, ends = self._bounds(j)
        lengths = ends - starts
        width = max(int(lengths.max()), 1)
        if width > most:
            return None
        window = self._rows_of_bytes(ends - width, width)
        if window is None:
            return None
        window -= np.uint8(_ZERO)
        inside = np.arange(width)[None, :] >= (width - lengths)[:, None]
        return window, inside, lengths > 0


    # -- nvidia-smi's cells: " 20000 MiB", "2026/11/29 10:00:00.123" ------------------------------------

    def unit_ints(self, j: int, unit: bytes, most_digits: int) -> list[int] | None:
        """A column of " <digits>[ unit]" cells (nvidia-smi's, after its ", "), as ints; None if any cell is not."""
        if self.rows == 0:
            return None
        starts, ends = self._bounds(j)
        if j > 0:  # after ", "
            if not (self._bytes[np.minimum(starts, len(self._bytes) - 1)] == _SPACE).all() or (ends <= starts).any():
                return None
            starts = starts + 1
        tail = self._rows_of_bytes(ends - len(unit), len(unit)) if int((ends - starts).min()) > len(unit) else None
        if tail is not None and (tail == np.frombuffer(unit, dtype=np.uint8)).all():
            ends = ends - len(unit)
        lengths = ends - starts
        if int(lengths.min()) < 1 or int(lengths.max()) > most_digits:
            return None
        values = self._ints_between(starts, ends)
        return values  # type: ignore[return-value]  # no cell is empty: no None in it

    def stamps(self, j: int) -> tuple[Any, Any] | None:
        """nvidia-smi's "YYYY/MM/DD HH:MM:SS.mmm" column as Unix milliseconds (int64, the clock taken as UTC)
        and the stamps' bytes (rows x 23); None unless every cell is such a stamp of a real date and time."""
        if self.rows == 0:
            return None
        starts, ends = self._bounds(j)
        if j > 0:
            starts = starts + 1
        if not ((ends - starts) == SMI_STAMP_WIDTH).all():
            return None
        chars = self._rows_of_bytes(starts, SMI_STAMP_WIDTH)
        if chars is None or not (chars[:, _STAMP_MARK_AT] == _STAMP_MARKS).all():
            return None
        digits = chars[:, _STAMP_DIGIT_AT] - np.uint8(_ZERO)
        if (digits > 9).any():
            return None
        d = digits.astype(np.int64)
        year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
        month, day = d[:, 4] * 10 + d[:, 5], d[:, 6] * 10 + d[:, 7]
        hour, minute, second = d[:, 8] * 10 + d[:, 9], d[:, 10] * 10 + d[:, 11], d[:, 12] * 10 + d[:, 13]
        millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
        leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
        month_ok = (month >= 1) & (month <= 12)
        last_day = _MONTH_DAYS[np.clip(month - 1, 0, 11)] + ((month == 2) & leap)
        if not (month_ok & (year >= 1) & (day >= 1) & (day <= last_day) & (hour < 24) & (minute < 60)
                & (second < 60)).all():
            return None  # what datetime refuses, the per-line path leaves unknown
        days = _days_from_civil(year, month, day)
        return ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis, chars


def _days_from_civil(year: Any, month: Any, day: Any) -> Any:
    """Days since 1970-01-01 of proleptic Gregorian dates, whole columns at once (H. Hinnant's algorithm)."""
    y = year - (month <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146_097 + day_of_era - 719_468


def iso_times(chars: Any) -> list[str]:
    """nvidia-smi stamps' bytes (rows x 23) as vramscope's times: "2026-11-29T10:00:00.123+00:00"."""
    rows = len(chars)
    out = np.empty((rows, SMI_STAMP_WIDTH + 7), dtype=np.uint8)
    out[:, :SMI_STAMP_WIDTH] = chars
    out[:, [4, 7]] = ord("-")
    out[:, 10] = ord("T")
    out[:, SMI_STAMP_WIDTH:-1] = np.frombuffer(b"+00:00", dtype=np.uint8)
    out[:, -1] = _COMMA
    text: str = out.tobytes().decode("ascii")
    return text.split(",")[:-1]


def tick_positions(millis: Any) -> list[str]:
    """Each row's place among the rows of its sample (the GPU when nvidia-smi logged no index).

    A sample's rows share a stamp or lie a few ms apart (:mod:`vramscope.smi_samples` decides which),
    the numpy twin of :func:`vramscope.smi_samples.positions`.
    """
    n = len(millis)
    gaps = np.diff(millis)
    new = np.ones(n, dtype=bool)
    new[1:] = gaps != 0
    positive = gaps[gaps > 0]
    if positive.size and int(positive.max()) >= smi_samples.MIN_JUMP * int(positive.min()):
        tolerance = smi_samples.within_sample_tolerance(np.unique(positive).tolist())
        if tolerance is not None:
            tolerant = np.ones(n, dtype=bool)
            tolerant[1:] = (gaps < 0) | (gaps > tolerance)
            if smi_samples.tolerance_is_better(_sample_sizes(new), _sample_sizes(tolerant)):
                new = tolerant
    index = np.arange(n)
    first = np.maximum.accumulate(np.where(new, index, 0))
    positions = (index - first).tolist()
    names = [str(i) for i in range(max(positions, default=-1) + 1)]  # a handful of GPUs: shared strings
    return list(map(names.__getitem__, positions))


def _sample_sizes(new: Any) -> dict[int, int]:
    """{size: samples} where ``new`` marks each sample's first row."""
    begins = np.flatnonzero(new)
    sizes, counts = np.unique(np.diff(np.append(begins, len(new))), return_counts=True)
    return dict(zip(sizes.tolist(), counts.tolist(), strict=True))


def _shared(cells: list[str]) -> list[str]:
    """The cells with equal ones sharing one string, when the first rows show few distinct ones (a phase,
    a GPU's UUID): a day of rows then holds a handful of strings instead of a million copies."""
    if len(set(cells[:64])) > 8:
        return cells
    seen: dict[str, str] = {}
    return list(map(seen.setdefault, cells, cells))


def _number(digits: Any, keep: Any) -> Any:
    """Each row's kept digits read as one base-10 number (int64): a matrix-vector product with the powers of ten."""
    # Column by column: an int64 copy of the whole (rows x width) window would be 8x the window's bytes.
    width = digits.shape[1]
    total = np.zeros(len(digits), dtype=np.int64)
    for k in range(width):
        total *= 10
        total += np.where(keep[:, k], digits[:, k], 0)
    return total


def _with_gaps(values: Any, filled: Any) -> list[Any]:
    if filled.all():
        return values.tolist()  # type: ignore[no-any-return]
    out = np.full(len(values), None, dtype=object)
    out[filled] = values[filled].tolist()
    return out.tolist()  # type: ignore[no-any-return]


# The file is scanned this many bytes at a time (whole lines): the masks and offsets of a scan are
# temporary, so reading a large log costs the file and its index, not several times the file.
_CHUNK_BYTES = 1 << 22
_MAX_LINE_BYTES = (1 << 16) - 1  # cell ends within a line are uint16; a longer line goes to the general reader


def locate(data: bytes) -> ByteColumns | None:
    """Find every cell of a plain, even CSV (header first); None when the file needs the general reader."""
    if len(data) < MIN_BYTES or not data.isascii() or b'"' in data:
        return None
    end = data.rfind(b"\n")  # a torn last line (a crash mid-write) is left out
    first = data.find(b"\n")
    if first < 0:
        return None
    crlf = data[first - 1 : first] == b"\r"
    header = data[: first - 1 if crlf else first].decode("ascii").split(",")
    width = len(header)
    if width < 2:
        return None  # one column: the general reader's handling of blank lines applies
    lines = data.count(b"\n", 0, end + 1)
    body = np.frombuffer(data, dtype=np.uint8, count=end + 1)
    line_starts = np.empty(lines, dtype=np.int64)
    ends = np.empty((width, lines), dtype=np.uint16)
    done = 0  # lines located so far
    at = 0
    while at <= end:
        stop = data.rfind(b"\n", at, min(at + _CHUNK_BYTES, end + 1)) + 1  # the chunk ends on a line end
        if stop <= at:
            return None  # a line longer than a chunk: not a log line
        found = _locate_lines(body[at:stop], width, crlf)
        if found is None:
            return None
        starts, cell_ends = found
        line_starts[done : done + len(starts)] = starts + at
        ends[:, done : done + len(starts)] = cell_ends.T
        done += len(starts)
        at = stop
    return ByteColumns(data, line_starts, ends, header, crlf)


def _locate_lines(chunk: Any, width: int, crlf: bool) -> tuple[Any, Any] | None:
    """Each line's start and its cells' ends within the line (lines x width), for a chunk of whole lines; None
    when a line is not ``width`` plain cells or is too long."""
    is_delim = np.equal(chunk, _NEWLINE)
    lines = int(np.count_nonzero(is_delim))
    other = np.equal(chunk, _CARRIAGE)
    carriages = int(np.count_nonzero(other))
    np.equal(chunk, _COMMA, out=other)
    is_delim |= other
    del other
    delims = np.flatnonzero(is_delim)
    del is_delim
    if len(delims) != lines * width:
        return None
    cells = delims.reshape(lines, width)
    newlines = cells[:, -1]
    # Each line's last delimiter is its newline, and there are no others: every line is `width` cells.
    if not (chunk[newlines] == _NEWLINE).all():
        return None
    # Line ends all "\n" or all "\r\n": a carriage return anywhere else is in a cell (the csv module's business).
    if carriages != (lines if crlf else 0) or (crlf and not (chunk[newlines - 1] == _CARRIAGE).all()):
        return None
    starts = np.empty(lines, dtype=np.int64)
    starts[0] = 0
    starts[1:] = newlines[:-1] + 1
    within = cells - starts[:, None]
    if int(within[:, -1].max()) > _MAX_LINE_BYTES:
        return None
    return starts, within.astype(np.uint16)
