"""Logs of many pyarrow blocks (over a MiB): the columns made block by block are the per-cell rules, cell for cell.

The reader streams a file a MiB at a time and writes each block's numbers straight into numpy, keeping a
column whose every cell is the same as one value and an all-known mask as one True
(:class:`vramscope.logs.arrow_columns.NumberBuilder`); nvidia-smi's CSV over a MiB is streamed too, its
plain cells cast for the whole column. These files cross those paths: a column that changes value, is
empty, starts late or stops early several blocks in, odd cells far from the head, a quote after the first
block. Each is held against what the csv module and the per-cell rules make of it (``test_log_cells``).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from test_log_cells import SMI_HEADERS, same_smi, same_table, smi_text
from vramscope.analysis.columns import ANALYSED_COLUMNS
from vramscope.logs.reader import read_log
from vramscope.logs.smi_reader import STREAM_FROM
from vramscope.logs.source import LogSource

ROWS = 40_000  # about 3.5 MB: a few blocks


def _vramscope_csv(path: Path, odd: str | None) -> None:
    rng = random.Random(3)
    header = ["time", "elapsed_s", "step", "gpu", "allocated_bytes", "device_total_bytes", "tokens", "num_ooms",
              "phase", "reserved_bytes", "gpu_uuid"]
    lines = [",".join(header)]
    for i in range(ROWS):
        late = i > ROWS // 2
        cells = {
            "time": f"2026-11-29T10:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10}00+00:00",
            "elapsed_s": f"{i * 0.1:.3f}",
            "step": str(i) if i > ROWS // 3 else "",  # starts blocks in
            "gpu": "1" if i > ROWS * 3 // 4 else "0",  # one value for blocks, then another
            "allocated_bytes": str(10**9 + rng.randrange(10**6)),
            "device_total_bytes": "150754820096",  # the same everywhere
            "tokens": str(2048 + i % 7) if i < ROWS * 2 // 3 else "",  # stops blocks before the end
            "num_ooms": "",  # never logged
            "phase": "eval" if i // 2000 % 5 == 4 else "train",
            "reserved_bytes": "7" if not late else ("-9223372036854775808" if i % 997 == 0 else "7"),
            "gpu_uuid": f"GPU-{i % 2}",
        }
        if odd == "nan" and i % 1009 == 500:
            cells["elapsed_s"] = "nan"
        if odd == "exponent" and i == ROWS - 10:
            cells["allocated_bytes"] = "1.2e9"  # no plain int: the whole file by the per-cell rules
        if odd == "quote" and i == ROWS - 10:
            cells["phase"] = '"train"'
        lines.append(",".join(cells[h] for h in header))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("odd", [None, "nan", "exponent", "quote"])
def test_a_log_of_many_blocks_is_read_cell_for_cell(tmp_path: Path, odd: str | None) -> None:
    path = tmp_path / "mem.csv"
    _vramscope_csv(path, odd)
    assert path.stat().st_size > 3 << 20
    table = same_table(path)
    gpu, total, ooms = table.int_column("gpu"), table.int_column("device_total_bytes"), table.int_column("num_ooms")
    assert gpu.values[0] == 0 and gpu.values[-1] == 1 and gpu.known.all()
    assert total.known.all() and set(total.values.tolist()) == {150754820096}
    assert not ooms.known.any() and not table.has("num_ooms")
    assert not table.int_column("step").known[0] and table.int_column("step").known[-1]
    with pytest.raises(ValueError):  # the table's arrays are its own: read-only
        table.int_column("allocated_bytes").values[0] = 1


def test_only_the_columns_asked_for_are_read_and_they_are_the_same(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    _vramscope_csv(path, None)
    whole, some = read_log(path), read_log(path, only=ANALYSED_COLUMNS)
    assert some.columns == [c for c in whole.columns if c in ANALYSED_COLUMNS]
    assert "gpu_uuid" not in some.columns and len(some) == len(whole)
    for column in some.columns:
        for kind in ("int_column", "float_column"):
            a, b = getattr(whole, kind)(column), getattr(some, kind)(column)
            assert np.array_equal(a.values, b.values) and np.array_equal(a.known, b.known), column
        a_labels, b_labels = whole.labels(column), some.labels(column)
        assert a_labels.names == b_labels.names and np.array_equal(a_labels.codes, b_labels.codes), column
        assert whole.has(column) == some.has(column), column
    rows = np.array([5, 0, ROWS - 1, 17_000, 5], dtype=np.int64)
    assert some.column_data("time").take(rows).texts() == [whole.strings("time")[r] for r in rows]  # type: ignore[union-attr]


@pytest.mark.parametrize("header", SMI_HEADERS, ids=["default", "index-util", "minimal"])
@pytest.mark.parametrize("odd", [None, "odd", "quoted"])
def test_nvidia_smi_logs_over_a_mib_are_the_per_line_rules(tmp_path: Path, header: list[str], odd: str | None) -> None:
    rng = random.Random(len(header))
    bad = None
    if odd == "odd":  # one line of other shapes deep in the file: the rules, cell by cell, for its columns
        cells = {"timestamp": "2026/11/29 10:00:00", "index": "0", "name": "X", "memory.used [MiB]": "[N/A]",
                 "memory.total [MiB]": "-5.5 MiB", "utilization.gpu [%]": "[Not Supported]"}
        bad = ", ".join(cells[h] for h in header)
    text = smi_text(header, rows=20_000, gpus=2, units=True, odd=bad, rng=rng)
    if odd == "quoted":  # a quote after the first block: the whole file read again by the csv module
        lines = text.split("\n")
        lines[-100] = lines[-100].replace("NVIDIA H200", '"NVIDIA H200"')
        text = "\n".join(lines)
    path = tmp_path / "smi.csv"
    path.write_text(text)
    assert path.stat().st_size > STREAM_FROM
    same_smi(path)


@pytest.mark.parametrize("first", [3, 4, 100])
def test_a_0x_is_seen_within_a_block_and_cut_between_two(tmp_path: Path, first: int) -> None:
    # The stream looks for "0x" only in a block with an x in it (a memchr: "0x" itself is searched for at a tenth
    # of the speed); a "0" ending one block (3 bytes: "1,0") and an "x" starting the next is a 0x all the same.
    path = tmp_path / "hex.csv"
    path.write_bytes(b"time,gpu,step\n1,0x10,3\n")
    with LogSource(str(path), "a log") as source:
        stream = source.lines(source.header_end + 1)
        stream.read(first)
        stream.read(-1)
        assert stream.hex_prefixed


def test_an_x_without_a_0_before_it_leaves_the_fast_path(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_bytes(b"time,gpu,phase\n1,0,x\n2,0,X0\n")
    with LogSource(str(path), "a log") as source:
        stream = source.lines(source.header_end + 1)
        for size in (1, 3, 2, 100):
            stream.read(size)
        assert not stream.hex_prefixed and not stream.quoted


def test_rows_beyond_what_the_first_block_foretold(tmp_path: Path) -> None:
    # The columns are sized for the rows the first MiB foretells; lines that get shorter after it bring many more.
    # A column's mask of known cells (made in the first block, where some cells are empty) must grow with the
    # rows too: it was cut short, the step column's mask 81k long under 406k values (found 2026-12-02).
    path = tmp_path / "mem.csv"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("time,gpu,step,tokens\n")
        for i in range(6000):  # long lines: about 5k rows to the MiB
            handle.write(f"{'' if i % 5 == 0 else 't' * 200},0,{'' if i % 3 == 0 else i},{'' if i % 7 else 9}\n")
        for i in range(400_000):  # then short ones: every cell of a row known but the tokens
            handle.write(f"t,0,{i},\n")
    table = same_table(path)
    assert len(table) == 406_000
    step, tokens = table.int_column("step"), table.int_column("tokens")
    assert len(step.known) == len(step.values) == len(tokens.known) == len(tokens.values) == 406_000
    assert step.known[6000:].all() and int(step.known[:6000].sum()) == 4000
    assert not tokens.known[6000:].any()
