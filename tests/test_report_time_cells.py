"""A log's time cells cannot make the report wrong or noisy (issue 24, item 15): `elapsed_s` of 1e308 (numpy's
overflow RuntimeWarnings, then a crash on NaN, or a duration of 308 digits) is an unknown cell like any damaged
one, and a wall clock stepped back mid-run (NTP, a hand-set clock) no longer gives a duration of "-1:00:09":
durations come from `elapsed_s`, which a monotonic clock counts. The real CLI on logs the real CSV sink wrote.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import fake_nvml
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.csv_sink import CsvSink
from vramscope.sampling.sampler import Collector

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")
ROWS = 200  # one a second, steps 0-199, memory growing: the leak test and the forecast both run


def vramscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([PYTHON, "-m", "vramscope", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def edited_log(folder: Path, name: str, edit: Callable[[int, dict[str, str]], None]) -> Path:
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=2**30)])
    clock = iter(range(10**9))
    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), clock=lambda: 1.7e9 + next(clock))
    written = folder / "written.csv"
    sink = CsvSink(written)
    for step in range(ROWS):
        fake.gpus[0].used = 2**30 + step * 2**22
        sink.write(collector.collect(step=step))
    sink.close()
    with open(written, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows):
        edit(i, row)
    out = folder / name
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out


def huge_last(i: int, row: dict[str, str]) -> None:
    if i == ROWS - 1:
        row["elapsed_s"] = "1e308"


def huge_both_ways(i: int, row: dict[str, str]) -> None:
    row["elapsed_s"] = "1e308" if i % 2 else "-1e308"
    row["step"] = ""  # a time-based log: the leak test's slope runs over these seconds


def huge_without_time(i: int, row: dict[str, str]) -> None:
    row["time"] = ""
    if i > 100:
        row["elapsed_s"] = "1e308"


@pytest.mark.parametrize(("edit", "duration"), [(huge_last, "0:03:19"), (huge_both_ways, None),
                                                (huge_without_time, "0:01:40")])
def test_elapsed_of_1e308_is_an_unknown_cell_quietly(tmp_path: Path, edit: Callable[[int, dict[str, str]], None],
                                                     duration: str | None) -> None:
    log = edited_log(tmp_path, "huge.csv", edit)
    results = {}
    for args in (["report", log.name], ["report", log.name, "--json"], ["report", log.name, "--html", "r.html"]):
        results[args[-1]] = result = vramscope(*args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "Warning" not in result.stderr and "overflow" not in result.stderr, result.stderr
    text = results[log.name].stdout  # the plain report's own output (one CLI run per form is enough)
    first = text.splitlines()[0]
    assert (f", {duration}" in first) if duration else first.startswith(f"vramscope report {log.name}  (200 rows")
    assert len(first) < 120  # no duration of 308 digits
    doc = json.loads(results["--json"].stdout)
    assert doc["log"]["duration_s"] is None or doc["log"]["duration_s"] < 10**6


def test_a_wall_clock_stepped_back_does_not_shorten_the_run(tmp_path: Path) -> None:
    def stepped_back(i: int, row: dict[str, str]) -> None:
        if i >= 120:  # NTP (or a person) set the clock back an hour two minutes in
            stamp = datetime.fromisoformat(row["time"]) - timedelta(hours=1)
            row["time"] = stamp.isoformat(timespec="milliseconds")

    log = edited_log(tmp_path, "back.csv", stepped_back)
    result = vramscope("report", log.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert ", 0:03:19, steps" in first and "-1:" not in first, first
    doc = json.loads(vramscope("report", log.name, "--json", cwd=tmp_path).stdout)
    assert doc["log"]["duration_s"] == 199.0
