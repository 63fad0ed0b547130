"""The phase and the GPU's UUID of a vramscope CSV, read as pyarrow's dictionary type (``logs.label_columns``),
answer as the same cells read as text do: texts, labels (numbered in order of first appearance across
blocks), numbers by the per-cell rules, and the rows a selection takes.

The file spans many pyarrow blocks, and its label cells change between them: a phase first seen blocks in,
blocks with no phase at all, phases that read as numbers ("7", "2.5", "1e3").
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from vramscope.logs.arrow_columns import ArrowColumn
from vramscope.logs.label_columns import LabelColumn
from vramscope.logs.reader import read_log

ROWS = 60_000  # about 3 MB: a few blocks of a MiB


def _phase(i: int) -> str:
    if 10_000 <= i < 25_000:
        return ""  # whole blocks without a phase
    if i >= 50_000:
        return ("7", "2.5", "1e3", "eval")[i % 4]  # new names late, some of them numbers
    return "eval" if i // 3000 % 4 == 3 else "train"


def _write(path: Path) -> None:
    lines = ["time,elapsed_s,step,gpu,allocated_bytes,phase,gpu_uuid"]
    for i in range(ROWS):
        gpu = i % 2
        lines.append(f"2026-11-29T10:00:{i // 10 % 60:02d}.{i % 10}00+00:00,{i * 0.1:.3f},{i},{gpu},"
                     f"{10**9 + i},{_phase(i)},GPU-{gpu}")
    path.write_text("\n".join(lines) + "\n")


def _as_text(path: Path, column: str) -> ArrowColumn:
    with open(path, newline="") as handle:
        return ArrowColumn.of_texts([row[column] for row in csv.DictReader(handle)])


def _same(read: object, text: ArrowColumn) -> None:
    assert isinstance(read, LabelColumn | ArrowColumn)
    assert read.texts() == text.texts()
    a, b = read.labels(), text.labels()
    assert a.names == b.names and np.array_equal(a.codes, b.codes)
    for kind in ("ints", "floats"):
        x, y = getattr(read, kind)(), getattr(text, kind)()
        assert x.values.dtype == y.values.dtype
        assert np.array_equal(x.values, y.values) and np.array_equal(x.known, y.known), kind
    assert read.filled() == text.filled()


def test_label_columns_read_as_their_text_would(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    _write(path)
    assert path.stat().st_size > 3 << 20
    table = read_log(path)
    for column in ("phase", "gpu_uuid"):
        data = table.column_data(column)
        assert isinstance(data, LabelColumn), column  # the dictionary type was used
        text = _as_text(path, column)
        _same(data, text)
        assert table.labels(column).names == text.labels().names
        picks = [np.arange(ROWS), np.array([ROWS - 1, 5, 12_000, 5, 51_001]), np.arange(10_000, 25_000),
                 np.arange(1, ROWS, 2), np.zeros(0, dtype=np.int64)]
        for rows in picks:
            _same(data.take(rows), text.take(rows))


def test_a_selection_renumbers_the_labels_of_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    _write(path)
    odd = read_log(path).select(gpu=1)
    phases = [_phase(i) or None for i in range(1, ROWS, 2)]
    labels = odd.labels("phase")
    assert labels.names == list(dict.fromkeys(p for p in phases if p is not None))
    assert labels.tolist() == phases
    assert odd.labels("gpu_uuid").names == ["GPU-1"]
