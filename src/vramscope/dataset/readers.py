"""Reading a dataset's files into rows: pyarrow where it is installed (parquet, arrow, fast JSON lines and CSV),
the standard library otherwise (JSON lines, JSON, CSV still read).

The dataset side's one pyarrow import (the log reader, ``vramscope.logs``, has its own). Rows are
read column by column, and only the columns the trainer tokenizes are ever turned into Python objects.
"""

from __future__ import annotations

import csv
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from vramscope.dataset.files import SUFFIXES
from vramscope.dataset.types import DatasetError

csv.field_size_limit(1 << 30)  # a long example is one cell; the default 128 KiB limit would refuse it


def pyarrow_module() -> ModuleType | None:
    """pyarrow, or None where it is not installed (it comes with ``datasets``: ``pip install 'vramscope[trl]'``)."""
    try:
        return importlib.import_module("pyarrow")
    except ImportError:
        return None


class Rows:
    """A dataset's rows: column names, and a column's values for some rows (or all)."""

    def __init__(self, columns: Sequence[str], num_rows: int) -> None:
        self.columns = tuple(columns)
        self.num_rows = num_rows

    def values(self, column: str, rows: np.ndarray | None = None) -> list[Any]:
        raise NotImplementedError

    def first(self) -> dict[str, Any]:
        """The first row (to tell text from conversations and token ids)."""
        return {c: self.values(c, np.array([0]))[0] for c in self.columns}

    def char_lengths(self, column: str) -> np.ndarray:
        """Characters per row in ``column`` (a cheap stand-in for tokens, to find the long rows of a huge dataset)."""
        return np.fromiter((_chars(v) for v in self.values(column)), dtype=np.int64, count=self.num_rows)


class ListRows(Rows):
    """Rows read by the standard library: a list of dicts."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        names: dict[str, None] = {}
        for r in records[:1000]:
            names.update(dict.fromkeys(r))
        super().__init__(list(names), len(records))
        self._records = records

    def values(self, column: str, rows: np.ndarray | None = None) -> list[Any]:
        if rows is None:
            return [r.get(column) for r in self._records]
        return [self._records[i].get(column) for i in rows.tolist()]


class ArrowRows(Rows):
    """Rows in a pyarrow Table (memory-mapped for arrow files)."""

    def __init__(self, table: Any) -> None:
        super().__init__(table.column_names, table.num_rows)
        self._table = table

    def values(self, column: str, rows: np.ndarray | None = None) -> list[Any]:
        col = self._table.column(column)
        if rows is not None:
            col = col.take(rows)
        return list(col.to_pylist())

    def char_lengths(self, column: str) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = self._table.column(column).combine_chunks()
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            return np.asarray(pc.fill_null(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        if (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) and pa.types.is_struct(
                col.type.value_type) and col.type.value_type.get_field_index("content") >= 0:
            # messages: the characters of every message's content, summed per row
            flat = pc.list_flatten(col)
            parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
            content = flat.field("content")
            if pa.types.is_string(content.type) or pa.types.is_large_string(content.type):
                chars = pc.fill_null(pc.utf8_length(content), 0).to_numpy(zero_copy_only=False)
                return np.bincount(parents, weights=chars, minlength=len(col)).astype(np.int64)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):  # token ids: their count
            return np.asarray(pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False),
                              dtype=np.int64)
        return super().char_lengths(column)


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) if not isinstance(v, dict) else _chars(v.get("content")) for v in value)
    if isinstance(value, dict):
        return _chars(value.get("content"))
    return 0


def read_rows(files: Sequence[Path]) -> Rows:
    """The rows of ``files`` (one split), concatenated. Raises DatasetError with one line when a file cannot be read."""
    pa = pyarrow_module()
    parts: list[Rows] = []
    for path in files:
        fmt = SUFFIXES[path.suffix.lower()]
        try:
            parts.append(_read_one(path, fmt, pa))
        except DatasetError:
            raise
        except Exception as exc:  # every reader's own error (pyarrow's, json's, csv's) becomes one line
            raise DatasetError(f"{path}: cannot read it as {fmt} ({exc.__class__.__name__}: "
                               f"{str(exc).splitlines()[0][:120] if str(exc) else ''})") from None
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, ArrowRows) for p in parts):
        try:
            return ArrowRows(pa.concat_tables([p._table for p in parts if isinstance(p, ArrowRows)],  # type: ignore[union-attr]
                                              promote_options="default"))
        except Exception as exc:
            raise DatasetError(f"{files[0].parent}: its files do not share columns ({str(exc)[:120]})") from None
    records: list[dict[str, Any]] = []
    for p in parts:
        cols = p.columns
        values = [p.values(c) for c in cols]
        records += [dict(zip(cols, row, strict=True)) for row in zip(*values, strict=True)]
    return ListRows(records)


def _read_one(path: Path, fmt: str, pa: ModuleType | None) -> Rows:
    if fmt in ("parquet", "arrow") and pa is None:
        raise DatasetError(f"{path}: reading {fmt} needs pyarrow: pip install 'vramscope[trl]' (or pyarrow)")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return ArrowRows(pq.read_table(path))
    if fmt == "arrow":
        return ArrowRows(_read_arrow(path))
    if fmt == "jsonl":
        if pa is not None:
            try:
                import pyarrow.json as pj

                return ArrowRows(pj.read_json(path))
            except Exception:  # mixed types across rows (a content that is sometimes a list): read as Python
                pass
        return ListRows(_json_lines(path))
    if fmt == "json":
        return ListRows(_json_file(path))
    delimiter = "\t" if fmt == "tsv" else ","
    if pa is not None:
        import pyarrow.csv as pcsv

        return ArrowRows(pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter,
                                                                             newlines_in_values=True)))
    with path.open(newline="", encoding="utf-8") as f:
        return ListRows([dict(r) for r in csv.DictReader(f, delimiter=delimiter)])


def _read_arrow(path: Path) -> Any:
    """An arrow file as ``datasets`` writes it (an IPC stream), or the IPC file format; memory-mapped."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_file(source).read_all()


def _json_lines(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    value = json.loads(line)
                except ValueError as exc:
                    raise DatasetError(f"{path}:{number}: not JSON ({exc})") from None
                if not isinstance(value, dict):
                    raise DatasetError(f"{path}:{number}: each line must be a JSON object, got {type(value).__name__}")
                records.append(value)
    return records


def _json_file(path: Path) -> list[dict[str, Any]]:
    """A JSON file: a list of objects, an object of columns (``{"text": [...]}``), an object holding the rows
    under one key (``{"data": [...]}``), or JSON lines under a .json name."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError:
        return _json_lines(path)  # datasets' json loader reads JSON lines under a .json name too
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        rows = [v for v in lists.values() if v and isinstance(v[0], dict)]
        if len(rows) == 1:
            data = rows[0]
        elif lists and len(lists) == len(data) and len({len(v) for v in lists.values()}) == 1:
            n = len(next(iter(lists.values())))
            data = [{k: v[i] for k, v in lists.items()} for i in range(n)]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DatasetError(f"{path}: a JSON dataset must be a list of objects")
    return data
