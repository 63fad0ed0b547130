"""nvidia-smi's own CSV (``--query-gpu=timestamp,...,memory.used,memory.total --format=csv[,nounits]``) as
vramscope's columns: time, elapsed_s, gpu, device_used_bytes, device_total_bytes, utilization_pct.

The file is located like a vramscope CSV (or split by the csv module when it needs quoting rules), and
each column is then read for the whole file at once: timestamps "2026/11/29 10:00:00.123" and
"20000 MiB" cells are parsed from the bytes with numpy, and only the cells that are not of that shape
("[N/A]", a second-only timestamp, a fraction) go through the per-cell rules below. Without an index
column a row's GPU is its place among the rows of its sample (:mod:`vramscope.logs.smi_samples`).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import numpy as np

from vramscope.logs import cells as cellparse
from vramscope.logs import smi_samples
from vramscope.logs.cells import CellRanges, CellSource, Column, Labels
from vramscope.logs.csv_reader import csv_columns
from vramscope.logs.errors import LogFormatError
from vramscope.logs.locate import locate
from vramscope.logs.source import LogSource
from vramscope.logs.table import ColumnData, LogTable, NumberColumn, TextColumn

MIB = 1024 * 1024
# nvidia-smi's own timestamp, "2026/11/29 10:00:00.123": separators at fixed places, digits elsewhere.
SMI_STAMP_WIDTH = 23
SMI_STAMP_SEPARATORS = ((4, "/"), (7, "/"), (10, " "), (13, ":"), (16, ":"), (19, "."))
_STAMP_MARK_AT = [at for at, _ in SMI_STAMP_SEPARATORS]
_STAMP_MARKS = np.frombuffer("".join(mark for _, mark in SMI_STAMP_SEPARATORS).encode(), dtype=np.uint8)
_STAMP_DIGIT_AT = [i for i in range(SMI_STAMP_WIDTH) if i not in dict(SMI_STAMP_SEPARATORS)]
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)
_ISO_WIDTH = 29  # "2026-11-29T10:00:00.123+00:00", the form of vramscope's own logs
_SMI_NUMBER = re.compile(r"([0-9.]+)")
_UNITS = ((b" MiB", "<u4"), (b" %", "<u2"))


def sniff(source: LogSource) -> bool:
    """nvidia-smi's header: a ``memory.used`` or ``memory.total`` field."""
    return "memory.used" in source.header or "memory.total" in source.header


def read(source: LogSource) -> LogTable:
    return read_nvidia_smi(source.name, source.data())


def read_nvidia_smi(name: str, data: bytes) -> LogTable:
    """nvidia-smi's CSV from its bytes, header first (:mod:`vramscope.logs.imports` gives a header-less one its
    own). A last line without its line end is dropped."""
    if b"\n" not in data:  # a header without its line end (nvidia-smi killed at once) still names the columns
        data += b"\n"
    located = locate(data)
    if located is not None:
        header = [h.strip() for h in located.header]
        columns: list[CellSource] = [located.column(j) for j in range(len(header))]
    else:
        text = data.decode("utf-8", errors="replace")
        header, rows = csv_columns(name, text, "is it an nvidia-smi --format=csv log?", skip_initial_space=True)
        header = [h.strip() for h in header]
        columns = [cellparse.pack(c) for c in rows]
    keys = [h.split(" [")[0] for h in header]

    def col(key: str) -> CellRanges | None:
        return _strip(columns[keys.index(key)].ranges()) if key in keys else None  # the first of a repeated name

    if "memory.used" not in keys:
        raise LogFormatError(
            f"{name}: nvidia-smi CSV without memory.used; log it with --query-gpu=timestamp,memory.used,..."
        )
    used = col("memory.used")
    assert used is not None
    n = len(used)
    stamps, index, total, util = col("timestamp"), col("index"), col("memory.total"), col("utilization.gpu")
    millis = _stamps(stamps) if stamps is not None else Column(np.zeros(n), np.zeros(n, dtype=bool))
    known_at = np.flatnonzero(millis.known)
    start = millis.values[known_at[0]] if len(known_at) else 0.0
    elapsed = Column(np.where(millis.known, np.round(millis.values - start) / 1000, 0.0), millis.known.copy())
    out: dict[str, ColumnData] = {
        "time": TimeColumn(millis),
        "elapsed_s": NumberColumn(elapsed),
        "gpu": (TextColumn(index) if index is not None
                else NumberColumn(Column(tick_positions(millis), np.ones(n, dtype=bool)))),
        "device_used_bytes": NumberColumn(_mib_bytes(used)),
        "device_total_bytes": NumberColumn(_mib_bytes(total) if total is not None else cellparse.unknown_column(
            n, np.int64)),
        "utilization_pct": NumberColumn(_whole_if_can(_numbers(util)) if util is not None
                                        else cellparse.unknown_column(n, np.int64)),
    }
    return LogTable(name, out, kind="nvidia-smi", rows=n)


def _strip(cells: CellRanges) -> CellRanges:
    """The cells without spaces around them (nvidia-smi writes ", " between cells)."""
    view = np.frombuffer(cells.data, dtype=np.uint8)
    starts, ends = cells.starts.copy(), cells.ends.copy()
    for at, step in ((starts, 1), (ends, -1)):
        while True:
            edge = at if step == 1 else at - 1
            inside = ends > starts
            space = np.zeros(len(at), dtype=bool)
            space[inside] = view[edge[inside]] == 32
            if not space.any():
                break
            at[space] += step
    return CellRanges(cells.data, starts, ends)


def _numbers(cells: CellRanges) -> Column:
    """The first number in each cell ("20000 MiB", "45 %", "20000"), as floats; none (unknown) for "[N/A]"."""
    return cellparse.floats(_without_units(cells), _first_number)


def _without_units(cells: CellRanges) -> CellRanges:
    """The cells with a trailing " MiB" or " %" cut off, in whole-column operations."""
    ends = cells.ends.copy()
    for unit, dtype in _UNITS:
        size = len(unit)
        if len(cells.data) < size:
            continue
        # Every byte's next `size` bytes as one number (a strided view): one compare a cell.
        tails = np.ndarray(shape=(len(cells.data) - size + 1,), dtype=dtype, buffer=cells.data, strides=(1,))
        long_enough = np.flatnonzero(ends - cells.starts > size)
        ends[long_enough[tails[ends[long_enough] - size] == np.frombuffer(unit, dtype=dtype)[0]]] -= size
    return CellRanges(cells.data, cells.starts, ends)


def _first_number(cell: str) -> float | None:
    """Any other cell: its first run of digits and dots ("-5 MiB" is 5, as nvidia-smi never writes a sign)."""
    match = _SMI_NUMBER.search(cell)
    return cellparse.float_of(match.group(1)) if match else None


def _mib_bytes(cells: CellRanges) -> Column:
    """MiB cells as bytes: whole MiB below 2**43 (within int64 as bytes) parsed from the bytes, the rest
    (fractions, "[N/A]", 400 nines) by :func:`_first_number`."""
    narrowed = _without_units(cells)
    whole = cellparse.ints(narrowed, one=_not_here)
    np.logical_and(whole.known, whole.values < 2**43, out=whole.known)
    whole.values[whole.known] *= MIB
    whole.values[~whole.known] = 0
    for i in np.flatnonzero((narrowed.ends > narrowed.starts) & ~whole.known).tolist():
        mib = _first_number(narrowed.cell(i))
        size = mib * MIB if mib is not None else None
        if size is not None and abs(size) <= cellparse.MAX_CELL_INT:  # 400 nines overflow: unknown
            whole.values[i] = int(size)
            whole.known[i] = True
    return whole


def _not_here(_cell: str) -> None:
    return None  # the caller reads these cells itself


def _whole_if_can(column: Column) -> Column:
    """Whole percentages as ints (the text "45" reads back as 45); a fraction keeps the column as floats."""
    values = column.values[column.known]
    if (values == np.trunc(values)).all() and (np.abs(values) < 2**53).all():
        return Column(np.where(column.known, column.values, 0).astype(np.int64), column.known)
    return column


def _stamps(cells: CellRanges) -> Column:
    """Each stamp as Unix milliseconds (float64; the clock taken as UTC), parsed from the bytes when it is
    "YYYY/MM/DD HH:MM:SS.mmm" of a real date, else by :func:`smi_time`; unknown when neither reads it."""
    n = len(cells)
    out = Column(np.zeros(n), np.zeros(n, dtype=bool))
    rows = np.flatnonzero(cells.ends - cells.starts == SMI_STAMP_WIDTH)
    if len(rows):
        chars = cellparse.fixed_rows(cells.data, cells.starts[rows], SMI_STAMP_WIDTH)
        digits = chars[:, _STAMP_DIGIT_AT] - np.uint8(48)
        shaped = (chars[:, _STAMP_MARK_AT] == _STAMP_MARKS).all(axis=1) & (digits <= 9).all(axis=1)
        d = digits.astype(np.int64)
        year = d[:, 0] * 1000 + d[:, 1] * 100 + d[:, 2] * 10 + d[:, 3]
        month, day = d[:, 4] * 10 + d[:, 5], d[:, 6] * 10 + d[:, 7]
        hour, minute, second = d[:, 8] * 10 + d[:, 9], d[:, 10] * 10 + d[:, 11], d[:, 12] * 10 + d[:, 13]
        millis = d[:, 14] * 100 + d[:, 15] * 10 + d[:, 16]
        leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
        last_day = _MONTH_DAYS[np.clip(month - 1, 0, 11)] + ((month == 2) & leap)
        # What datetime refuses stays unknown: a 13th month, a 30th of February, a 60th second.
        real = (shaped & (month >= 1) & (month <= 12) & (year >= 1) & (day >= 1) & (day <= last_day)
                & (hour < 24) & (minute < 60) & (second < 60))
        days = _days_from_civil(year, month, day)
        out.values[rows] = np.where(real, ((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis, 0)
        out.known[rows] = real
        odd = rows[~shaped]
    else:
        odd = np.zeros(0, dtype=np.int64)
    others = np.ones(n, dtype=bool)
    others[rows] = False
    others[odd] = True
    for i in np.flatnonzero(others & (cells.ends > cells.starts)).tolist():
        unix = smi_time(cells.cell(i))
        if unix is not None:
            out.values[i] = round(unix * 1000, 3)
            out.known[i] = True
    return out


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of proleptic Gregorian dates, whole columns at once (H. Hinnant's algorithm)."""
    y = year - (month <= 2)
    era = y // 400
    year_of_era = y - era * 400
    day_of_year = (153 * np.where(month > 2, month - 3, month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    result: np.ndarray = era * 146_097 + day_of_era - 719_468
    return result


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


def _iso_times(millis: Column) -> CellRanges:
    """The stamps in vramscope's form, "2026-11-29T10:00:00.123+00:00", as fixed-width cells of one buffer,
    written digit by digit for the whole column (years 1 to 9999; any other stays unknown)."""
    n = len(millis)
    ms = np.floor(np.where(millis.known, millis.values, 0)).astype(np.int64)
    days, in_day = np.divmod(ms, 86_400_000)
    year, month, day = _civil_from_days(days)
    known = millis.known & (year >= 1) & (year <= 9999)
    rows = np.zeros((n, _ISO_WIDTH), dtype=np.uint8)
    rows[:] = np.frombuffer(b"0000-00-00T00:00:00.000+00:00", dtype=np.uint8)
    fields = ((year, 0, 4), (month, 5, 2), (day, 8, 2), (in_day // 3_600_000, 11, 2),
              (in_day // 60_000 % 60, 14, 2), (in_day // 1000 % 60, 17, 2), (in_day % 1000, 20, 3))
    for value, at, width in fields:
        for k in range(width):
            rows[:, at + width - 1 - k] += (value // 10**k % 10).astype(np.uint8)
    starts = np.arange(n, dtype=np.int64) * _ISO_WIDTH + cellparse.PAD
    return CellRanges(b"0" * cellparse.PAD + rows.tobytes(), starts, starts + np.where(known, _ISO_WIDTH, 0))


def _civil_from_days(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(year, month, day) of days since 1970-01-01, whole columns at once (H. Hinnant's algorithm)."""
    z = days + 719_468
    era = z // 146_097
    day_of_era = z - era * 146_097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = np.where(shifted_month < 10, shifted_month + 3, shifted_month - 9)
    year = year_of_era + era * 400 + (month <= 2)
    return year, month, day


class TimeColumn:
    """nvidia-smi's stamps as a column: the text, in vramscope's form, made only when it is asked for."""

    def __init__(self, millis: Column) -> None:
        self.millis = millis

    def __len__(self) -> int:
        return len(self.millis)

    def filled(self) -> bool:
        return self.millis.any_known()

    def _text(self) -> TextColumn:
        return TextColumn(_iso_times(self.millis))

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
    index = np.arange(n)
    first = np.maximum.accumulate(np.where(new, index, 0))
    positions: np.ndarray = index - first
    return positions.astype(np.int64)


def _sample_sizes(new: np.ndarray) -> dict[int, int]:
    """{size: samples} where ``new`` marks each sample's first row."""
    begins = np.flatnonzero(new)
    sizes, counts = np.unique(np.diff(np.append(begins, len(new))), return_counts=True)
    return dict(zip(sizes.tolist(), counts.tolist(), strict=True))
