"""Job control: `vramscope run` in a real interactive bash on a real pty behaves like `time` or `nice`.

Ctrl-Z gives the prompt back and `fg` resumes the command; Ctrl-C in a shell loop stops the loop
(vramscope dies of SIGINT, as the command did); `vramscope run -- seq ... | less` keeps the terminal
for less. Each test drives bash through the pty's master side, as a terminal emulator does.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parent.parent / "src")
VRAMSCOPE = f"{sys.executable} -m vramscope"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


class Terminal:
    """An interactive bash with job control on a fresh pty."""

    def __init__(self, cwd: Path) -> None:
        self.master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
        env.update(PYTHONPATH=SRC, PS1="PROMPT> ", TERM="xterm", LESS="", HISTFILE="/dev/null")
        # A new session whose controlling terminal is the pty (bash takes it, as under a terminal emulator).
        self.bash = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave,
                                     stderr=slave, cwd=cwd, env=env, start_new_session=True)
        os.close(slave)
        self.output = b""
        self.mark = 0
        assert self.wait_for(b"PROMPT> "), self.text

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait_for(self, token: bytes, timeout: float = 15.0) -> bool:
        """Read until ``token`` appears after the last mark; False on timeout."""
        deadline = time.monotonic() + timeout
        while token not in self.output[self.mark:]:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            try:
                self.output += os.read(self.master, 65536)
            except OSError:
                return False
        return True

    def run(self, line: str) -> None:
        self.mark = len(self.output)
        self.send(line.encode() + b"\n")

    def settle(self, seconds: float) -> bytes:
        """Everything printed in the next ``seconds``."""
        start = len(self.output)
        self.wait_for(b"\0never\0", timeout=seconds)
        return self.output[start:]

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def close(self) -> None:
        self.bash.kill()
        self.bash.wait(timeout=10)
        os.close(self.master)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Terminal]:
    term = Terminal(tmp_path)
    yield term
    term.close()


def test_ctrl_z_gives_the_shell_back_and_fg_resumes(terminal: Terminal) -> None:
    # "t""ick": the echo of the typed line must not count as the command's output
    terminal.run(f"{VRAMSCOPE} run -- sh -c 'while :; do echo \"t\"\"ick\"; sleep 0.2; done'")
    assert terminal.wait_for(b"tick"), terminal.text
    terminal.send(b"\x1a")  # Ctrl-Z
    assert terminal.wait_for(b"Stopped", timeout=5), terminal.text  # the whole job stopped...
    terminal.run("echo back-$((40+2))")
    assert terminal.wait_for(b"back-42", timeout=5), terminal.text  # ... and the prompt is ours again
    assert b"tick" not in terminal.settle(1.0)  # the command is stopped too, not running behind our back
    terminal.run("fg")
    assert terminal.wait_for(b"tick", timeout=5), terminal.text  # both resumed
    terminal.send(b"\x03")  # Ctrl-C
    assert terminal.wait_for(b"was killed by signal 2", timeout=10), terminal.text
    terminal.run("echo status-$?")
    assert terminal.wait_for(b"status-130", timeout=5), terminal.text


def test_ctrl_c_in_a_shell_loop_stops_the_loop(terminal: Terminal) -> None:
    terminal.run(f"for i in 1 2 3; do {VRAMSCOPE} run -- sh -c \"echo go-$i; exec sleep 4\"; done")
    assert terminal.wait_for(b"go-1"), terminal.text
    time.sleep(0.3)
    terminal.send(b"\x03")
    assert terminal.wait_for(b"PROMPT> ", timeout=10), terminal.text
    assert b"go-2" not in terminal.settle(1.5), terminal.text  # bash saw a death by SIGINT and left the loop
    terminal.run("echo status-$?")
    assert terminal.wait_for(b"status-130", timeout=5), terminal.text


@pytest.mark.skipif(shutil.which("less") is None, reason="needs less")
def test_a_pipeline_into_less_keeps_the_terminal(terminal: Terminal) -> None:
    terminal.run(f"{VRAMSCOPE} run --quiet -- seq 1 100000 | less")
    assert terminal.wait_for(b"\r\n2\r\n", timeout=15), terminal.text  # less shows the first lines
    assert b"Stopped" not in terminal.settle(1.0), terminal.text  # less was not stopped (SIGTTIN)
    terminal.mark = len(terminal.output)
    terminal.send(b"q")
    assert terminal.wait_for(b"PROMPT> ", timeout=10), terminal.text
    terminal.run("echo done-$((6*7))")
    assert terminal.wait_for(b"done-42", timeout=5), terminal.text
    assert b"Stopped" not in terminal.output
