"""Text from a log reaches the terminal inertly (issue 14, item 9).

`vramscope report` (one log, and several compared) runs in a child process on a real pty, so rich
draws with colours as it would for a person; phase names and the log's own file name hold terminal
escapes, a bell, a newline that would forge a line, and a right-to-left override. What the pty shows
may hold rich's own colour sequences and nothing else, and as many lines as the same report of a
benign log.
"""

from __future__ import annotations

import csv
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from vramscope.logs.schema import COLUMNS
from vramscope.output.safetext import inert, printable

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")
HOSTILE = ["\x1b[2J\x1b]0;pwned\x07", "x\nGPU 9 FAKE: used 0.00 GiB", "\u202eevil"]
BENIGN = ["clear", "x GPU 9 fake used 0 GiB", "evil"]


def write_csv(path: Path, phases: list[str]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        for i in range(60):
            row = {c: "" for c in COLUMNS}
            row.update(time=f"2026-11-29T10:00:{i:02d}.000+00:00", elapsed_s=f"{i * 0.5:.3f}", step=str(i), gpu="0",
                       allocated_bytes=str(10**9 + i * 10**6), reserved_bytes=str(2 * 10**9),
                       device_used_bytes=str(3 * 10**9), device_total_bytes=str(8 * 10**10), phase=phases[i % 3])
            writer.writerow([row[c] for c in COLUMNS])


def write_jsonl(path: Path, phases: list[str]) -> None:
    with path.open("w") as out:
        for i in range(60):
            out.write(json.dumps({"time": f"2026-11-29T10:00:{i:02d}.000+00:00", "elapsed_s": i * 0.5, "step": i,
                                  "gpu": 0, "allocated_bytes": 10**9 + i * 10**6, "reserved_bytes": 2 * 10**9,
                                  "device_total_bytes": 8 * 10**10, "phase": phases[i % 3]}) + "\n")


def on_a_pty(*args: str) -> str:
    """What `vramscope ARGS` draws on a real terminal (wide, so rich wraps nothing)."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "400", "LINES": "100", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([PYTHON, "-m", "vramscope", *args], stdin=follower, stdout=follower, stderr=follower,
                            env=env, close_fds=True)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=30) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode("utf-8", errors="replace")


def assert_inert(drawn: str) -> None:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", drawn)  # rich's own colours (SGR); nothing else may drive the terminal
    assert "\x1b" not in plain and "\x07" not in plain and "\u202e" not in plain, repr(plain)
    assert not any(line.strip().startswith("GPU 9 FAKE") for line in plain.splitlines())
    assert "\\x1b" in plain and "\\n" in plain  # what was there is shown, as text


def test_report_of_one_log_shows_phase_names_and_the_file_name_inertly(tmp_path: Path) -> None:
    for writer, suffix in ((write_csv, ".csv"), (write_jsonl, ".jsonl")):
        hostile = tmp_path / f"run\x1b]0;title\x07{suffix}"
        benign = tmp_path / f"run_______________{suffix}"
        writer(hostile, HOSTILE)
        writer(benign, BENIGN)
        drawn = on_a_pty("report", str(hostile))
        assert_inert(drawn)
        assert len(drawn.splitlines()) == len(on_a_pty("report", str(benign)).splitlines())


def test_report_comparing_logs_shows_them_inertly(tmp_path: Path) -> None:
    first, second = tmp_path / "a\x1b[31m.csv", tmp_path / "b\nGPU 9 FAKE.jsonl"
    write_csv(first, HOSTILE)
    write_jsonl(second, HOSTILE)
    drawn = on_a_pty("report", str(first), str(second))
    plain = re.sub(r"\x1b\[[0-9;]*m", "", drawn)
    assert "\x1b" not in plain and "\x07" not in plain and "\u202e" not in plain, repr(plain)
    assert "\\x1b[31m.csv" in plain and "b\\nGPU 9 FAKE.jsonl" in plain  # the names, shown as text
    assert not any(line.strip().startswith("GPU 9 FAKE") for line in plain.splitlines())


def test_inert_makes_every_string_of_a_summary_printable() -> None:
    summary = {"phase\n": ["a\x1bb", {"k": "\u202e"}], "n": 3, "none": None}
    assert inert(summary) == {"phase\\n": ["a\\x1bb", {"k": "\\u202e"}], "n": 3, "none": None}
    assert printable("plain text, ünïcode ok") == "plain text, ünïcode ok"


def test_an_error_about_a_hostile_file_name_stays_one_inert_line(tmp_path: Path) -> None:
    # `vramscope report runs/*.csv` hands over whatever names another user made in runs/.
    name = tmp_path / "x\x1b[2J\nvramscope: all fine.csv"
    name.write_text("not,a,log\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    result = subprocess.run([PYTHON, "-m", "vramscope", "report", str(name)], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 2
    assert "\x1b" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "\\x1b[2J\\nvramscope: all fine.csv" in result.stderr
