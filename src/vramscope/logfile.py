"""Reading memory logs back: vramscope's CSV and JSON Lines, and nvidia-smi's own CSV.

Column-oriented and lazy: the file is split into raw text columns in one pass, and a column is
converted to numbers only when someone asks for it (``table.ints("reserved_bytes")``), so a report
over a day of samples costs little more than reading the file once. A last line cut by a crash is
dropped silently; the rows before it are all kept.

Speed: a large vramscope CSV (a megabyte and up) is located in its bytes by :mod:`vramscope.fastcsv`
(numpy): no cell becomes a Python string until someone asks for its column, and numbers are parsed
straight from the bytes. Smaller files, and any file fastcsv cannot vouch for, are split with
``str.split`` over the whole file (C speed, no per-row Python objects) and the columns taken out as
strided slices; a file with quotes or ragged rows goes through ``csv.reader``. Strings are converted
with ``map(int, ...)`` first and fall back to a per-cell path only when a column has gaps or odd cells.
Both ways give the same values cell for cell (tests/test_fastcsv.py).
"""

from __future__ import annotations

import csv
import gc
import io
import json
import os
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from itertools import repeat
from math import isfinite
from operator import add, eq, itemgetter, methodcaller, sub, truediv
from typing import Protocol

import numpy as np

from vramscope import smi_samples
from vramscope.inputfile import NotRegularFileError, read_regular_file
from vramscope.schema import COLUMNS
from vramscope.sinks.base import log_parts

MIB = 1024 * 1024


class LogFormatError(ValueError):
    """The file is not a memory log vramscope can read."""


class UnknownLogError(LogFormatError):
    """The file's first line is none of the formats this module reads (``logs_import`` may know it)."""

    def __init__(self, message: str, first_line: str) -> None:
        super().__init__(message)
        self.first_line = first_line


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
        return [v if k else None for v, k in zip(self.values.tolist(), self.known.tolist(), strict=True)]


@dataclass(frozen=True)
class Labels:
    """A text column as codes into its distinct cells: ``names[codes[i]]``, code -1 for an empty cell."""

    codes: np.ndarray  # int32
    names: list[str]

    def __len__(self) -> int:
        return len(self.codes)

    def tolist(self) -> list[str | None]:
        names = self.names
        return [names[c] if c >= 0 else None for c in self.codes.tolist()]


def _column(cells: Sequence[int | float | None], dtype: type) -> Column:
    known = np.fromiter((c is not None for c in cells), dtype=bool, count=len(cells))
    values: np.ndarray = np.fromiter((0 if c is None else c for c in cells), dtype=dtype, count=len(cells))
    return Column(values, known)


@dataclass
class LogTable:
    """A log's columns. Raw cells are strings ('' = unknown); typed views are cached."""

    path: str
    raw: Mapping[str, list[str]]  # a dict, or a large file's columns made on first use (LazyText)
    kind: str = "vramscope"  # or "nvidia-smi", "jsonl"
    _cache: dict[tuple[str, str], list[object]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        lazy = self._lazy()
        if lazy is not None:
            return lazy.columns.rows
        return len(next(iter(self.raw.values()), []))

    @property
    def columns(self) -> list[str]:
        return list(self.raw)

    def has(self, column: str) -> bool:
        """True when the column exists and holds at least one known value."""
        lazy = self._lazy()
        if lazy is not None:
            j = lazy.index(column)
            return j is not None and lazy.columns.filled(j)
        values = self.raw.get(column)
        return bool(values) and any(values)  # type: ignore[arg-type]

    def _lazy(self) -> LazyText | None:
        return self.raw if isinstance(self.raw, LazyText) else None

    def _parsed(self, column: str, kind: str) -> list[object] | None:
        """The column parsed from the file's bytes without strings, or None (not lazy, or not plain numbers)."""
        lazy = self._lazy()
        j = lazy.index(column) if lazy is not None else None
        if lazy is None or j is None:
            return None
        return lazy.columns.ints(j) if kind == "int" else lazy.columns.floats(j)  # type: ignore[return-value]

    def strings(self, column: str) -> list[str | None]:
        """The column as text, None for empty cells (cached)."""
        key = (column, "str")
        if key not in self._cache:
            raw = self.raw.get(column)
            if raw is None:
                self._cache[key] = [None] * len(self)
            else:
                self._cache[key] = _by_distinct(raw, _text_or_none) or [v or None for v in raw]
        return self._cache[key]  # type: ignore[return-value]

    def ints(self, column: str) -> list[int | None]:
        """The column as ints, None for empty or unreadable cells (cached)."""
        key = (column, "int")
        if key not in self._cache:
            parsed = self._parsed(column, "int")
            if parsed is None:
                parsed = _convert(self.raw.get(column), len(self), int, _to_int)
            self._cache[key] = parsed
        return self._cache[key]  # type: ignore[return-value]

    def floats(self, column: str) -> list[float | None]:
        """The column as floats, None for empty or unreadable cells (cached)."""
        key = (column, "float")
        if key not in self._cache:
            parsed = self._parsed(column, "float")
            if parsed is None:
                parsed = _convert(self.raw.get(column), len(self), float, _to_float)
            self._cache[key] = parsed
        return self._cache[key]  # type: ignore[return-value]

    def int_column(self, column: str) -> Column:
        """The column as int64 numbers with a known-mask (a missing column is all unknown)."""
        return _column(self.ints(column), np.int64)

    def float_column(self, column: str) -> Column:
        """The column as float64 numbers with a known-mask (a missing column is all unknown)."""
        return _column(self.floats(column), np.float64)

    def labels(self, column: str) -> Labels:
        """A text column (phase, time, ...) as codes into its distinct non-empty cells, in order of appearance."""
        cells = self.strings(column)
        index: dict[str, int] = {}
        codes = np.fromiter(
            (-1 if c is None else index.setdefault(c, len(index)) for c in cells), dtype=np.int32, count=len(cells)
        )
        return Labels(codes, list(index))

    def gpus(self) -> list[int | None]:
        """The distinct GPU indices in order of appearance (None for host-only rows)."""
        return list(dict.fromkeys(self.ints("gpu")))

    def select(self, **equals: object) -> LogTable:
        """The rows where each named column equals the value (compared as text; None matches empty)."""
        n = len(self)
        keep: list[int] | None = None
        for name, value in equals.items():
            want = "" if value is None else str(value)
            cells = self.raw.get(name)
            if cells is None:
                keep = [] if want else keep  # a missing column is all empty
                continue
            rows = range(n) if keep is None else keep
            keep = [i for i in rows if cells[i] == want]
        if keep is None:
            return LogTable(self.path, {c: list(v) for c, v in self.raw.items()}, self.kind)
        return LogTable(self.path, {c: _take(v, keep) for c, v in self.raw.items()}, self.kind)


class CellSource(Protocol):
    """A file's cells located but not yet made into strings (fastcsv.ByteColumns)."""

    header: list[str]
    rows: int

    def text(self, j: int) -> list[str]: ...
    def filled(self, j: int) -> bool: ...
    def ints(self, j: int) -> list[int | None] | None: ...
    def floats(self, j: int) -> list[float | None] | None: ...


class LazyText(Mapping[str, list[str]]):
    """Header -> column text, made from the source on first use (a report never needs most columns as text)."""

    def __init__(self, columns: CellSource) -> None:
        self.columns = columns
        self._index = {name: j for j, name in enumerate(columns.header)}  # a repeated name: the last wins
        self._made: dict[str, list[str]] = {}

    def __getitem__(self, name: str) -> list[str]:
        if name not in self._made:
            self._made[name] = self.columns.text(self._index[name])
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def index(self, name: str) -> int | None:
        return self._index.get(name)


def _take(values: list[str], index: list[int]) -> list[str]:
    # itemgetter picks many positions in C; it returns a bare item (not a tuple) for one position.
    if not index:
        return []
    if len(index) == 1:
        return [values[index[0]]]
    return list(itemgetter(*index)(values))


# Cells of one column are spread over the whole heap (the file is split row by row), so each pass over
# a column of a day of rows is a million cache misses. A column with few distinct cells (the GPU
# index, its total, the phase, batch lengths) is converted one distinct cell at a time, and its
# converted cells then share a handful of objects that every later pass finds in the cache.
FEW_DISTINCT = 64


class _TooManyDistinct(Exception):
    pass


class _Distinct(dict[str, object]):
    """Cell -> its value, converted the first time the cell is met; refuses more than FEW_DISTINCT cells."""

    def __init__(self, convert: Callable[[str], object]) -> None:
        super().__init__()
        self.convert = convert

    def __missing__(self, cell: str) -> object:
        if len(self) >= FEW_DISTINCT:
            raise _TooManyDistinct
        value = self[cell] = self.convert(cell)
        return value


def _by_distinct(raw: list[str], convert: Callable[[str], object]) -> list[object] | None:
    """``[convert(cell) for cell in raw]`` in one C pass when the column has few distinct cells, else None.

    The first rows are probed before the whole column is: a column of measurements is told apart at
    once, without a pass over all of it.
    """
    if len(set(raw[:FEW_DISTINCT])) > FEW_DISTINCT // 8:
        return None
    try:
        return list(map(_Distinct(convert).__getitem__, raw))
    except _TooManyDistinct:
        return None


# A cell is a number vramscope can compute with only when it is ASCII and within int64: a 400-digit cell
# (a damaged or hostile log) would overflow every float the analysis makes of it, and int() and float()
# also read other scripts' digits ("٤"), which no writer of these logs produces. Such cells are unknown.
MAX_CELL_INT = 2**63 - 1
_SAFE_INT_CHARS = 18  # any run of 18 digits (or a sign and 17) is within int64


def _convert(
    raw: list[str] | None, n: int, fast: type[int] | type[float], slow: Callable[[str], object]
) -> list[object]:
    if raw is None or not any(raw):
        return [None] * n
    # ``slow`` gives, cell by cell, what the passes below give (they only skip its checks).
    converted = _by_distinct(raw, slow)
    if converted is not None:
        return converted
    if (fast is int and max(map(len, raw)) > _SAFE_INT_CHARS) or not "".join(raw).isascii():
        return [slow(v) for v in raw]  # a long or non-ASCII cell: only the per-cell checks bound it
    try:
        values: list[object] = list(map(fast, raw))  # every cell known and clean: one C loop
    except ValueError:
        pass
    else:
        finite = fast is int or all(map(isfinite, values))  # type: ignore[arg-type]
        return values if finite else [slow(v) for v in raw]
    try:
        return [fast(v) if v else None for v in raw]  # gaps ('' = unknown)
    except ValueError:
        return [slow(v) for v in raw]  # type: ignore[operator]


def _text_or_none(text: str) -> str | None:
    return text or None


def _to_int(text: str) -> int | None:
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        number = int(text)
    except ValueError:
        try:
            value = float(text)  # "1.2e9" or "1024.0" from another writer
        except ValueError:
            return None  # a damaged cell is unknown, not a failed report
        if not isfinite(value) or abs(value) > MAX_CELL_INT:
            return None
        number = int(value)
    return number if abs(number) <= MAX_CELL_INT else None


def _to_float(text: str) -> float | None:
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if isfinite(value) else None


def read_log(path: str | os.PathLike[str]) -> LogTable:
    """Read one log, whatever its format (decided from its first line).

    A vramscope log rotated by ``--max-log-mb`` is read whole from its first file: ``mem.csv`` brings
    ``mem.csv.1``, ``mem.csv.2``, ... after it (up to the first missing one, or one with another header).

    Raises:
        LogFormatError: missing file, empty file, or a header that no reader knows, with what to do.
    """
    table = _read_one(os.fspath(path))
    if table.kind == "nvidia-smi":
        return table
    tables = [table]
    for part in log_parts(table.path)[1:]:
        try:
            more = _read_one(part)
        except LogFormatError:  # an empty last part: the writer stopped as it began it
            break
        if more.kind != table.kind or (table.kind == "vramscope" and more.columns != table.columns):
            break  # not a continuation of this log
        tables.append(more)
    return tables[0] if len(tables) == 1 else _concat(tables)


def _concat(tables: list[LogTable]) -> LogTable:
    columns = list(dict.fromkeys(c for t in tables for c in t.columns))
    sizes = [len(t) for t in tables]

    def joined(column: str) -> list[str]:
        values: list[str] = []
        for table, n in zip(tables, sizes, strict=True):
            values.extend(table.raw.get(column) or [""] * n)
        return values

    # Joined on first use, as one part's columns are: a report asks for a few of many columns.
    return LogTable(tables[0].path, _MadeOnUse({c: partial(joined, c) for c in columns}), tables[0].kind)


def read_log_bytes(name: str, what: str) -> bytes:
    """A log file's bytes, or one :class:`LogFormatError` line saying why not (``what``: what was expected)."""
    try:
        return read_regular_file(name, what)
    except NotRegularFileError as exc:  # /dev/zero would be read until memory ran out; a FIFO blocks
        raise LogFormatError(str(exc)) from None
    except FileNotFoundError:
        raise LogFormatError(f"log {name} does not exist; check the path") from None
    except IsADirectoryError:
        raise LogFormatError(f"{name} is a folder; give {what}") from None
    except OSError as exc:
        raise LogFormatError(f"cannot read log {name}: {exc.strerror or exc}") from None


def _read_one(name: str) -> LogTable:
    # Bytes, decoded in one go: text mode's newline translation would cost as much as the split.
    data = read_log_bytes(name, "a log written by vramscope or nvidia-smi")
    fast = _located(data)
    if fast is not None:
        return LogTable(name, LazyText(fast))
    text = data.decode("utf-8", errors="replace")
    del data
    first = text.lstrip()[:1]
    if not text or text.isspace():  # as ``not text.strip()``, without copying the file's text
        raise LogFormatError(f"log {name} is empty; was the run started with --log?")
    if first == "{":
        return _read_jsonl(name, text)
    header = text.split("\n", 1)[0].rstrip("\r")
    if "memory.used" in header or "memory.total" in header:
        return _read_nvidia_smi(name, text)
    if "time" in header.split(",") and "gpu" in header.split(","):
        return _read_csv(name, text)
    raise UnknownLogError(
        f"{name} is not a vramscope log or an nvidia-smi CSV (its header is {header[:80]!r}); "
        "use a file from 'vramscope run --log' or "
        "'nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv'",
        header,
    )


def _located(data: bytes) -> CellSource | None:
    """A large plain vramscope CSV's cells, found without making strings (numpy), or None."""
    line = data[:4096].split(b"\n", 1)[0].rstrip(b"\r")
    head = line.split(b",")
    if b"time" not in head or b"gpu" not in head or b"memory.used" in line or b"memory.total" in line:
        return None  # not a vramscope CSV (or its header is odd): the readers below decide
    try:
        from vramscope import fastcsv
    except ImportError:  # numpy is missing: the string path reads the same
        return None
    return fastcsv.locate(data)


def _complete_lines(text: str) -> str:
    # A crash can cut the last line mid-row: keep only what ends in a newline.
    if text.endswith("\n"):
        return text
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else ""


def _read_csv(name: str, text: str) -> LogTable:
    columns = _split_plain(text)
    if columns is None:
        try:
            columns = _split_quoted(_complete_lines(text))
        except csv.Error as exc:  # e.g. a cell over the csv module's size limit: not a log we wrote
            raise LogFormatError(f"{name} cannot be read as CSV ({exc}); is it a vramscope log?") from None
    return LogTable(name, columns)


def _split_plain(text: str) -> dict[str, list[str]] | None:
    """Split a CSV without quotes in C: every line end becomes its own cell, which also proves the rows even.

    Returns None when the file needs the csv module (quotes, mixed line ends, ragged rows).
    """
    first = text.find("\n")
    if first < 0 or '"' in text:
        return None
    newline = "\r\n" if text[first - 1 : first] == "\r" else "\n"
    # The text up to the last line end (a torn last line is dropped), without that end. When the file
    # ends with a line end (as a rule), the text is read in place rather than copied without it: the
    # counts below each find one more, and the split two more cells at the end ("\n", ""), cut off.
    end = text.rfind(newline)
    whole = end == len(text) - len(newline)
    body = text if whole else text[:end]
    if newline == "\r\n":
        if not body.count("\r") == body.count("\n") == body.count("\r\n"):
            return None
    elif "\r" in body:
        return None
    lines = body.count(newline) + (0 if whole else 1)  # the header is line 0
    if whole and lines == 1:  # the header alone: split it without its line end
        whole, body = False, text[:end]
    # "\n" is a cached one-character string, so the line marks cost no allocation. When every line has
    # `width` cells, the marks sit exactly every width + 1 cells; any ragged line moves one of them.
    cells = body.replace(newline, ",\n,").split(",") if lines > 1 else body.split(",")
    if whole:
        del cells[-2:]
    width = cells.index("\n") if lines > 1 else len(cells)
    if width < 2:
        return None  # one column: an empty line would pass for an empty cell; the csv module skips it
    stride = width + 1
    if len(cells) != lines * stride - 1 or cells[width::stride].count("\n") != lines - 1:
        return None
    return {h: cells[stride + j :: stride] for j, h in enumerate(cells[:width])}


def _split_quoted(body: str) -> dict[str, list[str]]:
    with gc_paused():
        # newline="": the csv module finds line ends itself (a stray "\r" is then a line end, not an error).
        reader = csv.reader(io.StringIO(body, newline=""))
        header = next(reader, [])
        width = len(header)
        columns: list[list[str]] = [[] for _ in header]
        appends = [c.append for c in columns]
        for row in reader:
            if len(row) == width:  # a torn or foreign row would shift every column after it
                for append, cell in zip(appends, row, strict=True):
                    append(cell)
    return dict(zip(header, columns, strict=True))


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (memory is still freed by reference counting).

    Why: a day of rows is a few dozen lists of a million cells each. Reading makes millions of new
    containers and the analysis many small ones; each triggers collections, and every full collection
    walks all the million-cell lists, for nothing: none of these objects forms a cycle.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read_jsonl(name: str, text: str) -> LogTable:
    # Each key's cells are kept as they come (with their rows once a row lacks the key), never padded per
    # row: padding every known column for every row made a log whose rows each bring a new key cost
    # rows x keys cells (a 2.6 MiB file took 2.2 GiB). Now memory follows the cells in the file, and a
    # column is made whole only when the report asks for it.
    columns: dict[str, _SparseColumn] = {c: _SparseColumn() for c in COLUMNS}
    count = 0
    for line in _complete_lines(text).splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, too many digits, nesting too deep
            continue  # a torn or foreign line in the middle of the file (two writers); skip it
        if not isinstance(row, dict):
            continue
        for key, value in row.items():
            column = columns.get(key)
            if column is None:  # a key first met here (even as null) is a column, as it always was
                column = columns[key] = _SparseColumn()
            if value is not None:
                column.add(count, str(value))
        count += 1
    if count == 0:
        raise LogFormatError(f"{name} holds no complete JSON row; is it a vramscope .jsonl log?")
    return LogTable(name, _MadeOnUse({key: partial(column.cells, count) for key, column in columns.items()}),
                    kind="jsonl")


class _SparseColumn:
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

    def cells(self, count: int) -> list[str]:
        """The whole column, '' where a row lacked the key."""
        if self.rows is None and len(self.values) == count:
            return self.values
        out = [""] * count
        for row, value in zip(self.rows if self.rows is not None else range(len(self.values)), self.values,
                              strict=True):
            out[row] = value
        return out


class _MadeOnUse(Mapping[str, list[str]]):
    """Column name -> its cells, made by a function on first use and kept (JSON Lines, a rotated set)."""

    def __init__(self, makers: dict[str, Callable[[], list[str]]]) -> None:
        self._makers = makers
        self._made: dict[str, list[str]] = {}

    def __getitem__(self, name: str) -> list[str]:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


_SMI_NUMBER = re.compile(r"([0-9.]+)")


def read_nvidia_smi_text(name: str, text: str) -> LogTable:
    """nvidia-smi's CSV from its text, header first (``logs_import`` gives a header-less one its header)."""
    return _read_nvidia_smi(name, text)


def _read_nvidia_smi(name: str, text: str) -> LogTable:
    """nvidia-smi --query-gpu=...,memory.used,memory.total --format=csv[,nounits] -> our columns."""
    # A header without its line end (nvidia-smi killed at once) still names the columns; rows need an end.
    body = _complete_lines(text) or text + "\n"
    first = body[: body.find("\n")]
    plain_header = '"' not in first
    # The header alone when it is plain: a reader over the whole body would copy a day of text first.
    reader = _csv_rows(name, csv.reader(io.StringIO(first if plain_header else body, newline=""),
                                        skipinitialspace=True))
    header = [h.strip() for h in next(reader, [])]
    keys = [h.split(" [")[0] for h in header]

    def col(key: str) -> int | None:
        return keys.index(key) if key in keys else None

    i_time, i_used, i_total = col("timestamp"), col("memory.used"), col("memory.total")
    i_index, i_util = col("index"), col("utilization.gpu")
    if i_used is None:
        raise LogFormatError(
            f"{name}: nvidia-smi CSV without memory.used; log it with --query-gpu=timestamp,memory.used,..."
        )
    if i_time is not None and plain_header:
        args = (body, len(header), i_time, i_used, i_total, i_index, i_util)
        fast = _smi_located(*args) or _smi_plain(*args)
        if fast is not None:
            return LogTable(name, LazyText(fast), kind="nvidia-smi")
    if plain_header:
        reader = _csv_rows(name, csv.reader(io.StringIO(body, newline=""), skipinitialspace=True))
        next(reader, None)
    out: dict[str, list[str]] = {c: [] for c in _SMI_COLUMNS}
    start: float | None = None
    millis: list[int | None] = []  # each row's stamp, for its place in its sample (its GPU, without an index)
    for row in reader:
        if len(row) != len(header):
            continue
        stamp = row[i_time].strip() if i_time is not None else ""
        unix = _smi_time(stamp)
        if unix is not None and start is None:
            start = unix
        millis.append(round(unix * 1000) if unix is not None else None)
        out["time"].append(_iso(unix) if unix is not None else "")
        out["elapsed_s"].append(f"{unix - start:.3f}" if unix is not None and start is not None else "")
        if i_index is not None:
            out["gpu"].append(row[i_index].strip())
        out["device_used_bytes"].append(_smi_mib(row[i_used]))
        out["device_total_bytes"].append(_smi_mib(row[i_total]) if i_total is not None else "")
        out["utilization_pct"].append(_smi_number(row[i_util]) if i_util is not None else "")
    if i_index is None:
        out["gpu"] = list(map(str, smi_samples.positions(millis)))
    return LogTable(name, out, kind="nvidia-smi")


_SMI_COLUMNS = ("time", "elapsed_s", "gpu", "device_used_bytes", "device_total_bytes", "utilization_pct")
# nvidia-smi's own timestamp, "2026/11/29 10:00:00.123": separators at fixed places, digits elsewhere.
SMI_STAMP_WIDTH = 23
SMI_STAMP_SEPARATORS = ((4, "/"), (7, "/"), (10, " "), (13, ":"), (16, ":"), (19, "."))
SMI_STAMP_DIGITS = tuple(i for i in range(SMI_STAMP_WIDTH) if i not in dict(SMI_STAMP_SEPARATORS))


def _iso(unix: float) -> str:
    # The form of vramscope's own logs (schema.py), so both kinds of log read alike.
    return datetime.fromtimestamp(unix, tz=timezone.utc).isoformat(timespec="milliseconds")


def _smi_plain(
    body: str, width: int, i_time: int, i_used: int, i_total: int | None, i_index: int | None, i_util: int | None
) -> _SmiColumns | None:
    """nvidia-smi's usual output read by whole-column operations (C loops), or None.

    A day at 10 Hz is a million lines: the per-line path parses each timestamp with datetime and takes
    ~17 s here. This one takes only what it can vouch for (no quotes, even rows, millisecond
    timestamps, whole MiB, plain percentages) and gives the per-line path's cells exactly
    (tests/test_fastcsv.py); anything else returns None and that path decides cell by cell.
    """
    if '"' in body or "\r" in body:
        return None
    # Units go in one pass over the text ("[MiB]" in the header keeps its brackets); int() skips the
    # space that follows each comma.
    columns = _split_plain(body.replace(" MiB", "").replace(" %", ""))
    if columns is None or len(columns) != width:
        return None
    cells = list(columns.values())
    stamps = list(map(str.strip, cells[i_time]))
    if not stamps or not _plain_stamps(stamps) or max(map(itemgetter(slice(17, 19)), stamps)) >= "60":
        return None  # a 60th second: datetime refuses it, and so the per-line path leaves the cell unknown
    for column in [cells[i_used]] + ([cells[i_total]] if i_total is not None else []):
        joined = "".join(column).replace(" ", "")
        # Whole MiB below 2**33 (8 PiB): times 2**20 it stays exact in the float the per-line path uses.
        if not (joined.isascii() and joined.isdigit()) or max(map(len, column)) > 10:
            return None  # [N/A], fractions, signs: the per-line path
    extras = _smi_extras(cells[i_util] if i_util is not None else None,
                         cells[i_index] if i_index is not None else None)
    if extras is None:
        return None
    util, index = extras
    try:
        used = list(map(int, cells[i_used]))
        total = list(map(int, cells[i_total])) if i_total is not None else None
        # "2026/11/29 10:00:00.123" -> in whole milliseconds: the minute's start (once per minute) + "00" "123".
        minutes = _MinuteStarts()
        millis = list(map(add, map(minutes.__getitem__, map(itemgetter(slice(0, 16)), stamps)),
                          map(int, map(add, map(itemgetter(slice(17, 19)), stamps),
                                       map(itemgetter(slice(20, 23)), stamps)))))
    except ValueError:  # digits split by a space, a month 13: the per-line path leaves that cell unknown
        return None
    # Exact integers divided once: the float that float(f"{unix - start:.3f}") gives, in C loops.
    elapsed = list(map(truediv, map(sub, millis, repeat(millis[0])), repeat(1000)))
    gpu = index if index is not None else _tick_positions(stamps, millis)

    def times() -> list[str]:  # the text itself, in vramscope's form: "2026-11-29T10:00:00.123+00:00"
        return ("+00:00\n".join(stamps) + "+00:00").replace("/", "-").replace(" ", "T").split("\n")

    return _SmiColumns(times, elapsed, gpu, used, total, util)


def _smi_located(
    body: str, width: int, i_time: int, i_used: int, i_total: int | None, i_index: int | None, i_util: int | None
) -> _SmiColumns | None:
    """:func:`_smi_plain` for a large log, from its bytes with numpy (vramscope.fastcsv); None when it cannot."""
    try:
        from vramscope import fastcsv
    except ImportError:
        return None
    if len(body) < fastcsv.MIN_BYTES or not body.isascii():
        return None
    cells = fastcsv.locate(body.encode("ascii"))
    if cells is None or len(cells.header) != width:
        return None
    stamps = cells.stamps(i_time)
    used = cells.unit_ints(i_used, b" MiB", 9)  # whole MiB below 2**33, as in _smi_plain
    total = cells.unit_ints(i_total, b" MiB", 9) if i_total is not None else None
    if stamps is None or used is None or (i_total is not None and total is None):
        return None
    # The str path took " %" out of the whole text; here only the utilization cells hold it.
    extras = _smi_extras(list(map(methodcaller("replace", " %", ""), cells.text(i_util))) if i_util is not None
                         else None, cells.text(i_index) if i_index is not None else None)
    if extras is None:
        return None
    util, index = extras
    millis, chars = stamps
    elapsed: list[float] = ((millis - millis[0]) / 1000).tolist()  # exact integers divided once, as in _smi_plain
    gpu = index if index is not None else fastcsv.tick_positions(millis)
    return _SmiColumns(lambda: fastcsv.iso_times(chars), elapsed, gpu, used, total, util)


def _smi_extras(
    util: list[str] | None, index: list[str] | None
) -> tuple[list[str] | None, list[str] | None] | None:
    """The utilization and index columns stripped (each None when not logged), or None when a cell is not
    plain digits (an index never empty): the per-line path decides those."""
    stripped_util = _digit_cells(util) if util is not None else None
    stripped_index = _digit_cells(index) if index is not None else None
    if (util is not None and stripped_util is None) or (
        index is not None and (stripped_index is None or "" in stripped_index)
    ):
        return None
    return stripped_util, stripped_index


def _digit_cells(cells: list[str]) -> list[str] | None:
    """The cells stripped, if each is empty or ASCII digits; else None."""
    stripped = list(map(str.strip, cells))
    joined = "".join(stripped)
    return stripped if joined.isascii() and (joined.isdigit() or not joined) else None


def _plain_stamps(stamps: list[str]) -> bool:
    """Every stamp is "YYYY/MM/DD HH:MM:SS.mmm": checked by strided slices of their concatenation (C loops)."""
    n = len(stamps)
    joined = "".join(stamps)
    if len(joined) != SMI_STAMP_WIDTH * n or not joined.isascii():
        return False
    if any(joined[at::SMI_STAMP_WIDTH] != mark * n for at, mark in SMI_STAMP_SEPARATORS):
        return False
    return "".join(joined[at::SMI_STAMP_WIDTH] for at in SMI_STAMP_DIGITS).isdigit()


def _tick_positions(stamps: list[str], millis: list[int]) -> list[str]:
    """Each row's GPU when nvidia-smi logged no index: its place among the rows of its sample.

    A sample's rows may lie a few ms apart (multi-GPU hosts): :mod:`vramscope.smi_samples` decides when
    the gaps say so. Otherwise a sample is the rows of one timestamp; the usual log has the same GPUs
    at every tick, and then the positions repeat 0..G-1 and are made in C.
    """
    positive = [gap for gap in map(sub, millis[1:], millis[:-1]) if gap > 0]
    if positive and max(positive) >= smi_samples.MIN_JUMP * min(positive):
        return list(map(str, smi_samples.positions(millis)))
    per_tick = stamps.count(stamps[0]) if stamps else 0
    ticks = stamps[::per_tick] if per_tick else []
    regular = (per_tick and len(stamps) % per_tick == 0 and not any(map(eq, ticks[1:], ticks[:-1]))
               and all(stamps[j::per_tick] == ticks for j in range(1, per_tick)))
    if regular:
        return list(map(str, range(per_tick))) * len(ticks)
    positions, position, last = [], 0, None
    for stamp in stamps:
        position = position + 1 if stamp == last else 0
        last = stamp
        positions.append(str(position))
    return positions


class _SmiColumns:
    """nvidia-smi's log as our columns (a CellSource): numbers kept as numbers, text made on first use."""

    header = list(_SMI_COLUMNS)

    def __init__(self, times: Callable[[], list[str]], elapsed: list[float], gpu: list[str], used: list[int],
                 total: list[int] | None, util: list[str] | None) -> None:
        self.rows = len(elapsed)
        self._times = times
        self._elapsed = elapsed
        self._text: dict[str, list[str] | None] = {"gpu": gpu, "utilization_pct": util}
        self._ints: dict[str, list[int | None] | None] = {
            "device_used_bytes": list(map(MIB.__mul__, used)),
            "device_total_bytes": list(map(MIB.__mul__, total)) if total is not None else None,
        }

    def text(self, j: int) -> list[str]:
        name = self.header[j]
        if name == "time":
            return self._times()
        if name == "elapsed_s":
            return list(map(format, self._elapsed, repeat(".3f")))
        if name in self._text:
            return self._text[name] or [""] * self.rows
        values = self._ints[name]
        return list(map(str, values)) if values is not None else [""] * self.rows

    def filled(self, j: int) -> bool:
        name = self.header[j]
        if name in ("time", "elapsed_s"):
            return self.rows > 0
        if name in self._text:
            return any(self._text[name] or ())  # '' is unknown
        return bool(self._ints[name])  # every cell known: 0 bytes is a value

    def ints(self, j: int) -> list[int | None] | None:
        # Only the byte columns: the rest are converted from their text, as the string path does.
        return self._ints.get(self.header[j])

    def floats(self, j: int) -> list[float | None] | None:
        return list(self._elapsed) if self.header[j] == "elapsed_s" else None


class _MinuteStarts(dict[str, int]):
    """'2026/11/29 10:00' -> its Unix time in ms (UTC, as nvidia-smi's local clock is taken), once per minute."""

    def __missing__(self, minute: str) -> int:
        start = datetime.strptime(minute, "%Y/%m/%d %H:%M").replace(tzinfo=timezone.utc)
        value = self[minute] = int(start.timestamp()) * 1000
        return value


def _csv_rows(name: str, reader: Iterator[list[str]]) -> Iterator[list[str]]:
    try:
        yield from reader
    except csv.Error as exc:  # e.g. a cell over the csv module's size limit
        raise LogFormatError(f"{name} cannot be read as CSV ({exc}); is it an nvidia-smi --format=csv log?") from None


def _smi_number(cell: str) -> str:
    match = _SMI_NUMBER.search(cell)
    return match.group(1) if match else ""


def _smi_mib(cell: str) -> str:
    try:
        value = float(_smi_number(cell)) * MIB
    except ValueError:  # "", "1.2.3", "."
        return ""
    return str(int(value)) if value != float("inf") else ""  # 400 nines overflow a float: unknown


def _smi_time(stamp: str) -> float | None:
    try:  # "2024/01/15 10:23:45.123": fromisoformat is C code, strptime is not (10x on a day of rows)
        return datetime.fromisoformat(stamp.replace("/", "-")).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        pass
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f"):
        try:
            return datetime.strptime(stamp, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return None


def read_logs(paths: Iterable[str | os.PathLike[str]]) -> list[LogTable]:
    return [read_log(p) for p in paths]


def step_series(table: LogTable, column: str, gpu: int | None = None) -> tuple[list[int], list[int]]:
    """(steps, values) of the rows that have a step and a value for ``column`` (one GPU if given)."""
    steps = table.ints("step")
    values = table.ints(column)
    gpus = table.ints("gpu") if gpu is not None else None
    xs: list[int] = []
    ys: list[int] = []
    for i, (s, v) in enumerate(zip(steps, values, strict=True)):
        if s is None or v is None or (gpus is not None and gpus[i] != gpu):
            continue
        xs.append(s)
        ys.append(v)
    return xs, ys


def columns_of(rows: Sequence[dict[str, object]]) -> list[str]:
    """Column names in first-seen order over rows (for writing tables built in memory)."""
    return list(dict.fromkeys(k for r in rows for k in r))
