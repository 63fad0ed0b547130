"""`vramscope run` on real child processes: exit codes, signals, kill -9, forked workers, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vramscope.logs.reader import read_log

VRAMSCOPE = [sys.executable, "-m", "vramscope"]


def vramscope(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VRAMSCOPE, *args], capture_output=True, text=True, timeout=timeout)


def test_exit_code_and_summary_and_log(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    result = vramscope(
        "run",
        "--log",
        str(log),
        "--interval",
        "0.05",
        "--",
        sys.executable,
        "-c",
        "import time, sys; x = bytearray(150_000_000); time.sleep(0.5); sys.exit(3)",
    )
    assert result.returncode == 3
    assert "exited with 3" in result.stderr
    assert f"log: {log}" in result.stderr
    table = read_log(log)
    assert len(table) >= 5
    # The child's 150 MB buffer shows in the tree's RSS.
    assert max(v for v in table.ints("host_rss_bytes") if v is not None) > 150_000_000


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    result = vramscope("run", "--quiet", "--", sys.executable, "-c", "print('child says hi')")
    assert result.returncode == 0
    assert result.stdout == "child says hi\n"
    assert result.stderr == ""


def test_forked_workers_count_in_the_tree_rss(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    code = (
        "import multiprocessing as mp, time\n"
        "def work():\n"
        "    x = bytearray(120_000_000); time.sleep(1.2)\n"
        "if __name__ == '__main__':\n"
        "    ps = [mp.get_context('fork').Process(target=work) for _ in range(2)]\n"
        "    [p.start() for p in ps]; [p.join() for p in ps]\n"
    )
    result = vramscope("run", "--log", str(log), "--interval", "0.1", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    peak = max(v for v in read_log(log).ints("host_rss_bytes") if v is not None)
    assert peak > 240_000_000  # both workers' buffers, not just the parent's


def test_child_killed_with_sigkill_kills_vramscope_the_same_way_and_keeps_the_log(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    result = vramscope(
        "run",
        "--log",
        str(log),
        "--interval",
        "0.05",
        "--",
        sys.executable,
        "-c",
        "import os, time; time.sleep(0.4); os.kill(os.getpid(), 9)",
    )
    assert result.returncode == -signal.SIGKILL  # died of the same signal: a shell reports 137, as for the child
    assert "was killed by signal 9" in result.stderr  # the summary was printed first
    assert len(read_log(log)) >= 3


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_the_child_exit_code_returned(tmp_path: Path, sig: signal.Signals) -> None:
    marker = tmp_path / "got"
    code = (
        "import signal, sys, time, pathlib\n"
        f"def h(s, f): pathlib.Path({str(marker)!r}).write_text(str(s)); sys.exit(42)\n"
        "signal.signal(signal.SIGTERM, h); signal.signal(signal.SIGINT, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [*VRAMSCOPE, "run", "--log", str(tmp_path / "m.csv"), "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 42, err
    assert marker.read_text() == str(int(sig))
    assert "exited with 42" in err


def test_nothing_is_left_running_afterwards() -> None:
    marker = f"vramscope-test-marker-{os.getpid()}-{time.time_ns()}"
    result = vramscope(
        "run", "--interval", "0.05", "--", sys.executable, "-c", f"# {marker}\nimport time; time.sleep(0.3)"
    )
    assert result.returncode == 0
    # Neither the monitor nor its child survives the command: there is nothing to pkill.
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == ""


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["run", "--interval", "0", "--", "true"], 2, "interval must be at least 0.05"),
        (["run", "--interval", "-1", "--", "true"], 2, "interval must be at least 0.05"),
        (["run", "--interval", "abc", "--", "true"], 2, "number of seconds"),
        (["run", "--bogus", "--", "true"], 2, "unrecognized arguments"),
        (["run"], 2, "no command to run"),
        (["run", "--", "surely-not-a-program-xyz"], 127, "command not found: surely-not-a-program-xyz"),
        (["run", "--log", "/nonexistent-dir/m.csv", "--", "true"], 2, "folder /nonexistent-dir does not exist"),
        (["frobnicate"], 2, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(args: list[str], code: int, message: str) -> None:
    started = time.monotonic()
    result = vramscope(*args)
    assert result.returncode == code
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


def test_unwritable_log_does_not_start_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = vramscope("run", "--log", str(tmp_path / "no" / "m.csv"), "--", "touch", str(marker))
    assert result.returncode == 2
    assert not marker.exists()


def test_existing_file_is_not_destroyed_by_a_refused_run(tmp_path: Path) -> None:
    precious = tmp_path / "old.csv"
    precious.write_text("time,gpu\n1,0\n")
    result = vramscope("run", "--overwrite", "--log", str(precious), "--", "surely-not-a-program-xyz")
    assert result.returncode == 127
    assert precious.read_text() == "time,gpu\n1,0\n"
