"""What the CLI prints where people read it: through a pipe, into a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def vramscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vramscope", *args], capture_output=True, text=True, timeout=60)


def test_piped_report_lines_are_never_broken(tmp_path: Path) -> None:
    """rich assumes 80 columns without a terminal; a report read by grep or saved to a file keeps whole lines."""
    log = tmp_path / "m.csv"
    ran = vramscope("run", "--log", str(log), "--", sys.executable, "-c", "import time; time.sleep(1)")
    assert ran.returncode == 0, ran.stderr
    out = vramscope("report", str(log))
    assert out.returncode == 0, out.stderr
    forecast = [line for line in out.stdout.splitlines() if line.startswith("OOM forecast")]
    assert forecast and forecast[0].rstrip().endswith("--gpu-memory 24GiB"), out.stdout


def test_run_without_a_log_says_nothing_was_kept_and_how_to_keep_it() -> None:
    out = vramscope("run", "--", sys.executable, "-c", "pass")
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stderr.splitlines() if "samples:" in line)
    assert "none kept (no --log)" in line and "vramscope run --log mem.csv" in line
