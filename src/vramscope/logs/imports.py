"""Logs that vramscope did not write: a hand-written training-loop log, header-less nvidia-smi, any CSV.

These are the last formats of :data:`vramscope.logs.formats.FORMATS` (``read_any_log`` in
:mod:`vramscope.logs.reader` tries them after vramscope's own), recognised from the first lines:

* the log the usual guides write inside the loop,
  ``f"{datetime.now()},{step},{alloc_gb:.2f},{reserved_gb:.2f}\\n"``, with or without a header line:
  read as ``time=0,step=1,allocated=2:GiB,reserved=3:GiB`` (a header's names and units, such as
  ``allocated_mb``, are followed when it has them);
* ``nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv,noheader[,nounits]``:
  recognised from its cells' shapes and read as nvidia-smi's CSV.

``read_any_log(path, columns=parse_columns("time=0,step=1,allocated=2:GiB"))`` reads any CSV through
a column mapping. Anything else is refused in one line that says what was expected and names
``--columns`` (:func:`vramscope.logs.formats.refusal`, from the table). These formats are small as a rule:
they are read with the csv module, line by line.
"""

from __future__ import annotations

import csv
import difflib
import io
import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone

from vramscope.logs.errors import LogFormatError
from vramscope.logs.mapping import (
    BYTE_FIELDS,
    BYTE_UNITS,
    GPU_FIELDS,
    OTHER_FIELDS,
    TIME_UNITS,
    ColumnSpec,
)
from vramscope.logs.schema import iso_time
from vramscope.logs.smi_reader import read_nvidia_smi
from vramscope.logs.source import LogSource
from vramscope.logs.table import LogTable
from vramscope.units import MIB


class ImportedTable(LogTable):
    """A log read through a mapping; ``read_as`` is that mapping in ``--columns`` form, to show people."""

    def __init__(self, path: str, columns: dict[str, list[str]], read_as: str) -> None:
        super().__init__(path, columns)
        self.read_as = read_as


SMI_HEADER = b"timestamp, name, memory.used [MiB], memory.total [MiB]\n"


def sniff_headerless_smi(source: LogSource) -> bool:
    return _is_headerless_smi(source.header)


def read_headerless_smi(source: LogSource) -> LogTable:
    return read_nvidia_smi(source.name, SMI_HEADER + _text(source).encode())


def sniff_hand_written(source: LogSource) -> bool:
    return guess_columns(source.head.decode("utf-8", errors="replace")) is not None


def read_hand_written(source: LogSource) -> LogTable:
    text = _text(source)
    guessed = guess_columns(text)
    assert guessed is not None  # sniffed from the same first lines
    return read_mapped(source.name, text, guessed)


def read_with_columns(source: LogSource, columns: Sequence[ColumnSpec]) -> LogTable:
    """Any CSV through a ``--columns`` mapping."""
    return read_mapped(source.name, _text(source), columns)


def _text(source: LogSource) -> str:
    text = source.data().decode("utf-8", errors="replace")
    if not text.strip():
        raise LogFormatError(f"log {source.name} is empty; was the run started with --log?")
    return text


# -- recognising a file from its cells -------------------------------------------------------------------

_NUMBER = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")
_NUMBER_AND_UNIT = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)$")
_SMI_STAMP = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?$")
_MIB_CELL = re.compile(r"^\d+(\.\d+)?( MiB)?$")


def _cells(line: str) -> list[str]:
    try:
        return [c.strip() for c in next(csv.reader([line], skipinitialspace=True), [])]
    except csv.Error:  # a NUL byte, a cell past the csv module's limit: not a log of these kinds
        return []


def _head_lines(text: str, count: int) -> list[str]:
    """The first ``count`` non-empty lines, without splitting the whole of a large file."""
    return [line for line in text[: 1 << 16].splitlines()[:count] if line.strip()]


def _is_headerless_smi(line: str) -> bool:
    """``2026/11/29 10:00:00.123, NVIDIA H200, 1234 MiB, 143771 MiB`` (or without the units)."""
    cells = _cells(line)
    return (len(cells) == 4 and bool(_SMI_STAMP.match(cells[0])) and not _NUMBER.match(cells[1])
            and all(_MIB_CELL.match(c) for c in cells[2:]))


def _is_time(cell: str) -> bool:
    return not _NUMBER.match(cell) and _parse_time(cell, None) is not None


# Words in a header cell -> the field (first match wins; "max_allocated" is a peak, not allocated).
_HEADER_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("elapsed", ("elapsed",)),
    ("time", ("time", "date", "wall")),
    ("step", ("step", "iter")),
    ("reserved", ("reserv", "cached")),  # before peak: max_memory_reserved is reserved memory
    ("peak", ("peak", "max")),
    ("allocated", ("alloc",)),
    ("used", ("used",)),
    ("total", ("total",)),
    ("tokens", ("token",)),
    ("phase", ("phase",)),
    ("rank", ("rank",)),
    ("gpu", ("gpu", "device")),
)
_HEADER_UNIT = re.compile(r"(?:^|[^a-z])(gib|gb|mib|mb|kib|kb|bytes)(?:[^a-z]|$)")


def guess_columns(text: str) -> list[ColumnSpec] | None:
    """The mapping of a hand-written log (datetime, step, allocated, reserved), from its first lines; or None.

    Without a header the cells' shapes decide: a date and time, a whole step, then one or two numbers
    read as allocated and reserved. Their unit: bytes when every value is a whole number of at least
    1 MiB, else GiB (what ``torch.cuda.memory_allocated() / 1024**3`` gives; "GB" in a header is read
    as GiB too, for the same reason). A header's names place the fields and its units are followed.
    """
    lines = _head_lines(text, 6)
    if not lines:
        return None
    first = _cells(lines[0])
    if _data_shape(first):
        return _with_units(_usual(len(first)), text, header=None)
    if len(lines) < 2 or any(_NUMBER.match(c) for c in first):
        return None
    second = _cells(lines[1])
    if len(second) != len(first):
        return None
    specs: list[ColumnSpec] = []
    for index, cell in enumerate(first):
        key = cell.lower()
        taken = {s.field for s in specs}
        for field_name, words in _HEADER_WORDS:
            if field_name not in taken and any(w in key for w in words):
                unit_match = _HEADER_UNIT.search(key)
                unit = None
                if field_name in BYTE_FIELDS and unit_match:
                    unit = {"gb": "gib", "mb": "mib", "kb": "kib", "bytes": "b"}.get(unit_match.group(1),
                                                                                    unit_match.group(1))
                specs.append(ColumnSpec(field_name, index, unit))
                break
    fields = {s.field for s in specs}
    if fields & set(BYTE_FIELDS) and fields & {"time", "step", "elapsed"}:
        return _with_units(specs, text, header=first)
    if _data_shape(second):  # a header of other words over the usual cells: placed as without one
        return _with_units(_usual(len(second)), text, header=first)
    return None


def _usual(width: int) -> list[ColumnSpec]:
    """time, step, allocated[, reserved]: the order of the usual hand-written line."""
    specs = [ColumnSpec("time", 0), ColumnSpec("step", 1), ColumnSpec("allocated", 2)]
    return specs + ([ColumnSpec("reserved", 3)] if width == 4 else [])


def _data_shape(cells: list[str]) -> bool:
    """A date and time, a whole step, then one or two numbers."""
    return (len(cells) in (3, 4) and _is_time(cells[0]) and cells[1].isdigit()
            and all(_NUMBER.match(c) for c in cells[2:]))


def _with_units(specs: list[ColumnSpec], text: str, header: list[str] | None) -> list[ColumnSpec]:
    """Byte fields without a unit get one from their values (see :func:`guess_columns`)."""
    rows = [_cells(line) for line in _head_lines(text, 200)[1 if header else 0 :]]
    out = []
    for spec in specs:
        if spec.field in BYTE_FIELDS and spec.unit is None:
            assert isinstance(spec.ref, int)
            values = [r[spec.ref] for r in rows if len(r) > spec.ref and _NUMBER.match(r[spec.ref])]
            whole = bool(values) and all(v.isdigit() and int(v) >= MIB for v in values)
            spec = ColumnSpec(spec.field, spec.ref, "b" if whole else "gib")
        out.append(spec)
    return out


# -- reading through a mapping ---------------------------------------------------------------------------


def read_mapped(name: str, text: str, columns: Sequence[ColumnSpec]) -> ImportedTable:
    """The CSV ``text`` read through ``columns`` into vramscope's columns.

    The first line is a header when the mapping names columns, or when a numeric field's cell in it is
    not a number although it is in the line after. A cell that is not a value is unknown; a row too
    short for the mapping, and a last line cut by a crash, are dropped.

    Raises:
        LogFormatError: a named column the header lacks, an index past every row, no value read at all,
            or a byte column of fractions without a unit.
    """
    body = text if text.endswith("\n") else text[: text.rfind("\n") + 1] or text
    reader = csv.reader(io.StringIO(body, newline=""), delimiter=_delimiter(body), skipinitialspace=True)
    try:
        rows = [[c.strip() for c in row] for row in reader if any(c.strip() for c in row)]
    except csv.Error as exc:  # a NUL byte, a cell past the csv module's limit
        raise LogFormatError(f"{name} cannot be read as CSV ({exc}); is it a text log?") from None
    if not rows:
        raise LogFormatError(f"log {name} has no rows; is it a CSV?")
    header: list[str] | None = None
    if any(isinstance(s.ref, str) for s in columns) or _first_row_is_header(rows, columns):
        header, rows = rows[0], rows[1:]
    where = {s.field: _index_of(name, s, header, rows) for s in columns}
    width = max(where.values()) + 1
    rows = [r for r in rows if len(r) >= width]
    if not rows:
        raise LogFormatError(f"log {name} has no row with {width} columns, as the mapping needs; check --columns")
    out: dict[str, list[str]] = {}
    by_field = {s.field: s for s in columns}
    unix: list[float | None] | None = None
    for spec in columns:
        cells = [r[where[spec.field]] for r in rows]
        if spec.field == "time":
            unix = [_parse_time(c, spec.unit) for c in cells]
            out["time"] = [iso_time(u) if u is not None else "" for u in unix]
        elif spec.field == "elapsed":
            scale = TIME_UNITS[spec.unit or "s"]
            out["elapsed_s"] = [_number_text(c, scale) for c in cells]
        elif spec.field in BYTE_FIELDS:
            out[BYTE_FIELDS[spec.field]] = _bytes_column(name, spec, cells)
        elif spec.field == "phase":
            out["phase"] = cells
        else:
            out[OTHER_FIELDS[spec.field]] = [_int_text(c) for c in cells]
    if "elapsed" not in by_field and unix is not None:
        start = next((u for u in unix if u is not None), None)
        out["elapsed_s"] = [f"{u - start:.3f}" if u is not None and start is not None else "" for u in unix]
    if "gpu" not in by_field:
        # A training loop's torch.cuda figures are of its one device; host memory alone is of no GPU.
        on_gpu = any(f in by_field for f in GPU_FIELDS)
        out["gpu"] = ["0" if on_gpu else ""] * len(rows)
    if not any(any(out[BYTE_FIELDS[s.field]]) for s in columns if s.field in BYTE_FIELDS):
        memory = [str(s) for s in columns if s.field in BYTE_FIELDS]
        raise LogFormatError(f"{name}: no row has a number in {', '.join(memory)}; check --columns "
                             f"(the first row is {','.join(rows[0])[:80]!r})")
    return ImportedTable(name, out, read_as=",".join(map(str, columns)))


def _delimiter(body: str) -> str:
    first = body[: body.find("\n")] if "\n" in body else body
    if "," in first:
        return ","
    return next((d for d in ("\t", ";") if d in first), ",")


def _first_row_is_header(rows: list[list[str]], columns: Sequence[ColumnSpec]) -> bool:
    if len(rows) < 2:
        return False
    numeric = [s.ref for s in columns if isinstance(s.ref, int) and s.field not in ("phase", "time")]
    first, second = rows[0], rows[1]

    def is_value(row: list[str], j: int) -> bool:
        return j < len(row) and _NUMBER_AND_UNIT.match(row[j]) is not None

    return any(isinstance(j, int) and not is_value(first, j) and is_value(second, j) for j in numeric)


def _index_of(name: str, spec: ColumnSpec, header: list[str] | None, rows: list[list[str]]) -> int:
    if isinstance(spec.ref, str):
        assert header is not None
        wanted = spec.ref.lower()
        for j, cell in enumerate(header):
            if cell.lower() == wanted:
                return j
        near = difflib.get_close_matches(spec.ref, header, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise LogFormatError(f"--columns {spec}: {name}'s header has no column {spec.ref!r}; {hint}"
                             f"it has: {', '.join(header)[:200]}")
    most = max(map(len, rows), default=0)
    if spec.ref >= most:
        raise LogFormatError(f"--columns {spec}: {name}'s rows have {most} columns (0 to {most - 1}); "
                             "columns are counted from 0")
    return spec.ref


def _bytes_column(name: str, spec: ColumnSpec, cells: list[str]) -> list[str]:
    out = []
    for cell in cells:
        match = _NUMBER_AND_UNIT.match(cell)
        if match is None:
            out.append("")
            continue
        value = float(match.group(1))
        unit = match.group(2).lower() or spec.unit or "b"
        if unit not in BYTE_UNITS:
            out.append("")
            continue
        if spec.unit is None and not match.group(2) and value != int(value):
            raise LogFormatError(f"--columns {spec} reads bytes, but {name} holds {cell!r} there; give the "
                                 f"column's unit, e.g. {spec.field}={spec.ref}:GiB")
        size = value * BYTE_UNITS[unit]
        out.append(str(round(size)) if math.isfinite(size) and size >= 0 else "")
    return out


def _number_text(cell: str, scale: float) -> str:
    try:
        value = float(cell) * scale
    except ValueError:
        return ""
    return f"{value:.3f}" if math.isfinite(value) else ""


def _int_text(cell: str) -> str:
    if cell.isdigit():
        return cell
    try:
        value = float(cell)
    except ValueError:
        return ""
    return str(int(value)) if math.isfinite(value) and value == int(value) else ""


def _parse_time(cell: str, unit: str | None) -> float | None:
    """A date and time (ISO, ``str(datetime.now())``, nvidia-smi's), or a number of seconds (Unix time).

    A time without a zone is taken as UTC, as for nvidia-smi's stamps: the report shows it as written.
    """
    if not cell:
        return None
    if _NUMBER.match(cell):
        value = float(cell) * TIME_UNITS[unit or "s"]
        return value if math.isfinite(value) else None
    try:
        stamp = datetime.fromisoformat(cell.replace("/", "-"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    try:
        return stamp.timestamp()
    except (OverflowError, OSError, ValueError):
        return None
