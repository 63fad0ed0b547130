"""Signals reach the command as if `vramscope run` had exec'd it (issue 24, items 1 and 12).

Every test runs the real CLI in a child with real signals; each compares with the command run without
vramscope, so the plain behaviour is pinned beside ours:

* `kill -USR1` to the run reaches the command's main process only: a DataLoader-style worker that
  keeps the default USR1 (death) lives on;
* a torchrun-style launcher that forwards SIGTERM to its worker: the worker sees exactly one;
* a nested `vramscope run`: the command sees one SIGTERM;
* a background job (`cmd &` in a script: SIGINT ignored): the command starts with SIGINT ignored, and
  once it installs its own handler, `kill -INT` to the job reaches it;
* Ctrl-Z on a real pty when the command ignores SIGTSTP: nothing stops, the log has no gap.
"""

from __future__ import annotations

import csv
import itertools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from test_run_jobcontrol import Terminal  # the interactive bash on a pty

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parent.parent / "src")
VRAMSCOPE = [PYTHON, "-m", "vramscope"]


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    env["PYTHONPATH"] = SRC
    return env


def wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def start(argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)  # type: ignore[call-overload]


# -- 1. a checkpoint on USR1 with a DataLoader-style worker --------------------------------------------

CHECKPOINT_ON_USR1 = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    saved = []
    signal.signal(signal.SIGUSR1, lambda *_: saved.append(1))   # SLURM's --signal=USR1@60: save a checkpoint
    worker = os.fork()
    if worker == 0:                      # a DataLoader worker: the default USR1 (it would die of it)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        time.sleep(1.5)
        os._exit(0)
    (out / "ready").write_text(str(worker))
    _, status = os.waitpid(worker, 0)
    (out / "result").write_text(f"{int(bool(saved))} {os.waitstatus_to_exitcode(status)}")
    sys.exit(0 if saved and status == 0 else 1)
    """
)


@pytest.mark.parametrize("under_vramscope", [False, True], ids=["plain", "vramscope"])
def test_usr1_reaches_the_main_process_only(under_vramscope: bool, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(CHECKPOINT_ON_USR1)
    argv = [PYTHON, str(tmp_path / "t.py"), str(tmp_path)]
    proc = start([*VRAMSCOPE, "run", "--quiet", "--", *argv] if under_vramscope else argv)
    wait_for(tmp_path / "ready")
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert (tmp_path / "result").read_text() == "1 0", err  # the checkpoint saved, the worker alive
    assert proc.returncode == 0, err


# -- 1. a launcher that forwards SIGTERM; a nested run ------------------------------------------------

COUNT_SIGTERMS = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    seen = []
    signal.signal(signal.SIGTERM, lambda *_: seen.append(time.monotonic()))
    (out / "ready").write_text("1")
    while not seen:
        time.sleep(0.01)
    time.sleep(1.0)   # a second SIGTERM, if one comes, comes within this
    (out / "count").write_text(str(len(seen)))
    """
)
LAUNCHER = textwrap.dedent(
    """
    import signal, subprocess, sys
    worker = subprocess.Popen([sys.executable, *sys.argv[1:]])
    signal.signal(signal.SIGTERM, lambda *_: worker.send_signal(signal.SIGTERM))   # as torchrun does
    sys.exit(worker.wait())
    """
)


@pytest.mark.slow  # three attempts, each a second's wait for a second SIGTERM
@pytest.mark.parametrize("shape", ["plain", "vramscope", "nested"])
def test_a_launcher_forwarding_sigterm_gives_its_worker_one(shape: str, tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(COUNT_SIGTERMS)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    command = [PYTHON, str(tmp_path / "launcher.py"), str(tmp_path / "worker.py"), str(tmp_path)]
    prefix = {"plain": [], "vramscope": [*VRAMSCOPE, "run", "--quiet", "--"],
              "nested": [*VRAMSCOPE, "run", "--quiet", "--", *VRAMSCOPE, "run", "--quiet", "--"]}[shape]
    for attempt in range(3):  # the double delivery was a race (2 runs in 8): try it more than once
        for name in ("ready", "count"):
            (tmp_path / name).unlink(missing_ok=True)
        proc = start([*prefix, *command])
        wait_for(tmp_path / "ready")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert (tmp_path / "count").read_text() == "1", f"attempt {attempt}: {err}"


def test_a_nested_run_delivers_sigterm_once(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(COUNT_SIGTERMS)
    proc = start([*VRAMSCOPE, "run", "--quiet", "--", *VRAMSCOPE, "run", "--quiet", "--", PYTHON,
                  str(tmp_path / "worker.py"), str(tmp_path)])
    wait_for(tmp_path / "ready")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "count").read_text() == "1", err


# -- 12. a background job's kill -INT ------------------------------------------------------------------

OWN_SIGINT = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    out = pathlib.Path(sys.argv[1])
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    got = []
    signal.signal(signal.SIGINT, lambda *_: got.append(1))    # its own handler (a graceful stop)
    (out / "ready").write_text("1")
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    (out / "result").write_text(f"ignored-at-start={ignored} got-int={bool(got)}")
    """
)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("under_vramscope", [False, True], ids=["plain", "vramscope"])
def test_a_background_jobs_kill_int_reaches_a_child_with_its_own_handler(under_vramscope: bool,
                                                                         tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(OWN_SIGINT)
    command = f"{PYTHON} {tmp_path / 't.py'} {tmp_path}"
    if under_vramscope:
        command = f"{PYTHON} -m vramscope run --quiet -- {command}"
    # A non-interactive bash starts `cmd &` with SIGINT and SIGQUIT ignored, as POSIX asks.
    script = f"{command} & pid=$!\nwhile [ ! -e {tmp_path / 'ready'} ]; do sleep 0.02; done\nkill -INT $pid\nwait $pid"
    # Its own session, without a terminal: the script of a scheduler or a cron job (a script started from
    # a terminal keeps its `&` jobs in the terminal's foreground group: see the limits in docs/reliability.md).
    result = subprocess.run(["bash", "-c", script], env=user_env(), capture_output=True, text=True, timeout=60,
                            start_new_session=True)
    assert result.returncode == 0, result.stderr
    # The caller's disposition at start (ignored), and the job's kill -INT once it has a handler.
    assert (tmp_path / "result").read_text() == "ignored-at-start=True got-int=True", result.stderr


# -- 12. Ctrl-Z when the command ignores SIGTSTP -------------------------------------------------------

IGNORES_TSTP = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    # Ignored, or caught by a handler that does not stop (a program that saves its state on Ctrl-Z).
    signal.signal(signal.SIGTSTP, signal.SIG_IGN if sys.argv[2] == "ignore" else lambda *_: None)
    pathlib.Path(sys.argv[1]).write_text("1")
    done, deadline = pathlib.Path(sys.argv[3]), time.monotonic() + 30
    while not done.exists() and time.monotonic() < deadline:  # runs on through the Ctrl-Z until told to end
        time.sleep(0.01)
    print("FINISHED", flush=True)
    """
)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("how", ["ignore", "catch"])
@pytest.mark.parametrize("under_vramscope", [False, True], ids=["plain", "vramscope"])
def test_ctrl_z_on_a_command_that_ignores_it_stops_nothing(under_vramscope: bool, how: str, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(IGNORES_TSTP)
    terminal = Terminal(tmp_path)
    try:
        command = f"{PYTHON} t.py ready {how} done"
        if under_vramscope:
            command = f"{PYTHON} -m vramscope run --quiet --log m.csv --interval 0.1 -- {command}"
        terminal.run(command)
        wait_for(tmp_path / "ready")
        time.sleep(0.3)
        terminal.send(b"\x1a")  # Ctrl-Z: SIGTSTP to the foreground process group
        time.sleep(1.0)  # a second of the command (and the monitor's sampling) after the Ctrl-Z
        (tmp_path / "done").touch()
        assert terminal.wait_for(b"FINISHED", timeout=30), terminal.text
        assert terminal.wait_for(b"PROMPT> ", timeout=30), terminal.text
        assert b"Stopped" not in terminal.output[terminal.mark:], terminal.text  # as without vramscope
    finally:
        terminal.close()
    if under_vramscope:
        with open(tmp_path / "m.csv", newline="") as handle:
            times = sorted({float(row["elapsed_s"]) for row in csv.DictReader(handle)})
        assert len(times) >= 10
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < 1.0, gaps  # the monitor kept sampling through the Ctrl-Z
