"""Rotation writes only files it made (issue 24, item 6): a part is always a new file, and a new log removes only
the parts of an older one that look like vramscope's and follow it without a gap.

Before: with `--overwrite`, someone's `run.csv.1` was truncated by the first rotation; without it, a `run.csv.3`
after a gap was overwritten when rotation reached it; a `m.jsonl.1` of someone's JSON was deleted as a stale part
(any file starting with "{" passed for one). Real `vramscope run` processes with `--max-log-mb`, and the real
sinks on real files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fake_nvml
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.csv_sink import CsvSink
from vramscope.logs.jsonl_sink import JsonlSink
from vramscope.logs.reader import read_log
from vramscope.sampling.sampler import Collector
from vramscope.types import Sample

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")
NOTES = "my notes about this run\nkeep them\n"


def run_with_rotation(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`vramscope run --log run.csv --max-log-mb 0.001` (about 1 KB a part) around a child of two seconds."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [PYTHON, "-m", "vramscope", "run", "--log", "run.csv", "--max-log-mb", "0.001", "--interval", "0.05", *flags,
         "--", PYTHON, "-c", "import time; time.sleep(2)"],
        capture_output=True, text=True, timeout=60, cwd=folder, env=env)


def samples_of(result: subprocess.CompletedProcess[str]) -> int:
    return int(result.stderr.rsplit("samples: ", 1)[1].split(",")[0])


def test_overwrite_leaves_someones_part_named_file_alone(tmp_path: Path) -> None:
    (tmp_path / "run.csv").write_text("an old log\n")
    (tmp_path / "run.csv.1").write_text(NOTES)
    result = run_with_rotation(tmp_path, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run.csv.1").read_text() == NOTES
    assert result.stderr.count("run.csv.1 already exists and this log did not write it; it is left alone") == 1
    assert len(read_log(tmp_path / "run.csv")) == samples_of(result)  # every row, in run.csv; the notes not read
    assert (tmp_path / "run.csv").stat().st_size > 1048  # it grew past the limit rather than overwrite


def test_a_part_after_a_gap_is_not_overwritten_when_rotation_reaches_it(tmp_path: Path) -> None:
    (tmp_path / "run.csv.3").write_text(NOTES)  # run.csv.1 and run.csv.2 do not exist: not part of any log here
    result = run_with_rotation(tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run.csv.2").exists()  # rotation did reach it
    assert (tmp_path / "run.csv.3").read_text() == NOTES
    assert "run.csv.3 already exists" in result.stderr
    assert len(read_log(tmp_path / "run.csv")) == samples_of(result)


def test_a_symbolic_link_at_a_parts_name_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text(NOTES)
    (tmp_path / "run.csv.1").symlink_to(target)
    result = run_with_rotation(tmp_path, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert target.read_text() == NOTES and (tmp_path / "run.csv.1").is_symlink()


def fake_samples(n: int) -> list[Sample]:
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=(i + 1) * 2**30) for i in range(2)])
    clock = iter(range(10**9))
    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), clock=lambda: 1.7e9 + next(clock))
    return [collector.collect(step=i) for i in range(n)]


def test_stale_parts_of_an_older_log_go_even_with_other_columns(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    old = CsvSink(log, max_bytes=2048, extra_columns=("loss",))  # an older run, one more column
    for sample in fake_samples(40):
        old.write(sample)
    old.close()
    assert (tmp_path / "m.csv.2").exists()
    (tmp_path / "m.csv.9").write_text(NOTES)  # after a gap: never a part of this log
    new = CsvSink(log, max_bytes=2048)
    for sample in fake_samples(3):
        new.write(sample)
    new.close()
    assert not (tmp_path / "m.csv.1").exists() and not (tmp_path / "m.csv.2").exists()
    assert (tmp_path / "m.csv.9").read_text() == NOTES
    assert len(read_log(log)) == 6


@pytest.mark.parametrize("foreign", ['{"notes": "mine"}\n', "{not even json\n"])
def test_someones_json_beside_a_jsonl_log_is_not_a_stale_part(tmp_path: Path, foreign: str) -> None:
    log = tmp_path / "m.jsonl"
    old = JsonlSink(log, max_bytes=2048)
    for sample in fake_samples(20):
        old.write(sample)
    old.close()
    parts = sorted(tmp_path.glob("m.jsonl.*"))
    assert parts
    parts[-1].write_text(foreign)  # the last "part" is someone else's file now
    new = JsonlSink(log, max_bytes=2048)
    new.write(fake_samples(1)[0])
    new.close()
    assert [p for p in parts[:-1] if p.exists()] == []  # vramscope's parts went
    assert parts[-1].read_text() == foreign  # the other file stayed, whole
