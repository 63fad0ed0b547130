"""The log reader must read exactly what the csv module reads.

The report's speed rests on pyarrow's CSV reader and the small paths beside it
(``vramscope.logs.csv_reader``); these tests
hold the public reader against ``csv.reader`` on logs written by the real CSV sink, on hostile layouts
(quotes, CRLF, ragged and torn lines) and on random tables (hypothesis), so that speed never costs a
wrong column.
"""

from __future__ import annotations

import csv
import io
import string
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from test_report_fixtures import Run, write_nvidia_smi_log, write_training_log
from vramscope.logs.csv_reader import read_csv
from vramscope.logs.reader import read_log
from vramscope.logs.source import LogSource
from vramscope.logs.table import LogTable


def csv_module_columns(text: str) -> dict[str, list[str]]:
    """What the csv module makes of the complete lines, rows of the header's width only."""
    body = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(io.StringIO(body, newline="")))
    header, rest = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    return {h: [r[j] for r in rest] for j, h in enumerate(header)}


def test_fast_path_reads_the_sink_output_like_csv_reader(tmp_path: Path) -> None:
    path = write_training_log(tmp_path / "m.csv", Run(steps=60, gpus=2, eval_every=20, eval_steps=5))
    text = path.read_bytes().decode()
    assert "\r\n" in text  # the csv module's default line end: the fast path must handle it
    assert read_log(path).raw == csv_module_columns(text)


def test_lf_line_ends_read_the_same(tmp_path: Path) -> None:
    crlf = write_training_log(tmp_path / "m.csv", Run(steps=30)).read_bytes().decode()
    lf = tmp_path / "lf.csv"
    lf.write_text(crlf.replace("\r\n", "\n"))
    assert read_log(lf).raw == read_log(tmp_path / "m.csv").raw


def test_quoted_cells_go_through_the_csv_module(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "gpu", "reserved_bytes", "phase"])
        writer.writerow(["2026-01-01T00:00:00+00:00", "0", "100", "eval, long"])
        writer.writerow(["2026-01-01T00:00:01+00:00", "0", "200", 'say "hi"'])
    table = read_log(path)
    assert table.strings("phase") == ["eval, long", 'say "hi"']
    assert table.ints("reserved_bytes") == [100, 200]


def test_a_ragged_row_is_dropped_and_the_rest_stay_aligned(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_text("time,gpu,reserved_bytes\nt0,0,10\nt1,0,20,999\nt2,0,30\nt3,0\nt4,0,50\n")
    table = read_log(path)
    assert table.strings("time") == ["t0", "t2", "t4"]
    assert table.ints("reserved_bytes") == [10, 30, 50]


def test_a_torn_last_line_is_dropped_not_refused(tmp_path: Path) -> None:
    full = write_training_log(tmp_path / "m.csv", Run(steps=20)).read_bytes()
    torn = tmp_path / "torn.csv"
    torn.write_bytes(full[:-25])  # cut inside the last row
    table = read_log(torn)
    assert len(table) == 19
    assert table.ints("step") == list(range(19))


def test_header_only_has_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("time,elapsed_s,step,gpu,reserved_bytes\r\n")
    table = read_log(path)
    assert len(table) == 0
    assert table.columns == ["time", "elapsed_s", "step", "gpu", "reserved_bytes"]


def test_typed_columns_turn_gaps_and_damage_into_none() -> None:
    table = LogTable("x", {"a": ["1", "", "2.5e3", "junk", "-4"], "f": ["0.5", "", "x", "1e3", "2"]})
    assert table.ints("a") == [1, None, 2500, None, -4]
    assert table.floats("f") == [0.5, None, None, 1000.0, 2.0]
    assert table.ints("missing") == [None] * 5
    assert table.strings("a") == ["1", None, "2.5e3", "junk", "-4"]


def test_select_keeps_matching_rows_in_order() -> None:
    table = LogTable("x", {"gpu": ["0", "1", "0", "1", ""], "v": ["a", "b", "c", "d", "e"]})
    assert table.select(gpu=1).raw == {"gpu": ["1", "1"], "v": ["b", "d"]}
    assert table.select(gpu=None).raw == {"gpu": [""], "v": ["e"]}
    assert table.select(gpu=0, v="c").raw == {"gpu": ["0"], "v": ["c"]}
    assert table.select(gpu=7).raw == {"gpu": [], "v": []}


def test_nvidia_smi_csv_with_a_torn_last_line(tmp_path: Path) -> None:
    table = read_log(write_nvidia_smi_log(tmp_path / "smi.csv", rows=30, gpus=2, truncate_last=True))
    assert table.kind == "nvidia-smi"
    assert len(table) == 59
    assert table.ints("gpu")[:4] == [0, 1, 0, 1]
    # 2026/11/29 10:00:01.037 is 1.037 s after the first tick at 10:00:00.000.
    assert table.floats("elapsed_s")[2] == 1.037


CELL = st.text(alphabet=string.ascii_letters + string.digits + ".:-+ ", max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(min_value=1, max_value=6),
    data=st.data(),
    crlf=st.booleans(),
    torn=st.booleans(),
)
def test_fast_path_matches_csv_reader_on_random_tables(width: int, data: st.DataObject, crlf: bool,
                                                        torn: bool) -> None:
    header = [f"c{j}" for j in range(width)]
    rows = data.draw(st.lists(st.lists(CELL, min_size=width, max_size=width), max_size=12))
    newline = "\r\n" if crlf else "\n"
    text = newline.join(",".join(r) for r in [header, *rows]) + newline
    if torn and rows:
        text += "partial,"
    expected = csv_module_columns(text.replace("\r\n", "\n"))
    with tempfile.TemporaryDirectory(prefix="vramscope-random-") as folder:
        path = Path(folder) / "random.csv"
        path.write_bytes(text.encode())
        with LogSource(str(path), "a CSV") as source:
            assert read_csv(source).raw == expected
