"""Reading a memory log back, whatever its format: vramscope's CSV, its JSON Lines, nvidia-smi's CSV.

The format is decided from the first line; a log rotated by ``--max-log-mb`` is read whole from its
first file. The file is read once into columns (:class:`~vramscope.logs.table.LogTable`); a column is
converted to numpy arrays the first time it is asked for.
"""

from __future__ import annotations

import os
import re

from vramscope.logs.csv_reader import read_csv
from vramscope.logs.errors import LogFormatError, UnknownLogError
from vramscope.logs.files import log_parts
from vramscope.logs.inputfile import NotRegularFileError, read_regular_file
from vramscope.logs.jsonl_reader import read_jsonl
from vramscope.logs.smi_reader import read_nvidia_smi
from vramscope.logs.table import JoinedColumn, LogTable

_NOT_SPACE = re.compile(rb"[^ \t\n\r\x0b\x0c\x1c-\x1f]")  # what str.isspace() calls space, in ASCII


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
    return tables[0] if len(tables) == 1 else _joined(tables)


def _joined(tables: list[LogTable]) -> LogTable:
    names = list(dict.fromkeys(c for t in tables for c in t.columns))
    sizes = [len(t) for t in tables]
    columns = {c: JoinedColumn([t.column_data(c) for t in tables], sizes) for c in names}
    return LogTable(tables[0].path, columns, tables[0].kind, rows=sum(sizes))


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
    data = read_log_bytes(name, "a log written by vramscope or nvidia-smi")
    first = _NOT_SPACE.search(data)  # found without copying or decoding the file
    if first is None:
        raise LogFormatError(f"log {name} is empty; was the run started with --log?")
    if data[first.start() : first.start() + 1] == b"{":
        return read_jsonl(name, data.decode("utf-8", errors="replace"))
    end = data.find(b"\n")
    header = data[: end if end >= 0 else len(data)].decode("utf-8", errors="replace").rstrip("\r")
    if "memory.used" in header or "memory.total" in header:
        return read_nvidia_smi(name, data)
    cells = header.split(",")
    if "time" in cells and "gpu" in cells:
        return read_csv(name, data)
    raise UnknownLogError(
        f"{name} is not a vramscope log or an nvidia-smi CSV (its header is {header[:80]!r}); "
        "use a file from 'vramscope run --log' or "
        "'nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv'",
        header,
    )
