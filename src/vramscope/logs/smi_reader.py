"""nvidia-smi's own CSV (``--query-gpu=timestamp,...,memory.used,memory.total --format=csv[,nounits]``) as
vramscope's columns: time, elapsed_s, gpu, device_used_bytes, device_total_bytes, utilization_pct.

The file is split by pyarrow (or by the csv module when pyarrow refuses it), and each column is then
read for the whole file at once: timestamps "2026/11/29 10:00:00.123" and "20000 MiB" cells are parsed
by pyarrow's compute functions, and only the cells that are not of that shape
("[N/A]", a second-only timestamp, a fraction) go through the per-cell rules below. Without an index
column a row's GPU is its place among the rows of its sample (:mod:`vramscope.logs.smi_samples`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from vramscope.logs import cells as cellparse
from vramscope.logs import smi_samples
from vramscope.logs.arrow_columns import ArrowColumn, array_of, numbers_by_rule, numpy_filled, numpy_of
from vramscope.logs.cells import Column, Labels
from vramscope.logs.csv_reader import csv_columns
from vramscope.logs.errors import LogFormatError
from vramscope.logs.halves import halves, read_at_once
from vramscope.logs.source import LineStream, LogSource
from vramscope.logs.table import ColumnData, LogTable, NumberColumn

MIB = 1024 * 1024
_SMI_STAMP = r"^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}$"  # nvidia-smi's own
_YEAR_1_MS, _YEAR_10000_MS = -62_135_596_800_000, 253_402_300_800_000
_SMI_NUMBER = re.compile(r"([0-9.]+)")
_UNIT_SUFFIX = r" (MiB|%)$"
_WHOLE_MIB = r"^[0-9]{1,13}$"  # below 2**43 MiB: within int64 as bytes, and exact as a float
_PLAIN_FLOAT = r"^[0-9]{1,15}(\.[0-9]{0,15})?$"
_READ = ("timestamp", "index", "memory.used", "memory.total", "utilization.gpu")  # what the table is made of
STREAM_FROM = 1 << 20  # a smaller file is read whole


def sniff(source: LogSource) -> bool:
    """nvidia-smi's header: a ``memory.used`` or ``memory.total`` field."""
    return "memory.used" in source.header or "memory.total" in source.header


def read(source: LogSource) -> LogTable:
    """A file's lines streamed through pyarrow, only the columns read (the GPU's name is not); the bytes
    whole (:func:`read_nvidia_smi`) for a file that is small, has a quote, or that pyarrow refuses."""
    header = [h.strip() for h in source.header.split(",")]
    keys = [h.split(" [")[0] for h in header]
    if source.header_end < 0 or source.header_end - source.offset >= len(source.head) or len(header) < 2 \
            or '"' in source.header or source.size < STREAM_FROM:
        return read_nvidia_smi(source.name, source.data())
    wanted = sorted({keys.index(k) for k in _READ if k in keys})
    # The columns read cell by cell (their texts parsed where each part was split, on its own core), by place.
    per_cell = {keys.index(k): k for k in _PER_CELL if k in keys}
    streams = halves(source, source.header_end + 1)
    try:
        parts = read_at_once([partial(_split, stream, len(header), wanted, per_cell) for stream in streams])
    except pa.ArrowInvalid:  # not UTF-8, say: the bytes whole, to the csv module's rules
        return read_nvidia_smi(source.name, source.data())
    if any(stream.quoted for stream in streams):  # a quote after ", " is one to the csv module
        return read_nvidia_smi(source.name, source.data())  # (skipinitialspace), not to pyarrow
    tables = [table for table, _ in parts]
    parsed = {key: _joined([numbers[key] for _, numbers in parts]) for key in per_cell.values()}
    columns: list[pa.Array | None] = [None] * len(header)
    for j in wanted:  # one piece each, made as the pieces are let go (a copy of each column at a time)
        if j in per_cell:
            continue  # parsed already
        chunks = [chunk for table in tables for chunk in table.column(f"c{j}").chunks]
        tables = [table.drop_columns([f"c{j}"]) for table in tables]
        columns[j] = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
        del chunks
    del tables, parts
    return _smi_table(source.name, header, columns, parsed)


def _split(stream: LineStream, width: int, wanted: list[int], per_cell: dict[int, str]
           ) -> tuple[pa.Table, dict[str, Column]]:
    """The stream's lines split into the wanted columns' text, by pyarrow, the columns of ``per_cell`` (place ->
    field) parsed there and then by :data:`_PER_CELL`'s rules, their text let go: each rule reads a cell alone,
    so a part's cells are what the whole column's would be (:func:`_joined` puts them end to end)."""
    table = _text_columns(stream, width, wanted)
    numbers: dict[str, Column] = {}
    for j, key in per_cell.items():
        text = table.column(f"c{j}")
        cells = text.chunks[0] if text.num_chunks == 1 else pa.concat_arrays(text.chunks) if text.num_chunks \
            else pa.array([], type=pa.string())
        table = table.drop_columns([f"c{j}"])
        numbers[key] = _PER_CELL[key](cells)
        del text, cells
    return table, numbers


def _joined(parts: list[Column]) -> Column:
    """Parts' columns end to end: whole numbers (int64) when every part's are, else floats (a percentage of a
    fraction makes its whole column floats, as :func:`_whole_if_can` does; a whole number is exact either way)."""
    if len(parts) == 1:
        return parts[0]
    kind = np.int64 if all(p.values.dtype == np.int64 for p in parts) else np.float64
    return Column(np.concatenate([p.values.astype(kind, copy=False) for p in parts]),
                  np.concatenate([p.known for p in parts]))


def _text_columns(stream: LineStream, width: int, wanted: list[int]) -> pa.Table:
    return pacsv.read_csv(
        stream,
        # One of pyarrow's threads (csv_reader.THREADS): its pool cost a third more CPU here and, on 2 cores
        # shared with other work, 2-3 times the wall time of one (0.12 s against 0.38-0.46 s, 1M rows). A large
        # file's halves are read at once on two threads of ours instead (vramscope.logs.halves).
        read_options=pacsv.ReadOptions(column_names=[f"c{j}" for j in range(width)], use_threads=False),
        # No quote is looked for (the tokenizer is faster without): a file with one is read again.
        parse_options=pacsv.ParseOptions(newlines_in_values=False, quote_char=False,
                                         invalid_row_handler=lambda _row: "skip"),
        convert_options=pacsv.ConvertOptions(column_types={f"c{j}": pa.string() for j in wanted},
                                             include_columns=[f"c{j}" for j in wanted], null_values=[""],
                                             strings_can_be_null=True),
    )


def read_nvidia_smi(name: str, data: bytes) -> LogTable:
    """nvidia-smi's CSV from its bytes, header first (:mod:`vramscope.logs.imports` gives a header-less one its
    own). A last line without its line end is dropped."""
    if b"\n" not in data:  # a header without its line end (nvidia-smi killed at once) still names the columns
        data += b"\n"
    first = data.find(b"\n")
    header_line = data[:first].decode("utf-8", errors="replace").rstrip("\r")
    body = data[first + 1 : data.rfind(b"\n") + 1]
    header = [h.strip() for h in header_line.split(",")]
    try:
        # nvidia-smi writes no quotes; a quote after ", " is one to the csv module (skipinitialspace), not to pyarrow
        columns = _arrow_columns(body, len(header)) if b'"' not in data else None
    except pa.ArrowInvalid:  # not UTF-8, say: the csv module's rules
        columns = None
    if columns is None:
        text = data.decode("utf-8", errors="replace")
        header, rows = csv_columns(name, text, "is it an nvidia-smi --format=csv log?", skip_initial_space=True)
        header = [h.strip() for h in header]
        columns = [pa.array([c or None for c in column], type=pa.string()) for column in rows]
    return _smi_table(name, header, list(columns))


def _smi_table(name: str, header: list[str], columns: list[pa.Array | None],
               parsed: dict[str, Column] | None = None) -> LogTable:
    """The table of nvidia-smi's columns (text, each; None for a column not read); ``parsed``: the fields of
    :data:`_PER_CELL` already parsed (:func:`_split`), their text left out of ``columns``."""
    keys = [h.split(" [")[0] for h in header]
    done = parsed or {}

    def col(key: str) -> pa.Array | None:  # the first of a repeated name, its cells as read (" 20000 MiB")
        return columns[keys.index(key)] if key in keys else None

    def numbers(key: str) -> Column | None:  # the field's cells parsed by its rule
        if key in done:
            return done[key]
        cells = col(key)
        return _PER_CELL[key](cells) if cells is not None else None

    if "memory.used" not in keys:
        raise LogFormatError(
            f"{name}: nvidia-smi CSV without memory.used; log it with --query-gpu=timestamp,memory.used,..."
        )
    used = numbers("memory.used")
    assert used is not None
    n = len(used)
    index = col("index")
    millis, total, util = numbers("timestamp"), numbers("memory.total"), numbers("utilization.gpu")
    if millis is None:
        millis = Column(np.zeros(n), np.zeros(n, dtype=bool))
    known_at = np.flatnonzero(millis.known)
    start = millis.values[known_at[0]] if len(known_at) else 0.0
    elapsed = Column(np.where(millis.known, np.round(millis.values - start) / 1000, 0.0), millis.known.copy())
    out: dict[str, ColumnData] = {
        "time": TimeColumn(millis),
        "elapsed_s": NumberColumn(elapsed),
        "gpu": (ArrowColumn([_trimmed(index)], pa.string()) if index is not None
                else NumberColumn(Column(tick_positions(millis), np.ones(n, dtype=bool)))),
        "device_used_bytes": NumberColumn(used),
        "device_total_bytes": NumberColumn(total if total is not None else cellparse.unknown_column(n, np.int64)),
        "utilization_pct": NumberColumn(util if util is not None else cellparse.unknown_column(n, np.int64)),
    }
    return LogTable(name, out, rows=n)


def _arrow_columns(body: bytes, width: int) -> list[pa.Array]:
    """Every column as text, by pyarrow (rows of another width skipped, empty cells null)."""
    names = [f"c{j}" for j in range(width)]
    if not body.strip():
        return [pa.array([], type=pa.string()) for _ in names]
    table = pacsv.read_csv(
        pa.BufferReader(body),
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=lambda _row: "skip"),
        convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()), null_values=[""],
                                             strings_can_be_null=True),
    )
    return [table.column(j).combine_chunks() for j in range(width)]


def by_distinct(read: Callable[[pa.Array], Column], cells: pa.Array) -> Column:
    """``read(cells)``, computed on the column's distinct cells and spread back to its rows.

    A memory or utilization column repeats a few thousand texts a million times (the GPU's total: one), so
    its texts are hashed once (pyarrow's dictionary encoding) and only the distinct ones parsed: a fifth of
    the time. The same numbers: ``read``'s rules are per cell, and its whole-column choices (one unit for all,
    ints or floats) depend on which texts there are, not on how often; an empty cell is unknown (0) either way,
    as ``read`` makes it.
    """
    n = len(cells)
    if n < 4096 or cells.null_count == n:
        return read(cells)
    encoded = pc.dictionary_encode(cells)
    if len(encoded.dictionary) > n // 4:  # mostly distinct: no gain
        return read(cells)
    distinct = read(encoded.dictionary)
    codes = numpy_filled(encoded.indices, -1).astype(np.intp, copy=False)  # -1: an empty cell
    values, known = distinct.values[codes], distinct.known[codes]
    if encoded.null_count:
        empty = codes < 0
        values[empty] = 0
        known[empty] = False
    return Column(values, known)


def _trimmed(cells: pa.Array) -> pa.Array:
    """The cells without the spaces around them (nvidia-smi writes ", " between cells)."""
    return pc.utf8_trim(cells, " ")


def _plain_whole(cells: pa.Array) -> np.ndarray | None:
    """Every cell (as read, " 20000 MiB") a whole number below 2**43 ("20000 MiB", "45 %", "20000"; one unit
    for all), as int64, in a few passes of pyarrow; None when any cell is not (a fraction, "[N/A]"): then the
    rules, cell by cell.

    What the rules make of such a column: the number is the cell's digits (a sign is no digit, so the
    values must be at least 0), exact as a float (below 2**53), and within int64 as bytes (2**43 MiB).
    """
    if cells.null_count:
        return None
    if len(cells) and pc.all(pc.starts_with(cells, " ")).as_py():
        cells = pc.utf8_slice_codeunits(cells, 1)
    for suffix in (" MiB", " %"):
        if len(cells) and pc.all(pc.ends_with(cells, suffix)).as_py():
            cells = pc.utf8_slice_codeunits(cells, 0, -len(suffix))
            break
    try:
        values = numpy_of(pc.cast(cells, pa.int64()))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(values) and (int(values.min()) < 0 or int(values.max()) >= 2**43):
        return None
    return values


def _numbers(cells: pa.Array) -> Column:
    """The first number in each cell ("20000 MiB", "45 %", "20000"), as floats; none (unknown) for "[N/A]"."""
    plain = pc.replace_substring_regex(cells, _UNIT_SUFFIX, "")
    return numbers_by_rule(plain, np.float64, _PLAIN_FLOAT, pa.float64(), _first_number)


def _first_number(cell: str) -> float | None:
    """Any other cell: its first run of digits and dots ("-5 MiB" is 5, as nvidia-smi never writes a sign)."""
    match = _SMI_NUMBER.search(cell)
    return cellparse.float_of(match.group(1)) if match else None


def _mib_bytes(cells: pa.Array) -> Column:
    """MiB cells as bytes: whole MiB below 2**43 (within int64 as bytes) cast for the whole column, the rest
    (fractions, "[N/A]", 400 nines) by :func:`_first_number`."""
    whole = _plain_whole(cells)
    if whole is not None:
        return Column(whole * MIB, np.ones(len(whole), dtype=bool))
    plain = pc.replace_substring_regex(_trimmed(cells), _UNIT_SUFFIX, "")
    mib = numbers_by_rule(plain, np.float64, _WHOLE_MIB, pa.float64(), _first_number)
    size = mib.values * MIB
    known = mib.known & (np.abs(size) <= cellparse.MAX_CELL_INT)  # 400 nines overflow: unknown
    return Column(np.where(known, size, 0).astype(np.int64), known)


def _percent(cells: pa.Array) -> Column:
    whole = _plain_whole(cells)
    if whole is not None:
        return Column(whole, np.ones(len(whole), dtype=bool))
    return _whole_if_can(_numbers(_trimmed(cells)))


def _whole_if_can(column: Column) -> Column:
    """Whole percentages as ints (the text "45" reads back as 45); a fraction keeps the column as floats."""
    values = column.values[column.known]
    if (values == np.trunc(values)).all() and (np.abs(values) < 2**53).all():
        return Column(np.where(column.known, column.values, 0).astype(np.int64), column.known)
    return column


def _stamps(cells: pa.Array) -> Column:
    """Each stamp as Unix milliseconds (float64; the clock taken as UTC), parsed by pyarrow when it is
    "YYYY/MM/DD HH:MM:SS.mmm" of a real date, else by :func:`smi_time`; unknown when neither reads it."""
    n = len(cells)
    iso = _iso_shaped(cells)  # no space to trim around a stamp of that shape
    if iso is not None:
        try:
            millis = numpy_of(pc.cast(pc.cast(iso, pa.timestamp("ms")), pa.int64()))
            real = millis >= _YEAR_1_MS  # datetime has no year 0
            return Column(np.where(real, millis, 0).astype(np.float64), real)
        except pa.ArrowInvalid:
            pass  # a date that is none (a 30th of February): stamp by stamp, below
    cells = _trimmed(cells)
    shaped = pc.fill_null(pc.match_substring_regex(cells, _SMI_STAMP), False)
    rows = np.flatnonzero(numpy_of(shaped))
    picked = pc.filter(cells, shaped)
    try:  # pyarrow's ISO parser refuses what datetime refuses (a 30th of February, a 60th second) ...
        millis = numpy_of(pc.cast(pc.cast(pc.replace_substring(picked, "/", "-"), pa.timestamp("ms")), pa.int64()))
        real = np.ones(len(rows), dtype=bool)
    except pa.ArrowInvalid:  # ... for the whole column: then stamp by stamp, through strptime
        seconds = pc.utf8_slice_codeunits(picked, 0, 19)
        parsed = pc.strptime(seconds, format="%Y/%m/%d %H:%M:%S", unit="s", error_is_null=True)
        # strptime rolls a 30th of February over into March: a date is real when it prints back as written.
        real = numpy_of(pc.fill_null(pc.equal(pc.strftime(parsed, format="%Y/%m/%d %H:%M:%S"), seconds), False))
        whole = numpy_of(pc.fill_null(pc.cast(parsed, pa.int64()), 0))
        millis = whole * 1000 + numpy_of(pc.cast(pc.utf8_slice_codeunits(picked, 20, 23), pa.int64()))
    out = Column(np.zeros(n), np.zeros(n, dtype=bool))
    real &= millis >= _YEAR_1_MS  # datetime has no year 0
    out.values[rows] = np.where(real, millis, 0)
    out.known[rows] = real
    others = np.flatnonzero(numpy_of(pc.and_(pc.invert(shaped), pc.is_valid(cells))))
    for i, text in zip(others.tolist(), cells.take(array_of(others.astype(np.int64))).to_pylist(), strict=True):
        unix = smi_time(text)
        if unix is not None:
            out.values[i] = round(unix * 1000, 3)
            out.known[i] = True
    return out


_STAMP_FORM = np.frombuffer(b"0000/00/00 00:00:00.000", dtype=np.uint8)
_STAMP_DIGITS = np.equal(_STAMP_FORM, ord("0"))
_STAMP_LIMIT = np.where(_STAMP_DIGITS, 9, 0).astype(np.uint8)


def _iso_shaped(cells: pa.Array) -> pa.Array | None:
    """When every stamp is nvidia-smi's "YYYY/MM/DD HH:MM:SS.mmm" (what :data:`_SMI_STAMP` matches), the stamps
    with "-" for "/" for pyarrow's ISO parser, from the cells' bytes at once; else None."""
    n = len(cells)
    width = len(_STAMP_FORM)
    if cells.null_count or not n:
        return None
    offsets = np.frombuffer(cells.buffers()[1], dtype=np.int32, count=n + 1, offset=cells.offset * 4)
    first = int(offsets[0])
    if int(offsets[-1]) - first != n * width or not (np.diff(offsets) == width).all():
        return None
    data = np.frombuffer(cells.buffers()[2], dtype=np.uint8, count=n * width, offset=first).reshape(n, width)
    # A digit's byte minus "0" is 0 to 9 (one below "0" wraps past 9), any other byte minus its own is 0: checked
    # 32k rows at a time, so that the differences stay in memory already touched (a fresh page costs here).
    for start in range(0, n, 1 << 15):
        if not (data[start : start + (1 << 15)] - _STAMP_FORM <= _STAMP_LIMIT).all():
            return None
    iso = data.copy()
    iso[:, [4, 7]] = ord("-")
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets - first), pa.py_buffer(iso))


def smi_time(stamp: str) -> float | None:
    """One nvidia-smi stamp as Unix seconds (the clock taken as UTC), or None."""
    try:  # "2024/01/15 10:23:45.123": fromisoformat is C code, strptime is not
        return datetime.fromisoformat(stamp.replace("/", "-")).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        pass
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f"):
        try:
            return datetime.strptime(stamp, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return None


def _iso_times(millis: Column) -> pa.Array:
    """The stamps in vramscope's form, "2026-11-29T10:00:00.123+00:00" (years 1 to 9999; any other unknown)."""
    ms = np.floor(np.where(millis.known, millis.values, 0)).astype(np.int64)
    known = millis.known & (ms >= _YEAR_1_MS) & (ms < _YEAR_10000_MS)
    stamps = array_of(ms, known).cast(pa.timestamp("ms"))
    return pc.strftime(stamps, format="%Y-%m-%dT%H:%M:%S+00:00")  # %S of milliseconds: "00.123"


class TimeColumn:
    """nvidia-smi's stamps as a column: the text, in vramscope's form, made only when it is asked for."""

    def __init__(self, millis: Column) -> None:
        self.millis = millis

    def __len__(self) -> int:
        return len(self.millis)

    def filled(self) -> bool:
        return self.millis.any_known()

    def _text(self) -> ArrowColumn:
        return ArrowColumn([_iso_times(self.millis)], pa.string())

    def ints(self) -> Column:
        return cellparse.unknown_column(len(self), np.int64)  # "2026-11-29T10:00:00.000+00:00" is no number

    def floats(self) -> Column:
        return cellparse.unknown_column(len(self), np.float64)

    def texts(self) -> list[str | None]:
        return self._text().texts()

    def labels(self) -> Labels:
        return self._text().labels()

    def take(self, rows: np.ndarray) -> TimeColumn:
        return TimeColumn(Column(self.millis.values[rows], self.millis.known[rows]))


def tick_positions(millis: Column) -> np.ndarray:
    """Each row's place among the rows of its sample (its GPU when nvidia-smi logged no index), int64.

    A sample's rows share a stamp or lie a few ms apart (:mod:`vramscope.logs.smi_samples` decides which);
    an unknown stamp starts a sample of its own.
    """
    n = len(millis)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    values, known = millis.values, millis.known
    gaps = np.diff(values)
    both = known[1:] & known[:-1]
    new = np.ones(n, dtype=bool)
    new[1:] = ~both | (gaps != 0)
    positive = gaps[both & (gaps > 0)]
    if positive.size and float(positive.max()) >= smi_samples.MIN_JUMP * float(positive.min()):
        tolerance = smi_samples.within_sample_tolerance(np.unique(positive).tolist())
        if tolerance is not None:
            tolerant = np.ones(n, dtype=bool)
            tolerant[1:] = ~both | (gaps < 0) | (gaps > tolerance)
            if smi_samples.tolerance_is_better(_sample_sizes(new), _sample_sizes(tolerant)):
                new = tolerant
    if new.all():  # one GPU: every row a sample of its own
        return np.zeros(n, dtype=np.int64)
    index = np.arange(n)
    first = np.maximum.accumulate(np.where(new, index, 0))
    positions: np.ndarray = index - first
    return positions.astype(np.int64, copy=False)


def _sample_sizes(new: np.ndarray) -> dict[int, int]:
    """{size: samples} where ``new`` marks each sample's first row."""
    begins = np.flatnonzero(new)
    sizes, counts = np.unique(np.diff(np.append(begins, len(new))), return_counts=True)
    return dict(zip(sizes.tolist(), counts.tolist(), strict=True))


# The fields parsed cell by cell, each by its rule: the stamps into Unix milliseconds, the MiB cells into bytes and
# the percentages, each distinct text once (by_distinct). A rule reads each cell alone, so a file's parts can be
# parsed apart (_split) and put end to end (_joined).
_PER_CELL: dict[str, Callable[[pa.Array], Column]] = {
    "timestamp": lambda cells: _stamps(cells),
    "memory.used": lambda cells: by_distinct(_mib_bytes, cells),
    "memory.total": lambda cells: by_distinct(_mib_bytes, cells),
    "utilization.gpu": lambda cells: by_distinct(_percent, cells),
}
