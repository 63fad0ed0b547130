"""A log with more columns than any real log is refused at once in one line; a UTF-8 BOM reads as no BOM.

Issue 24, item 9: a 26 MB header of 3M columns cost 2.75 GB and 60 s, and 4 MB of ``c,`` 777 MB, before
anything was refused. The first line is now counted before anything is built per column
(:data:`vramscope.logs.source.MAX_COLUMNS`). Each file is real, and read by the real CLI in a child
whose address space is capped (``resource.setrlimit``), so that a reader building per column fails the test.
Issue 24, item 15: a BOM (Excel, Windows editors) made vramscope's own header read as someone else's CSV.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from vramscope.logs.csv_sink import CsvSink
from vramscope.logs.reader import read_any_log, read_log
from vramscope.logs.schema import COLUMNS
from vramscope.logs.source import BOM, MAX_COLUMNS

SRC = str(Path(__file__).resolve().parents[1] / "src")
MEMORY_CAP = 1536 * 1024**2  # address space of the child: python, numpy and pyarrow fit; 2.75 GB did not


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def report_capped(path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": SRC}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vramscope", "report", str(path)], capture_output=True, text=True,
                          timeout=60, env=env, preexec_fn=_capped)
    return done, time.perf_counter() - started


def assert_refused_in_one_line(done: subprocess.CompletedProcess[str], seconds: float) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "more than 4096 columns" in lines[0], done.stderr[-500:]
    assert "Traceback" not in done.stderr
    assert seconds < 20, seconds


def test_the_cap_still_reads_a_normal_log_in_the_capped_child(tmp_path: Path) -> None:
    path = tmp_path / "ok.csv"
    _own_log(path)
    done, _ = report_capped(path)
    assert done.returncode == 0, done.stderr[-500:]


def test_a_header_of_three_million_columns_is_refused_quickly_in_little_memory(tmp_path: Path) -> None:
    path = tmp_path / "wide.csv"
    with path.open("w") as out:
        out.write("time,gpu," + ",".join(f"c{j}" for j in range(3_000_000)) + "\n")
        out.write("2026-11-29T10:00:00.000+00:00,0" + ",1" * 3_000_000 + "\n")
    assert path.stat().st_size > 26_000_000
    assert_refused_in_one_line(*report_capped(path))


def test_four_megabytes_of_one_cell_after_another_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "cells.csv"
    path.write_bytes(b"c," * 2_000_000)  # no line end at all
    assert_refused_in_one_line(*report_capped(path))
    path.write_bytes(b"time,gpu\n" + b"c," * 2_000_000 + b"\n")  # a second line that wide is a foreign row
    assert read_log(path).columns == ["time", "gpu"] and len(read_log(path)) == 0


def test_columns_up_to_the_cap_are_read(tmp_path: Path) -> None:
    path = tmp_path / "cap.csv"
    names = ["time", "gpu", *(f"x{j}" for j in range(MAX_COLUMNS - 3))]
    path.write_text(",".join(names) + "\n" + ",".join(["t0", "0", *("1" * (MAX_COLUMNS - 3))]) + "\n")
    assert len(read_log(path).columns) == MAX_COLUMNS - 1


def test_json_lines_are_not_counted_as_columns(tmp_path: Path) -> None:
    # A row's commas are not columns, and keys that come and go cost only their cells (issue 14's case:
    # a loop logging a field named after its step): neither is refused.
    path = tmp_path / "keys.jsonl"
    path.write_text(json.dumps({"time": "t", "gpu": 0, "allocated_bytes": 1, "shape": list(range(MAX_COLUMNS))}) + "\n"
                    + "".join(json.dumps({"time": "t", "gpu": 0, f"loss_{r}": 0.5}) + "\n"
                              for r in range(MAX_COLUMNS + 10)))
    table = read_log(path)
    assert len(table) == MAX_COLUMNS + 11 and table.ints("allocated_bytes")[0] == 1


def _own_log(path: Path) -> None:
    sink = CsvSink(path)
    sink.write_rows([{"time": f"2026-11-29T10:00:0{i}.000+00:00", "elapsed_s": i * 0.5, "gpu": 0,
                      "device_used_bytes": 3 * 10**9 + i, "device_total_bytes": 80 * 10**9,
                      "process_bytes": 2 * 10**9 + i, "host_rss_bytes": 5 * 10**9} for i in range(5)])
    sink.close()


def test_vramscope_csv_with_a_bom_is_read_as_vramscope_csv(tmp_path: Path) -> None:
    plain, with_bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    _own_log(plain)
    with_bom.write_bytes(BOM + plain.read_bytes())  # what saving it from Excel as "CSV UTF-8" does
    for reader in (read_log, read_any_log):
        table = reader(with_bom)
        assert table.kind == "vramscope" and table.columns == list(COLUMNS)
        assert table.ints("process_bytes") == [2 * 10**9 + i for i in range(5)]
        assert table.ints("host_rss_bytes") == [5 * 10**9] * 5
        assert table.strings("time") == read_log(plain).strings("time")
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-m", "vramscope", "report", str(with_bom), "--json"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "hand-written" not in done.stdout


def test_nvidia_smi_and_jsonl_with_a_bom(tmp_path: Path) -> None:
    smi = tmp_path / "smi.csv"
    smi.write_bytes(BOM + b"timestamp, name, memory.used [MiB], memory.total [MiB]\n"
                    b"2026/11/29 10:00:00.000, NVIDIA H200, 1024 MiB, 143771 MiB\n")
    assert read_log(smi).kind == "nvidia-smi" and read_log(smi).ints("device_used_bytes") == [1024 * 2**20]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_bytes(BOM + json.dumps({"time": "t", "gpu": 0, "allocated_bytes": 7}).encode() + b"\n")
    assert read_log(jsonl).kind == "jsonl" and read_log(jsonl).ints("allocated_bytes") == [7]
