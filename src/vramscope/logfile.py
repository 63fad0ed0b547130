"""Reading memory logs back: vramscope's CSV and JSON Lines, and nvidia-smi's own CSV.

Column-oriented and lazy: the file is split into raw text columns in one ``csv.reader`` pass, and a
column is converted to numbers only when someone asks for it (``table.ints("reserved_bytes")``),
so a report over a day of samples costs little more than reading the file once. A last line cut by a
crash is dropped silently; the rows before it are all kept.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from vramscope.schema import COLUMNS

MIB = 1024 * 1024


class LogFormatError(ValueError):
    """The file is not a memory log vramscope can read."""


@dataclass
class LogTable:
    """A log's columns. Raw cells are strings ('' = unknown); typed views are cached."""

    path: str
    raw: dict[str, list[str]]
    kind: str = "vramscope"  # or "nvidia-smi", "jsonl"
    _cache: dict[tuple[str, str], list[object]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(next(iter(self.raw.values()), []))

    @property
    def columns(self) -> list[str]:
        return list(self.raw)

    def has(self, column: str) -> bool:
        """True when the column exists and holds at least one known value."""
        values = self.raw.get(column)
        return bool(values) and any(values)  # type: ignore[arg-type]

    def strings(self, column: str) -> list[str | None]:
        return [v or None for v in self.raw.get(column, [""] * len(self))]

    def ints(self, column: str) -> list[int | None]:
        key = (column, "int")
        if key not in self._cache:
            self._cache[key] = [_to_int(v) for v in self.raw.get(column, [""] * len(self))]
        return self._cache[key]  # type: ignore[return-value]

    def floats(self, column: str) -> list[float | None]:
        key = (column, "float")
        if key not in self._cache:
            self._cache[key] = [float(v) if v else None for v in self.raw.get(column, [""] * len(self))]
        return self._cache[key]  # type: ignore[return-value]

    def gpus(self) -> list[int | None]:
        """The distinct GPU indices in order of appearance (None for host-only rows)."""
        return list(dict.fromkeys(self.ints("gpu")))

    def select(self, **equals: object) -> LogTable:
        """The rows where each named column equals the value (compared as text; None matches empty)."""
        wanted = {k: "" if v is None else str(v) for k, v in equals.items()}
        keep = [i for i in range(len(self)) if all(self.raw.get(k, [""] * len(self))[i] == v for k, v in wanted.items())]
        return LogTable(self.path, {c: [vals[i] for i in keep] for c, vals in self.raw.items()}, self.kind)


def _to_int(text: str) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return int(float(text))  # "1.2e9" or "1024.0" from another writer


def read_log(path: str | os.PathLike[str]) -> LogTable:
    """Read one log, whatever its format (decided from its first line).

    Raises:
        LogFormatError: missing file, empty file, or a header that no reader knows, with what to do.
    """
    name = os.fspath(path)
    try:
        text = Path(name).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise LogFormatError(f"log {name} does not exist; check the path") from None
    except IsADirectoryError:
        raise LogFormatError(f"{name} is a folder; give a log file written by vramscope or nvidia-smi") from None
    except OSError as exc:
        raise LogFormatError(f"cannot read log {name}: {exc.strerror or exc}") from None
    first = text.lstrip()[:1]
    if not text.strip():
        raise LogFormatError(f"log {name} is empty; was the run started with --log?")
    if first == "{":
        return _read_jsonl(name, text)
    header = text.split("\n", 1)[0]
    if "memory.used" in header or "memory.total" in header:
        return _read_nvidia_smi(name, text)
    if "time" in header.split(",") and "gpu" in header.split(","):
        return _read_csv(name, text)
    raise LogFormatError(
        f"{name} is not a vramscope log or an nvidia-smi CSV (its header is {header[:80]!r}); "
        "use a file from 'vramscope run --log' or 'nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv'"
    )


def _complete_lines(text: str) -> str:
    # A crash can cut the last line mid-row: keep only what ends in a newline.
    if text.endswith("\n"):
        return text
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else ""


def _read_csv(name: str, text: str) -> LogTable:
    body = _complete_lines(text)
    reader = csv.reader(io.StringIO(body))
    header = next(reader)
    width = len(header)
    rows = [r for r in reader if len(r) == width]
    columns = list(zip(*rows)) if rows else [() for _ in header]
    return LogTable(name, {h: list(col) for h, col in zip(header, columns)})


def _read_jsonl(name: str, text: str) -> LogTable:
    raw: dict[str, list[str]] = {c: [] for c in COLUMNS}
    count = 0
    for line in _complete_lines(text).splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line in the middle of the file (two writers); skip it
        if not isinstance(row, dict):
            continue
        for key in row:
            if key not in raw:
                raw[key] = [""] * count
        for key, values in raw.items():
            value = row.get(key)
            values.append("" if value is None else str(value))
        count += 1
    if count == 0:
        raise LogFormatError(f"{name} holds no complete JSON row; is it a vramscope .jsonl log?")
    return LogTable(name, raw, kind="jsonl")


_SMI_NUMBER = re.compile(r"([0-9.]+)")


def _read_nvidia_smi(name: str, text: str) -> LogTable:
    """nvidia-smi --query-gpu=...,memory.used,memory.total --format=csv[,nounits] -> our columns."""
    reader = csv.reader(io.StringIO(_complete_lines(text)), skipinitialspace=True)
    header = [h.strip() for h in next(reader)]
    keys = [h.split(" [")[0] for h in header]

    def col(key: str) -> int | None:
        return keys.index(key) if key in keys else None

    i_time, i_used, i_total = col("timestamp"), col("memory.used"), col("memory.total")
    i_index, i_util = col("index"), col("utilization.gpu")
    if i_used is None:
        raise LogFormatError(f"{name}: nvidia-smi CSV without memory.used; log it with --query-gpu=timestamp,memory.used,...")
    out: dict[str, list[str]] = {c: [] for c in ("time", "elapsed_s", "gpu", "device_used_bytes",
                                                  "device_total_bytes", "utilization_pct")}
    start: float | None = None
    last_time = None
    position = 0
    for row in reader:
        if len(row) != len(header):
            continue
        stamp = row[i_time].strip() if i_time is not None else ""
        unix = _smi_time(stamp)
        if unix is not None and start is None:
            start = unix
        position = position + 1 if stamp == last_time else 0  # GPUs of one timestamp come in order
        last_time = stamp
        out["time"].append(datetime.fromtimestamp(unix, tz=timezone.utc).isoformat() if unix is not None else "")
        out["elapsed_s"].append(f"{unix - start:.3f}" if unix is not None and start is not None else "")
        out["gpu"].append(row[i_index].strip() if i_index is not None else str(position))
        out["device_used_bytes"].append(_smi_mib(row[i_used]))
        out["device_total_bytes"].append(_smi_mib(row[i_total]) if i_total is not None else "")
        out["utilization_pct"].append(_smi_number(row[i_util]) if i_util is not None else "")
    return LogTable(name, out, kind="nvidia-smi")


def _smi_number(cell: str) -> str:
    match = _SMI_NUMBER.search(cell)
    return match.group(1) if match else ""


def _smi_mib(cell: str) -> str:
    number = _smi_number(cell)
    return str(int(float(number) * MIB)) if number else ""


def _smi_time(stamp: str) -> float | None:
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
    for i, (s, v) in enumerate(zip(steps, values)):
        if s is None or v is None or (gpus is not None and gpus[i] != gpu):
            continue
        xs.append(s)
        ys.append(v)
    return xs, ys


def columns_of(rows: Sequence[dict[str, object]]) -> list[str]:
    """Column names in first-seen order over rows (for writing tables built in memory)."""
    return list(dict.fromkeys(k for r in rows for k in r))
