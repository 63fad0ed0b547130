"""A plain CSV's cells found in the file's own bytes with numpy: no cell becomes a Python object.

Why: a day of samples at 10 Hz is a million rows of about twenty cells. Split into strings it is
twenty million objects (1.5 GB) before a single number is known. Here the file stays one bytes object
and each cell is a range of it (:class:`vramscope.logs.cells.CellRanges`): the delimiters are found in
one vectorized pass, a chunk of lines at a time.

Only what needs no quoting rules is located: no ``"`` in the file, line ends all "\\n" or all
"\\r\\n" (the csv module's default, which our sink writes), every line of the header's width, at least
two columns. Anything else answers None and the reader hands the file to the csv module. The file may
hold UTF-8: no byte of a multi-byte character is a comma or a line end.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from vramscope.logs import cells as cellparse
from vramscope.logs.cells import CellRanges, Column

_COMMA, _NEWLINE, _CARRIAGE = 44, 10, 13
# The file is scanned this many bytes at a time (whole lines): the masks and offsets of a scan are
# temporary, so locating a large log costs the file and its index, not several times the file.
CHUNK_BYTES = 1 << 22
_MAX_LINE_BYTES = (1 << 16) - 1  # cell ends within a line are uint16; a longer line goes to the csv module
_ROWS_AT_A_TIME = 1 << 14  # a few MB of lines: they stay in the cache while every column of them is read


class Located:
    """A plain CSV's cells: cell j of line r (line 0: the header) ends at ``line_starts[r] + ends[j][r]``."""

    def __init__(self, data: bytes, line_starts: np.ndarray, ends: np.ndarray, header: list[str],
                 crlf: bool) -> None:
        self.data = data
        self._line_starts = line_starts  # int64, one per line
        # Column-major, each cell's end within its line (uint16): 2 bytes a cell rather than 16, so the
        # index of a day of rows costs a fraction of the file, not several times it.
        self._ends = ends
        self._carriage = 1 if crlf else 0  # a "\r" before each line's "\n" ends the last cell early
        self.header = header
        self.rows = ends.shape[1] - 1

    def column(self, j: int) -> LocatedColumn:
        """Column j, its ranges made when it is converted (16 bytes a cell, for one column at a time)."""
        return LocatedColumn(self, j)

    def filled(self, j: int) -> bool:
        """Whether some cell of column j is not empty, from the index alone."""
        within = self._ends[j, 1:].astype(np.int64) - (self._carriage if j == len(self.header) - 1 else 0)
        starts = self._ends[j - 1, 1:].astype(np.int64) + 1 if j > 0 else 0
        return bool((within > starts).any())

    def cells(self, j: int, lo: int = 0, hi: int | None = None) -> CellRanges:
        """Column j's cells, one per data row (rows ``lo`` to ``hi`` only, if given)."""
        last = len(self.header) - 1
        rows = slice(lo + 1, None if hi is None else hi + 1)
        line_starts = self._line_starts[rows]
        ends = line_starts + self._ends[j, rows] - (self._carriage if j == last else 0)
        # Cell j starts after the line's previous comma; the first cell where its line starts.
        starts = line_starts + self._ends[j - 1, rows] + 1 if j > 0 else line_starts.copy()
        return CellRanges(self.data, starts, ends)

    def numbers(self, kinds: Mapping[int, str]) -> dict[int, Column]:
        """Columns as numbers ({j: "int" or "float"}), all of them a stretch of rows at a time.

        Why not a column at a time: each column of a large file is a cache miss a row (its cells are a
        line apart). Taking every column of a stretch of rows while its lines are in the cache reads 18
        columns of 1M rows (200 MB) in 0.87 s instead of 2.4 s (measured here, 2026-12-01).
        """
        out = {j: Column(np.zeros(self.rows, dtype=np.int64 if kind == "int" else np.float64),
                         np.zeros(self.rows, dtype=bool)) for j, kind in kinds.items()}
        for lo in range(0, self.rows, _ROWS_AT_A_TIME):
            hi = min(lo + _ROWS_AT_A_TIME, self.rows)
            for j, kind in kinds.items():
                part = (cellparse.ints if kind == "int" else cellparse.floats)(self.cells(j, lo, hi))
                out[j].values[lo:hi] = part.values
                out[j].known[lo:hi] = part.known
        return out


class LocatedColumn:
    """One column of a located file (a :class:`~vramscope.logs.cells.CellSource`)."""

    def __init__(self, located: Located, j: int) -> None:
        self.located = located
        self.j = j

    def __len__(self) -> int:
        return int(self.located.rows)

    def filled(self) -> bool:
        return self.located.filled(self.j)

    def ranges(self) -> CellRanges:
        return self.located.cells(self.j)


def locate(data: bytes) -> Located | None:
    """Find every cell of a plain, even CSV (header first); None when the file needs the csv module.

    A torn last line (a crash mid-write: no line end) is left out.
    """
    if b'"' in data:
        return None
    end = data.rfind(b"\n")
    first = data.find(b"\n")
    if first < 0:
        return None
    crlf = data[first - 1 : first] == b"\r"
    header = data[: first - 1 if crlf else first].decode("utf-8", errors="replace").split(",")
    width = len(header)
    if width < 2:
        return None  # one column: an empty line would pass for an empty cell; the csv module skips it
    lines = data.count(b"\n", 0, end + 1)
    body = np.frombuffer(data, dtype=np.uint8, count=end + 1)
    line_starts = np.empty(lines, dtype=np.int64)
    ends = np.empty((width, lines), dtype=np.uint16)
    done = 0  # lines located so far
    at = 0
    while at <= end:
        stop = data.rfind(b"\n", at, min(at + CHUNK_BYTES, end + 1)) + 1  # the chunk ends on a line end
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
    return Located(data, line_starts, ends, header, crlf)


def _locate_lines(chunk: np.ndarray, width: int, crlf: bool) -> tuple[np.ndarray, np.ndarray] | None:
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
