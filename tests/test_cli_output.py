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


def test_a_report_says_what_it_is_doing_on_a_terminal_and_nothing_in_a_pipe(tmp_path: Path) -> None:
    import os
    import pty

    log = tmp_path / "m.csv"
    assert vramscope("run", "--log", str(log), "--", sys.executable, "-c", "pass").returncode == 0
    html = tmp_path / "m.html"
    master, slave = pty.openpty()  # a real terminal for stderr: the progress line shows, then is cleared
    try:
        done = subprocess.run([sys.executable, "-m", "vramscope", "report", str(log), "--html", str(html)],
                              stdout=subprocess.PIPE, stderr=slave, text=True, timeout=60)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert done.returncode == 0
    text = seen.decode()
    assert "vramscope: reading and analysing" in text and "drawing html" in text
    assert "\x1b" not in text  # cleared with spaces: nothing vramscope prints holds a terminal escape
    cleared = text.split("drawing html...", 1)[1]
    assert cleared.startswith("\r" + " " * len("vramscope: drawing html...") + "\r")
    piped = vramscope("report", str(log), "--html", str(tmp_path / "n.html"))
    assert "reading and analysing" not in piped.stderr
