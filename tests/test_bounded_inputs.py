"""Every input is bounded in the time and memory it can cost (issue 14, items 7, 8 and 12).

Real files, a real FIFO, real character devices and the real CLI in child processes: a log whose rows
each bring a new key, a large CSV read through the byte path, 400-digit cells, 4000-digit flags,
digits of other scripts, a batch of a trillion, and an analysis written on a full disk.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pytest

from vramscope.logs.csv_reader import BLOCK_BYTES as CHUNK_BYTES
from vramscope.logs.errors import LogFormatError
from vramscope.logs.reader import read_log
from vramscope.logs.schema import COLUMNS, FLOAT_COLUMNS
from vramscope.logs.table import LogTable
from vramscope.output.atomic import write_atomically

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")


def vramscope(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([PYTHON, "-m", "vramscope", *args], capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line_usage_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error: "), result.stderr
    assert "Traceback" not in result.stderr and "--debug" not in result.stderr
    assert len(lines[0]) < 300  # a 4000-digit argument is not echoed whole
    return lines[0]


def csv_row(i: int, **cells: str) -> str:
    values = {c: "" for c in COLUMNS}
    values.update(time=f"2026-11-29T10:{i // 60 % 60:02d}:{i % 60:02d}.000+00:00", elapsed_s=f"{i * 0.5:.3f}",
                  step=str(i), gpu="0", allocated_bytes=str(10**9 + i * 10**6),
                  reserved_bytes=str(2 * 10**9 + i * 10**6),
                  device_used_bytes=str(3 * 10**9 + i * 10**6), device_total_bytes="80000000000", phase="train",
                  tokens=str(512 + i % 7))
    values.update(cells)
    return ",".join(values[c] for c in COLUMNS)


def write_csv(path: Path, rows: int, odd: dict[int, dict[str, str]] | None = None) -> Path:
    odd = odd or {}
    path.write_text(",".join(COLUMNS) + "\n" + "".join(csv_row(i, **odd.get(i, {})) + "\n" for i in range(rows)))
    return path


# -- item 7: memory follows the file, not rows x keys ---------------------------------------------------


def write_new_key_per_row(path: Path, rows: int) -> Path:
    """A loop that logs a field named after its step: every row brings a key no other row has."""
    with path.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"time": f"2026-11-29T10:00:{i % 60:02d}.000+00:00", "elapsed_s": i * 0.5,
                                  "step": i, "gpu": 0, "allocated_bytes": 10**9 + i, f"loss_{i}": 0.5}) + "\n")
    return path


def test_a_jsonl_log_with_a_new_key_per_row_costs_memory_of_its_cells(tmp_path: Path) -> None:
    # Before: every column padded for every row, 4000 rows x 4000 keys = 16M cells (~130 MB, seconds).
    path = write_new_key_per_row(tmp_path / "keys.jsonl", 4000)
    size = path.stat().st_size
    # Once untraced first: the reader's lazy imports (their modules' memory) are not the log's cells, and a test
    # that runs first in its worker would count them.
    read_log(write_new_key_per_row(tmp_path / "warm.jsonl", 2))
    tracemalloc.start()
    started = time.perf_counter()
    try:
        table = read_log(path)
        assert table.ints("allocated_bytes")[-1] == 10**9 + 3999
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - started
    assert peak < 30 * size, f"reading a {size:,}-byte log peaked at {peak:,} bytes"
    assert seconds < 5, seconds
    assert len(table.columns) == len(COLUMNS) + 4000
    # Columns asked for are whole, with '' where a row lacked the key, as before.
    assert table.raw["loss_7"][6:9] == ["", "0.5", ""] and len(table.raw["loss_7"]) == 4000
    assert table.strings("loss_3999")[-1] == "0.5"


def test_the_cli_reports_that_log_in_bounded_time(tmp_path: Path) -> None:
    path = write_new_key_per_row(tmp_path / "keys.jsonl", 4000)
    started = time.monotonic()
    result = vramscope("report", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["log"]["rows"] == 4000
    assert time.monotonic() - started < 30


def test_jsonl_cells_are_read_as_before_gaps_nulls_and_late_keys(tmp_path: Path) -> None:
    rows = [{"time": "t0", "gpu": 0, "allocated_bytes": 1, "phase": "train"},
            {"time": "t1", "gpu": 0, "allocated_bytes": None, "late": "x", "phase": "eval"},
            {"time": "t2", "gpu": 1, "late": 3}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn": ')
    table = read_log(path)
    assert len(table) == 3
    assert table.raw["allocated_bytes"] == ["1", "", ""]
    assert table.raw["late"] == ["", "x", "3"]
    assert table.raw["phase"] == ["train", "eval", ""]
    assert table.raw["step"] == ["", "", ""]
    assert table.columns[: len(COLUMNS)] == list(COLUMNS) and table.columns[-1] == "late"


def test_a_rotated_jsonl_set_is_joined_column_by_column(tmp_path: Path) -> None:
    first = tmp_path / "m.jsonl"
    first.write_text(json.dumps({"time": "a", "gpu": 0, "allocated_bytes": 1}) + "\n")
    (tmp_path / "m.jsonl.1").write_text(json.dumps({"time": "b", "gpu": 0, "allocated_bytes": 2, "x": 9}) + "\n")
    table = read_log(first)
    assert table.ints("allocated_bytes") == [1, 2]
    assert table.raw["x"] == ["", "9"]


def _read_cost(path: Path) -> tuple[int, object]:
    """The bytes pyarrow holds for the read table (every column made into arrays is on top of it)."""
    before = pa.total_allocated_bytes()
    table = read_log(path)
    return pa.total_allocated_bytes() - before, table


def test_a_large_csv_is_read_in_a_fraction_of_its_size(tmp_path: Path) -> None:
    # The file is streamed a block at a time and only its columns are kept (numbers as int64, empty
    # blocks as a count): not the file, nor a cell's offsets. Two real files several blocks long.
    small = write_csv(tmp_path / "small.csv", 40_000)
    large = write_csv(tmp_path / "large.csv", 120_000)
    assert large.stat().st_size > 3 * CHUNK_BYTES
    small_cost, _ = _read_cost(small)
    large_cost, table = _read_cost(large)
    grown = large.stat().st_size - small.stat().st_size
    assert large_cost - small_cost < 0.9 * grown, f"{grown:,} more bytes cost {large_cost - small_cost:,} more"
    assert isinstance(table, LogTable)
    assert table.int_column("step").values.tolist() == list(range(120_000))
    assert table.labels("phase").names == ["train"] and (table.labels("phase").codes == 0).all()


@pytest.mark.slow  # many chunked reads of a large CSV: about 4 s here
def test_a_csv_scanned_in_many_chunks_reads_as_the_csv_module_reads_it(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "big.csv", 100_000)  # lines straddle each chunk's boundary
    assert path.stat().st_size > 2 * CHUNK_BYTES
    table = read_log(path)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    for j, name in enumerate(COLUMNS):
        cells = [r[j] for r in rows[1:]]
        if name in FLOAT_COLUMNS:  # a number column's text is its number: "0.000" reads back as "0.0"
            cells = [repr(float(c)) if c else "" for c in cells]
        assert table.raw[name] == cells, name


# -- item 8: numbers in cells and flags -----------------------------------------------------------------

HUGE = "9" * 400


@pytest.mark.parametrize("column", ["allocated_bytes", "reserved_bytes", "device_used_bytes", "step", "tokens",
                                    "elapsed_s", "device_total_bytes"])
def test_a_400_digit_cell_is_unknown_not_a_crash(tmp_path: Path, column: str) -> None:
    path = write_csv(tmp_path / "m.csv", 60, {30: {column: HUGE}})
    result = vramscope("report", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    table = read_log(path)
    values = table.floats(column) if column == "elapsed_s" else table.ints(column)
    assert values[30] is None and values[29] is not None


def test_a_400_digit_cell_in_a_large_log_is_unknown(tmp_path: Path) -> None:
    # Over 1 MiB: the byte path declines the column and the string path bounds the cell.
    path = write_csv(tmp_path / "m.csv", 9000, {4500: {"reserved_bytes": HUGE}, 4501: {"step": "1e400"}})
    table = read_log(path)
    assert table.ints("reserved_bytes")[4500] is None and table.ints("step")[4501] is None
    assert vramscope("report", str(path)).returncode == 0


def test_cells_in_other_scripts_or_not_finite_are_unknown(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "m.csv", 10, {3: {"allocated_bytes": "\u0664\u0662"}, 4: {"elapsed_s": "nan"},
                                              5: {"elapsed_s": "inf"}, 6: {"allocated_bytes": "1e300"}})
    table = read_log(path)
    assert table.ints("allocated_bytes")[3] is None and table.ints("allocated_bytes")[6] is None
    assert table.floats("elapsed_s")[4:6] == [None, None]
    assert table.ints("allocated_bytes")[2] == 10**9 + 2 * 10**6


@pytest.mark.parametrize("args", [
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--gpu-memory", HUGE],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--gpu-memory", HUGE + "GiB"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--gpu-memory", "2000000PiB"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "9" * 4000],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "1000000000001"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "9" * 30, "--batch-size", "1"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "\u0664"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--gpu-memory", "\u0662\u0664GiB"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--lora-r", "\u0664"],
    ["plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "4", "--lora-dropout", "\u0660.1"],
    ["tune", "--model-dir", ".", "--gpu-memory", HUGE],
    ["tune", "--model-dir", ".", "--gpu-memory", "\u0662\u0664GiB"],
    ["tune", "--model-dir", ".", "--devices", "9" * 4000],
    ["tune", "--model-dir", ".", "--margin", "\u0660.1"],
    ["watch", "--interval", HUGE],
    ["watch", "--interval", "\u0661"],
    ["watch", "--count", "9" * 4000],
    ["watch", "--devices", "0," + "9" * 400],
    ["watch", "--max-log-mb", "1" + "0" * 400, "--log", "x.csv"],
    ["report", "x.csv", "--batch-size", "9" * 4000, "--model", "Llama-2-7B"],
    ["run", "--prometheus", "9" * 400, "--", "true"],
    ["run", "--prometheus", "\u0669\u0664\u0660\u0660", "--", "true"],
    ["run", "--interval", "\u0661", "--", "true"],
])
def test_numeric_flags_are_bounded_with_one_line(args: list[str], tmp_path: Path) -> None:
    line = assert_one_line_usage_error(vramscope(*args))
    assert "OverflowError" not in line


def test_ascii_digits_are_the_one_rule_for_numbers() -> None:
    # Both the count and the size refuse other scripts' digits; before, '٤' was a batch of 4 and '٢٤GiB' an error.
    count = assert_one_line_usage_error(vramscope("plan", "--model", "Llama-2-7B", "--seq-len", "512",
                                                  "--batch-size", "\u0664"))
    size = assert_one_line_usage_error(vramscope("plan", "--model", "Llama-2-7B", "--seq-len", "512",
                                                 "--batch-size", "4", "--gpu-memory", "\u0662\u0664GiB"))
    assert "ASCII digits" in count and "ASCII digits" in size


def test_a_batch_of_a_trillion_is_planned_in_seconds() -> None:
    # The micro-batch advice searched every divisor up to half the batch: hours for 10**12.
    started = time.monotonic()
    result = vramscope("plan", "--model", "Llama-2-7B", "--seq-len", "512", "--batch-size", "1000000000000",
                       "--gpu-memory", "80GiB", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    micro = [r for r in json.loads(result.stdout)["recommendations"] if r["name"] == "micro_batch"]
    assert micro and 10**12 % micro[0]["change"]["batch_size"] == 0


def test_the_largest_divisor_search_is_exact() -> None:
    from vramscope.planner.api import _largest_divisor

    for n in range(1, 400):
        for limit in (1, 2, 3, n // 2, n):
            if limit < 1:
                continue
            assert _largest_divisor(n, limit) == max(d for d in range(1, limit + 1) if n % d == 0), (n, limit)
    assert _largest_divisor(10**12, 10**12 // 2) == 5 * 10**11
    assert _largest_divisor(999_999_999_989, 10**11) == 1  # a prime: a million steps, well under a second


# -- item 12: what report reads, what an analysis leaves on a full disk ---------------------------------


def test_report_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.csv"
    os.mkfifo(fifo)
    started = time.monotonic()
    line = assert_one_line_usage_error(vramscope("report", str(fifo), timeout=30))
    assert "FIFO" in line and time.monotonic() - started < 30


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_report_refuses_a_character_device_at_once(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} is not on this machine")
    line = assert_one_line_usage_error(vramscope("report", device, timeout=30))
    assert "character device" in line


def test_read_log_refuses_a_socket(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s.csv"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        with pytest.raises(LogFormatError, match="socket"):
            read_log(path)
    finally:
        server.close()


def test_an_atomic_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "m.analysis.json"
    target.write_text('{"old": true}')

    with pytest.raises(TypeError):
        write_atomically(target, "not bytes")  # type: ignore[arg-type]  # fails mid-write, after the temp exists
    assert target.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.analysis.json"]


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real 32 KiB tmpfs (as in test_faults.py): writes past it fail with ENOSPC from the kernel."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "vramscope-test", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError:
            pass


def test_an_analysis_on_a_full_disk_leaves_no_empty_file(small_disk: Path) -> None:
    import fake_nvml
    from vramscope.integrations.loop import MemoryMonitor

    log = small_disk / "m.steps.csv"
    with MemoryMonitor(log=str(log), warn=False, nvml=fake_nvml.no_driver()) as monitor:
        for step in range(5):
            monitor.step(step)
        first = monitor.save_analysis()
        assert first is not None and json.loads(Path(first).read_text())
        good = Path(first).read_bytes()
        fill(small_disk)
        for step in range(5, 40):
            monitor.step(step)
        assert monitor.save_analysis() is None  # failed, said so, did not raise
    analysis = small_disk / "m.steps.analysis.json"
    assert analysis.read_bytes() == good  # the earlier analysis, whole
    assert not [p for p in small_disk.iterdir() if p.name.endswith(".tmp")]


def test_an_analysis_that_cannot_be_written_at_all_leaves_nothing(small_disk: Path) -> None:
    import fake_nvml
    from vramscope.integrations.loop import MemoryMonitor

    log = small_disk / "m.steps.csv"
    with MemoryMonitor(log=str(log), warn=False, nvml=fake_nvml.no_driver()) as monitor:
        for step in range(3):
            monitor.step(step)
        fill(small_disk)
        assert monitor.save_analysis() is None
    assert not (small_disk / "m.steps.analysis.json").exists()
    assert not [p for p in small_disk.iterdir() if p.name.endswith(".tmp")]


def test_plan_config_refuses_a_device_a_fifo_and_a_huge_file(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert "FIFO" in assert_one_line_usage_error(vramscope("plan", "--config", str(fifo), "--batch-size", "1",
                                                           "--seq-len", "8", timeout=30))
    if os.path.exists("/dev/zero"):
        assert "character device" in assert_one_line_usage_error(
            vramscope("plan", "--config", "/dev/zero", "--batch-size", "1", "--seq-len", "8", timeout=30))
    huge = tmp_path / "big.json"
    with huge.open("wb") as out:
        out.truncate(17 << 20)  # a sparse 17 MiB file: nothing is read past the limit
    assert "more than" in assert_one_line_usage_error(vramscope("plan", "--config", str(huge), "--batch-size", "1",
                                                                "--seq-len", "8", timeout=30))


def test_a_key_met_only_as_null_is_still_an_empty_column(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"time": "t0", "gpu": 0, "allocated_bytes": 1, "only_null": None}) + "\n")
    table = read_log(path)
    assert "only_null" in table.columns and table.raw["only_null"] == [""] and not table.has("only_null")


def test_report_plan_and_the_strategy_beside_the_log_are_bounded(tmp_path: Path) -> None:
    log = write_csv(tmp_path / "m.csv", 30)
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    line = assert_one_line_usage_error(vramscope("report", str(log), "--plan", str(fifo), timeout=30))
    assert "FIFO" in line and "--plan" in line
    if os.path.exists("/dev/zero"):
        assert "character device" in assert_one_line_usage_error(
            vramscope("report", str(log), "--plan", "/dev/zero", timeout=30))
    os.mkfifo(tmp_path / "m.strategy.json")  # the monitor's side file, as a FIFO: passed over, not waited on
    os.mkfifo(tmp_path / "m.breakdown.json")  # the breakdown's, the same (read through the same reader)
    result = vramscope("report", str(log), timeout=30)
    assert result.returncode == 0, result.stderr
    (tmp_path / "m.breakdown.json").unlink()
    os.symlink("/dev/zero", tmp_path / "m.breakdown.json")
    result = vramscope("report", str(log), "--json", timeout=30)
    assert result.returncode == 0 and "breakdown" not in json.loads(result.stdout), result.stderr
