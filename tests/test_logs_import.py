"""Logs people already have: the hand-written loop log, nvidia-smi of several GPUs, header-less nvidia-smi, any CSV.

Each test writes a real file as that tool writes it and reads it with the real reader or the real
``vramscope report`` in a subprocess (for its exit code and its one-line errors).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from vramscope.logs.errors import LogFormatError
from vramscope.logs.mapping import ColumnsError, parse_columns
from vramscope.logs.reader import read_any_log, read_log
from vramscope.logs.table import LogTable

VRAMSCOPE = [sys.executable, "-m", "vramscope"]
GIB = 1024**3
MIB = 1024**2


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VRAMSCOPE, "report", *args], capture_output=True, text=True, timeout=120)


def report_json(*args: str) -> dict[str, Any]:
    done = report(*args, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def refused(*args: str) -> str:
    """The one line ``vramscope report`` prints when it refuses (exit 2, no traceback)."""
    done = report(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# -- the hand-written log of the usual guides ------------------------------------------------------------


def write_loop_log(path: Path, steps: int = 200, header: str | None = None, leak_gib_per_step: float = 0.004) -> Path:
    """What ``log_memory_usage()`` in a training loop writes.

    That is f"{datetime.now()},{step},{alloc_gb:.2f},{reserved_gb:.2f}" per step, GiB as /1024**3 gives.
    """
    start = datetime(2026, 12, 1, 8, 0, 0, 123456)
    with open(path, "w", encoding="utf-8") as handle:
        if header is not None:
            handle.write(header + "\n")
        for step in range(steps):
            alloc_gb = 3.2 + step * leak_gib_per_step
            reserved_gb = alloc_gb + 0.8
            now = start + timedelta(seconds=0.7 * step, microseconds=step * 37)
            handle.write(f"{now},{step},{alloc_gb:.2f},{reserved_gb:.2f}\n")
    return path


@pytest.mark.parametrize("header", [None, "time,step,allocated_gb,reserved_gb", "timestamp,step,allocated,reserved"])
def test_the_hand_written_loop_log_is_read_as_it_is(tmp_path: Path, header: str | None) -> None:
    path = write_loop_log(tmp_path / "memory.log", header=header)
    done = report(str(path), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["log"]["format"] == "hand-written"
    assert data["log"]["columns"] == "time=0,step=1,allocated=2:GiB,reserved=3:GiB"
    assert data["log"]["rows"] == 200
    assert data["log"]["steps"]["first"] == 0 and data["log"]["steps"]["last"] == 199
    peaks = data["devices"]["0"]["peaks"]
    assert peaks["allocated_bytes"]["bytes"] == round(float(f"{3.2 + 199 * 0.004:.2f}") * GIB)
    assert peaks["reserved_bytes"]["step"] == 199
    assert data["log"]["duration_s"] == pytest.approx(0.7 * 199, abs=0.01)
    assert data["leak"]["detected"] is True  # 4 MiB a step, as written
    # The guess is said, with the way to read it otherwise.
    assert "--columns time=0,step=1,allocated=2:GiB,reserved=3:GiB" in done.stderr


def test_a_header_with_units_and_another_order_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    lines = ["step,reserved_mb,allocated_mb,wall_time"]
    lines += [f"{s},{2048 + s},{1024 + s},2026-12-01T08:00:{s:02d}.5" for s in range(40)]
    path.write_text("\n".join(lines) + "\n")
    table = read_any_log(path)
    assert table.kind == "hand-written"
    assert table.ints("step")[:2] == [0, 1]
    assert table.ints("allocated_bytes")[:2] == [1024 * MIB, 1025 * MIB]
    assert table.ints("reserved_bytes")[39] == (2048 + 39) * MIB
    assert table.raw["time"][1] == "2026-12-01T08:00:01.500+00:00"


def test_columns_maps_any_csv_by_index_or_name_with_units(tmp_path: Path) -> None:
    path = tmp_path / "custom.tsv"
    lines = ["iteration\tmem_alloc\tmem_peak\tunix_ms"]
    lines += [f"{s}\t{1.5 + s / 100:.2f}\t{1500 + s} MiB\t{1_764_576_000_000 + 1000 * s}" for s in range(30)]
    path.write_text("\n".join(lines) + "\n")
    by_name = read_any_log(path, parse_columns("step=iteration,allocated=mem_alloc:GiB,peak=mem_peak,time=unix_ms:ms"))
    by_index = read_any_log(path, parse_columns("step=0,allocated=1:GiB,peak=2:MiB,time=3:ms"))
    for table in (by_name, by_index):
        assert table.kind == "mapped" and len(table) == 30  # the header is found either way
        assert table.ints("allocated_bytes")[1] == round(1.51 * GIB)
        assert table.ints("peak_allocated_bytes")[2] == 1502 * MIB  # the cell's own "MiB" counts
        assert table.floats("elapsed_s")[29] == pytest.approx(29.0)
        assert table.raw["time"][0] == "2025-12-01T08:00:00.000+00:00"
        assert table.ints("gpu")[0] == 0  # torch's figures: the loop's one device


def test_report_columns_flag_reads_a_csv_it_would_refuse(tmp_path: Path) -> None:
    path = tmp_path / "odd.csv"
    path.write_text("a,b,c\n" + "".join(f"{s},{s * 10},{7.5 + s / 10:.1f}\n" for s in range(50)))
    assert "--columns" in refused(str(path))
    data = report_json(str(path), "--columns", "step=a,used=c:GB,total=b:GiB")
    assert data["log"]["format"] == "mapped"
    assert data["log"]["columns"] == "step=a,used=c:GB,total=b:GiB"
    assert data["devices"]["0"]["peaks"]["device_used_bytes"]["bytes"] == round(12.4 * 1e9)


@pytest.mark.parametrize(
    ("columns", "says"),
    [("alocated=2", "did you mean allocated"), ("allocated=2:gibs", "unknown unit"), ("step=1", "memory column"),
     ("allocated", "FIELD=COLUMN"), ("allocated=1,allocated=2", "twice")],
)
def test_a_bad_mapping_is_one_line(tmp_path: Path, columns: str, says: str) -> None:
    path = write_loop_log(tmp_path / "memory.log", steps=5)
    with pytest.raises(ColumnsError, match=says):
        parse_columns(columns)
    line = refused(str(path), "--columns", columns)
    assert says in line and "--columns" in line


def test_a_mapping_that_does_not_fit_the_file_is_one_line(tmp_path: Path) -> None:
    path = write_loop_log(tmp_path / "memory.log", steps=5)
    assert "have 4 columns (0 to 3)" in refused(str(path), "--columns", "allocated=9:GiB")
    assert "no column 'alloc'" in refused(str(path), "--columns", "allocated=alloc:GiB")
    # A fraction read as bytes would be a silent nonsense: the unit is asked for.
    assert "allocated=2:GiB" in refused(str(path), "--columns", "time=0,allocated=2")
    assert "no row has a number" in refused(str(path), "--columns", "allocated=0:GiB")


def test_what_no_reader_knows_names_the_columns_way_out(tmp_path: Path) -> None:
    path = tmp_path / "notes.csv"
    path.write_text("name,colour\nfoo,blue\n")
    line = refused(str(path))
    assert "is not a vramscope log" in line and "--columns time=0,step=1,allocated=2:GiB" in line
    assert path.read_text() == "name,colour\nfoo,blue\n"  # nothing written over it


# -- nvidia-smi of several GPUs, stamps a few ms apart ---------------------------------------------------


def write_smi(path: Path, samples: int, gpus: int = 2, header: bool = True, units: bool = True,
              interval_ms: int = 1000, seed: int = 0) -> Path:
    """``nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv -l 1`` on a multi-GPU host.

    Each GPU's line is stamped when it is read: 3-8 ms after the one before, never byte-identical.
    GPU 1 grows by 40 MiB a sample; the others stay flat.
    """
    rng = random.Random(seed)
    start = datetime(2026, 12, 1, 8, 0, 0)
    lines = ["timestamp, name, memory.used [MiB], memory.total [MiB]"] if header else []
    unit = " MiB" if units else ""
    for i in range(samples):
        stamp = start + timedelta(milliseconds=interval_ms * i + rng.randrange(0, 5))
        for g in range(gpus):
            if g:
                stamp += timedelta(milliseconds=rng.randrange(3, 9))
            used = 6000 + 40 * i if g == 1 else 9000 + 100 * g + rng.randrange(0, 3)
            lines.append(f"{stamp:%Y/%m/%d %H:%M:%S}.{stamp.microsecond // 1000:03d}, NVIDIA H200, {used}{unit}, "
                         f"143771{unit}")
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_two_gpus_with_gpu1_growing(table: LogTable, samples: int) -> None:
    assert table.kind == "nvidia-smi"
    assert table.ints("gpu") == [0, 1] * samples
    used = table.ints("device_used_bytes")
    assert used[1::2] == [(6000 + 40 * i) * MIB for i in range(samples)]  # GPU 1 alone: a steady growth
    assert all(9000 * MIB <= u <= 9002 * MIB for u in used[0::2])  # type: ignore[operator]


def test_two_gpus_with_stamps_ms_apart_are_two_gpus_located_or_split_by_the_csv_module(tmp_path: Path) -> None:
    path = write_smi(tmp_path / "smi.csv", samples=120)
    located = read_log(path)  # cells found in the bytes
    quoted = tmp_path / "quoted.csv"  # quotes: the csv module splits it, and the columns are read the same
    quoted.write_text(path.read_text().replace("NVIDIA H200", '"NVIDIA H200"'))
    split = read_log(quoted)
    for table in (located, split):
        assert_two_gpus_with_gpu1_growing(table, 120)
    assert dict(located.raw) == dict(split.raw)


def test_a_growing_gpu_beside_a_flat_one_is_reported_as_a_growth(tmp_path: Path) -> None:
    data = report_json(str(write_smi(tmp_path / "smi.csv", samples=150)))
    assert data["log"]["devices"] == ["0", "1"]
    assert data["leak"]["devices"]["1"]["detected"] is True
    assert data["leak"]["devices"]["1"]["slope_bytes_per_second"] == pytest.approx(40 * MIB, rel=0.02)
    assert data["leak"]["devices"]["0"]["detected"] is False
    assert data["devices"]["1"]["peaks"]["device_used_bytes"]["bytes"] == (6000 + 40 * 149) * MIB


@pytest.mark.parametrize(("gpus", "interval_ms"), [(8, 1000), (4, 100), (2, 200)])
def test_gpu_counts_and_intervals(tmp_path: Path, gpus: int, interval_ms: int) -> None:
    table = read_log(write_smi(tmp_path / "smi.csv", samples=60, gpus=gpus, interval_ms=interval_ms, seed=gpus))
    assert table.ints("gpu") == list(range(gpus)) * 60


def test_one_gpu_whose_interval_jitters_or_stalls_stays_one_gpu(tmp_path: Path) -> None:
    rng = random.Random(5)
    start = datetime(2026, 12, 1, 8, 0, 0)
    lines = ["timestamp, name, memory.used [MiB], memory.total [MiB]"]
    at = 0
    for i in range(300):
        at += 5000 if i % 97 == 96 else 100 + rng.randrange(-4, 5)  # -lms 100, and a stall now and then
        stamp = start + timedelta(milliseconds=at)
        lines.append(f"{stamp:%Y/%m/%d %H:%M:%S}.{stamp.microsecond // 1000:03d}, NVIDIA H200, {7000 + i} MiB, "
                     "143771 MiB")
    path = tmp_path / "smi.csv"
    path.write_text("\n".join(lines) + "\n")
    assert set(read_log(path).ints("gpu")) == {0}


@pytest.mark.parametrize("units", [True, False], ids=["noheader", "noheader-nounits"])
def test_header_less_nvidia_smi_is_recognised_from_its_cells(tmp_path: Path, units: bool) -> None:
    path = write_smi(tmp_path / "smi.csv", samples=80, header=False, units=units)
    table = read_any_log(path)
    assert_two_gpus_with_gpu1_growing(table, 80)
    assert table.ints("device_total_bytes")[0] == 143771 * MIB
    data = report_json(str(path))
    assert data["log"]["format"] == "nvidia-smi" and data["log"]["devices"] == ["0", "1"]


def test_header_less_nvidia_smi_in_another_order_is_read_through_columns(tmp_path: Path) -> None:
    path = tmp_path / "smi.csv"
    path.write_text("".join(f"{g}, 2026/12/01 08:00:{i:02d}.00{g}, {5000 + i * g}, 143771\n"
                            for i in range(30) for g in range(2)))
    line = refused(str(path))
    assert "--columns" in line
    data = report_json(str(path), "--columns", "gpu=0,time=1,used=2:MiB,total=3:MiB")
    assert data["log"]["devices"] == ["0", "1"]
    assert data["devices"]["1"]["peaks"]["device_used_bytes"]["bytes"] == (5000 + 29) * MIB


def test_read_log_itself_still_refuses_what_it_does_not_read(tmp_path: Path) -> None:
    """The library's own reader keeps its contract; read_any_log is the one that looks further."""
    path = write_loop_log(tmp_path / "memory.log", steps=3)
    with pytest.raises(LogFormatError, match="not a vramscope log"):
        read_log(path)


def test_report_help_documents_the_mapping() -> None:
    done = subprocess.run([*VRAMSCOPE, "report", "--help"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0
    assert "--columns FIELD=COL[:UNIT],..." in done.stdout
    assert "time=0,step=1,allocated=2:GiB,reserved=3:GiB" in done.stdout
    assert "units B, KB, KiB, MB, MiB, GB, GiB" in done.stdout


def test_a_csv_with_time_and_gpu_but_no_vramscope_column_is_someone_elses(tmp_path: Path) -> None:
    """``time`` and ``gpu`` in a header make it look like vramscope's log; without its memory columns it is not."""
    path = tmp_path / "mine.csv"
    path.write_text("time,step,gpu,alloc_gb\n" + "".join(f"2026-12-01 08:00:{s:02d},{s},1,{1.5 + s / 10:.1f}\n"
                                                       for s in range(20)))
    table = read_any_log(path)
    assert table.kind == "hand-written" and table.ints("gpu")[0] == 1
    assert table.ints("allocated_bytes")[19] == round(3.4 * GIB)
    path.write_text("time,gpu,foo\n1,0,3\n")
    assert "--columns" in refused(str(path))
