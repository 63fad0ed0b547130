"""A log's columns as the analysis reads them: whole numpy arrays with a known-mask, read once.

:class:`LogColumns` reads a :class:`~vramscope.logs.table.LogTable` through its numpy API
(``int_column``/``float_column``/``labels``), or wraps the plain lists a live monitor holds
(:meth:`LogColumns.from_lists`): both give the analysis the same arrays. A missing column reads as all
unknown. The functions below are the few whole-column questions the analysis asks (the largest known
value and its first row, the last known value), each one numpy pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from itertools import repeat
from operator import is_not
from typing import Any

import numpy as np

from vramscope.logs.arrow_columns import ArrowColumn
from vramscope.logs.cells import Column, Labels
from vramscope.logs.label_columns import LabelColumn
from vramscope.logs.schema import FLOAT_COLUMNS
from vramscope.logs.table import ColumnData, LogTable

# The columns the analysis reads (a live monitor keeps just these of each row); what each holds (text, seconds,
# integers) is the log schema's to say.
ANALYSED_COLUMNS = ("time", "elapsed_s", "phase", "step", "gpu", "allocated_bytes", "reserved_bytes",
                    "peak_allocated_bytes", "device_used_bytes", "device_total_bytes", "process_bytes",
                    "host_rss_bytes", "tokens", "inactive_split_bytes", "rank", "num_alloc_retries", "num_ooms")

_LOWEST = np.iinfo(np.int64).min


# Logged seconds past 1e18 (30 billion years) are no reading but a damaged cell, 1e308 say, whose differences
# overflow (numpy's RuntimeWarnings, then NaN where a slope or a duration should be, or a duration of 308
# digits). Below it, every difference and square the analysis takes stays far from float overflow; far-off but
# finite seconds (2**53, where x + 1 == x) still draw.
MAX_ELAPSED_S = 1e18


def _plausible_seconds(column: Column) -> Column:
    """``elapsed_s`` with the cells beyond :data:`MAX_ELAPSED_S` either way unknown, like any damaged cell."""
    values = column.values
    # Two reductions, no array made, say that no cell is beyond (a comparison with NaN is False: looked at below).
    if not len(values) or (values.min() >= -MAX_ELAPSED_S and values.max() <= MAX_ELAPSED_S):
        return column
    beyond = column.known & ~(np.abs(column.values) <= MAX_ELAPSED_S)
    if not beyond.any():
        return column
    return Column(np.where(beyond, 0.0, column.values), column.known & ~beyond)


class LogColumns:
    """The columns of one log, each read into arrays when first asked for (the rank, say, rarely is)."""

    def __init__(self, n: int, table: LogTable | None = None, lists: Mapping[str, Sequence[Any]] | None = None,
                 path: str = "") -> None:
        self.n = n
        self.path = path
        self._table = table
        self._lists = lists
        self._read: dict[str, Column] = {}
        self._labels: dict[str, Labels] = {}
        self._text_cells: dict[str, ColumnData | None] = {}

    @classmethod
    def from_table(cls, table: LogTable) -> LogColumns:
        return cls(len(table), table=table, path=table.path)

    @classmethod
    def from_lists(cls, columns: Mapping[str, Sequence[Any]]) -> LogColumns:
        """Typed lists (ints/floats/str, None = unknown), one entry per row: what a live monitor holds."""
        n = max((len(v) for v in columns.values()), default=0)
        return cls(n, lists=columns)

    def column(self, name: str) -> Column:
        """An int column (a float one for ``elapsed_s``): values and known-mask."""
        found = self._read.get(name)
        if found is None:
            found = self._read[name] = self._load(name)
        return found

    def _load(self, name: str) -> Column:
        column = self._read_column(name)
        return _plausible_seconds(column) if name == "elapsed_s" else column

    def _read_column(self, name: str) -> Column:
        floating = name in FLOAT_COLUMNS
        if self._table is not None:
            return self._table.float_column(name) if floating else self._table.int_column(name)
        cells = self._lists.get(name) if self._lists is not None else None
        if cells is None or len(cells) != self.n:
            return Column(np.zeros(self.n, np.float64 if floating else np.int64), np.zeros(self.n, bool))
        # The unknown cells found in one C-level pass, then filled in by array operations.
        known = np.fromiter(map(is_not, cells, repeat(None)), dtype=bool, count=self.n)
        values = np.where(known, np.array(cells, dtype=object), 0).astype(np.float64 if floating else np.int64)
        return Column(values, known)

    def labels(self, name: str) -> Labels:
        """A text column as codes into its distinct non-empty cells (-1: empty)."""
        found = self._labels.get(name)
        if found is None:
            if self._table is not None:
                found = self._table.labels(name)
            else:
                cells = self._lists.get(name) if self._lists is not None else None
                index: dict[str, int] = {}
                codes = np.full(self.n, -1, np.int32)
                if cells is not None and len(cells) == self.n:
                    codes = np.fromiter((-1 if not c else index.setdefault(str(c), len(index)) for c in cells),
                                        dtype=np.int32, count=self.n)
                found = Labels(codes, list(index))
            self._labels[name] = found
        return found

    def filled(self, name: str) -> bool:
        """Some cell of the column holds a value (a known number, as a rule; or text that is none).

        Of a table, asked without reading the column: a log lacks many columns (the rank, torch's counters).
        """
        if self._table is not None:
            return self._table.has(name)
        return self.column(name).any_known()

    def texts(self, name: str, rows: np.ndarray) -> list[str | None]:
        """The cells of a text column on a few rows (None where empty): the time of a peak, of a chart's points.

        Of a table, only those cells are made into text: coding every row (:meth:`labels`) would cost a
        report of a million rows most of its time, for a million distinct time stamps it never reads.
        """
        if self._table is None:
            cells = self._lists.get(name) if self._lists is not None else None
            if cells is None or len(cells) != self.n:
                return [None] * len(rows)
            return [None if not cells[r] else str(cells[r]) for r in np.asarray(rows, dtype=np.int64).tolist()]
        if name not in self._text_cells:
            data = self._table.column_data(name)
            # Taken whole once: the cells located once, each later take a pick of a few of them. A column read
            # as pyarrow's pieces or as labels is that already (taking every row gives it back): no arange of every row.
            whole = isinstance(data, ArrowColumn | LabelColumn)
            self._text_cells[name] = data if data is None or whole else data.take(np.arange(self.n, dtype=np.int64))
        taken = self._text_cells[name]
        return [None] * len(rows) if taken is None else taken.take(np.asarray(rows, dtype=np.int64)).texts()

    def text(self, name: str, row: int) -> str | None:
        """One cell of a text column (None when empty)."""
        return self.texts(name, np.array([row], dtype=np.int64))[0] if 0 <= row < self.n else None

    def filled_ends(self, name: str) -> tuple[int | None, int | None]:
        """The first and the last row whose cell of a text column is not empty (the first and the last row,
        as a rule: only otherwise is the column looked through)."""
        if not self.n:
            return None, None
        first, last = self.texts(name, np.array([0, self.n - 1], dtype=np.int64))
        if first is not None and last is not None:
            return 0, self.n - 1
        filled = np.flatnonzero(self.labels(name).codes >= 0)
        return (int(filled[0]), int(filled[-1])) if len(filled) else (None, None)


class Clock:
    """Seconds since the log's first row, by the wall clock (``time``) so that rows of two writers agree;
    the logged ``elapsed_s`` where a row has no readable time."""

    def __init__(self, cols: LogColumns) -> None:
        self.cols = cols
        self.first_row, self.last_row = cols.filled_ends("time")
        self.start = cols.text("time", self.first_row) if self.first_row is not None else None
        self.origin = _parse_time(self.start or "")
        self._parsed: dict[str, float | None] = {}  # per time text: a chart's points share a few

    def seconds(self, rows: np.ndarray) -> np.ndarray:
        """Each row's seconds since the start (NaN: unknown), for a few rows (a chart's points)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(len(rows), np.nan)
        if not len(rows):
            return out
        if self.origin is not None:
            for k, text in enumerate(self.cols.texts("time", rows)):
                if text is None:
                    continue
                if text not in self._parsed:
                    stamp = _parse_time(text)
                    self._parsed[text] = None if stamp is None else stamp - self.origin
                value = self._parsed[text]
                if value is not None:
                    out[k] = value
        missing = np.isnan(out)
        if missing.any():
            elapsed = self.cols.column("elapsed_s")
            picked = rows[missing]
            out[missing] = np.where(elapsed.known[picked], elapsed.values[picked], np.nan)
        return out

    def at(self, row: int) -> float | None:
        value = float(self.seconds(np.array([row]))[0])
        return None if np.isnan(value) else value

    def duration_s(self) -> float | None:
        """The log's length, from its logged seconds, which a monotonic clock counts (a wall clock stepped back
        by NTP or by hand made it "-1:00:03"): their range, when the first and the last row have them. Else
        from the first to the last row's time (a hand-written log, a damaged last cell), never below zero;
        else the range of the logged seconds there are."""
        elapsed = self.cols.column("elapsed_s")
        # Every second known, as a rule: the column itself, not a copy of its known cells.
        seconds = elapsed.values if elapsed.known.all() else elapsed.values[elapsed.known]
        if self.cols.n and elapsed.known[0] and elapsed.known[-1]:
            return float(seconds.max() - seconds.min())
        if self.first_row is not None and self.last_row is not None:
            a, b = self.at(self.first_row), self.at(self.last_row)
            if a is not None and b is not None and b >= a:
                return b - a
        return float(seconds.max() - seconds.min()) if len(seconds) else None


def _parse_time(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


# -- whole-column questions --------------------------------------------------------------------------


def argmax_known(values: np.ndarray, known: np.ndarray) -> int | None:
    """The first position of the largest known value; None when nothing is known."""
    if not len(values):
        return None
    if known.all():
        return int(np.argmax(values))
    if not known.any():
        return None
    return int(np.argmax(np.where(known, values, _LOWEST)))


def top_known(values: np.ndarray, known: np.ndarray) -> int | None:
    """The largest known value of an int column; None when nothing is known."""
    at = argmax_known(values, known)
    return None if at is None else int(values[at])


def last_known(known: np.ndarray) -> int | None:
    """The position of the last known cell (the last row, as a rule); None when none is."""
    if len(known) and known[-1]:
        return len(known) - 1
    found = np.flatnonzero(known)
    return int(found[-1]) if len(found) else None


def tail(mask: np.ndarray, count: int) -> np.ndarray:
    """The last ``count`` positions where ``mask`` is true."""
    if count <= 0:
        return np.zeros(0, np.int64)
    # From the end, a window at a time: the newest rows, not the positions of every row (a million of them).
    found: list[np.ndarray] = []
    have, hi, window = 0, len(mask), max(4 * count, 1 << 12)
    while hi > 0 and have < count:
        lo = max(0, hi - window)
        part = np.flatnonzero(mask[lo:hi]) + lo
        found.append(part)
        have += len(part)
        hi, window = lo, 4 * window
    if not found:
        return np.zeros(0, np.int64)
    picked: np.ndarray = np.concatenate(found[::-1])[-count:]
    return picked
