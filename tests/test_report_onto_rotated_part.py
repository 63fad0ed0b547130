"""`report --html` (or `--png`) onto any part of a rotated log it reads is refused like the log's first file
(issue 24, item 7): before, `vramscope report r.csv --html r.csv.1` replaced part 1 of the log with the report.
The real CLI in a child process, on a log the real CSV sink rotated.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_report_fixtures import write_rotated_log

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")


def vramscope(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([PYTHON, "-m", "vramscope", *args], capture_output=True, text=True, timeout=120,
                          cwd=folder, env=env)


@pytest.fixture
def rotated(tmp_path: Path) -> Path:
    write_rotated_log(tmp_path / "r.csv")
    assert (tmp_path / "r.csv.3").exists()
    return tmp_path


@pytest.mark.parametrize(("flag", "output"), [("--html", "r.csv.1"), ("--html", "r.csv.3"),
                                              ("--html", "link-to-part-2"), ("--html", "r.csv")])
def test_an_output_onto_a_part_of_the_log_is_refused(rotated: Path, flag: str, output: str) -> None:
    os.link(rotated / "r.csv.2", rotated / "link-to-part-2")  # another name for part 2: the same file
    before = {p.name: p.read_bytes() for p in rotated.glob("r.csv*")}
    result = vramscope(rotated, "report", "r.csv", flag, output)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vramscope: error: {flag} {output} is "), result.stderr
    assert ("part" in lines[0] and "of the rotated log r.csv" in lines[0]) or output == "r.csv"
    assert {p.name: p.read_bytes() for p in rotated.glob("r.csv*")} == before  # every part as it was


def test_an_output_beside_the_parts_is_written(rotated: Path) -> None:
    result = vramscope(rotated, "report", "r.csv", "--html", "r.html")
    assert result.returncode == 0, result.stderr
    assert (rotated / "r.html").read_text().startswith("<!DOCTYPE html>")
