"""What the command inherits and how it is started, as a shell would exec it (issue 24, items 3, 10, 11, 12, 13).

Each test runs the real CLI (through bash where the shell's redirections are the point) and, where it
makes sense, the same command without vramscope, so the plain behaviour is pinned beside ours:

* descriptors above 2 stay open in the command (`3>f`), vramscope's own (the log) do not leak into it;
* exec errors keep the shell's codes: 126 for a directory or a file without the x bit, 127 for a bad
  `#!` interpreter; a script without `#!` runs with /bin/sh;
* nothing of vramscope's goes to stdout (`> out.txt 2>&-`); with stderr closed it is dropped, and the
  command starts with descriptor 2 closed, as it would;
* argv[0] is the name as typed; SIGPIPE and SIGXFSZ start at their defaults, as a shell gives them;
* `--prometheus` on every interface, in every spelling, warns;
* `--oom-snapshot` leaves no empty folder behind.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope.exporters.http import binds_every_interface

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parent.parent / "src")
VRAMSCOPE = f"{PYTHON} -m vramscope"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    env["PYTHONPATH"] = SRC
    return env


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=user_env(), capture_output=True, text=True,
                          timeout=120)


# -- 3. inherited descriptors ---------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", f"{VRAMSCOPE} run --quiet -- "], ids=["plain", "vramscope"])
def test_descriptors_above_2_are_inherited(prefix: str, tmp_path: Path) -> None:
    result = bash(f"{prefix}bash -c 'echo hi >&3; echo there >&7' 3>f 7>g", tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "f").read_text() == "hi\n" and (tmp_path / "g").read_text() == "there\n"


def test_vramscopes_own_descriptors_do_not_leak_into_the_command(tmp_path: Path) -> None:
    show = f"{PYTHON} -c 'import os; print(sorted(int(n) for n in os.listdir(\"/proc/self/fd\")))'"
    plain = bash(f"{show} 3<&0", tmp_path)
    under = bash(f"{VRAMSCOPE} run --quiet --log m.csv -- {show} 3<&0", tmp_path)
    assert under.returncode == 0, under.stderr
    # The listing's own descriptor is the one above 3 in both: the log (and NVML's, the tty) are not there.
    assert json.loads(under.stdout) == json.loads(plain.stdout), (plain.stdout, under.stdout)


# -- 10. exec errors keep the shell's codes -------------------------------------------------------------

@pytest.mark.parametrize(
    ("setup", "program", "code", "message"),
    [
        ("mkdir d", "./d", 126, "is a directory"),
        ("printf 'echo hi\\n' > nx", "./nx", 126, "not an executable file"),
        ("printf '#!/nonexistent/interp\\necho hi\\n' > bad && chmod +x bad", "./bad", 127, "bad interpreter"),
        (":", "surely-not-a-program-xyz", 127, "command not found"),
        ("printf 'ELF\\0\\1\\2\\n' > blob && chmod +x blob", "./blob", 126, "cannot execute binary file"),
    ],
    ids=["directory", "not-executable", "bad-interpreter", "not-found", "foreign-binary"],
)
def test_exec_errors_keep_the_shells_exit_codes(setup: str, program: str, code: int, message: str,
                                                tmp_path: Path) -> None:
    assert bash(setup, tmp_path).returncode == 0
    plain = bash(program, tmp_path)
    under = bash(f"{VRAMSCOPE} run -- {program}", tmp_path)
    assert plain.returncode == under.returncode == code, (plain.stderr, under.stderr)
    assert message in under.stderr and len(under.stderr.strip().splitlines()) == 1, under.stderr


@pytest.mark.parametrize("prefix", ["", f"{VRAMSCOPE} run --quiet -- "], ids=["plain", "vramscope"])
def test_a_script_without_a_shebang_runs_with_sh(prefix: str, tmp_path: Path) -> None:
    (tmp_path / "nos").write_text('echo "args: $1 $2"\nexit 3\n')
    (tmp_path / "nos").chmod(0o755)
    result = bash(f"{prefix}./nos a b", tmp_path)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "args: a b\n"


# -- 11. nothing of vramscope's on stdout ---------------------------------------------------------------

def test_the_summary_never_lands_in_the_commands_stdout(tmp_path: Path) -> None:
    result = bash(f"{VRAMSCOPE} run -- sh -c 'echo out' > out.txt 2>&-; echo $? > code", tmp_path)
    assert (tmp_path / "out.txt").read_text() == "out\n", result.stderr  # the summary was dropped, not moved
    assert (tmp_path / "code").read_text() == "0\n"
    with_stderr = bash(f"{VRAMSCOPE} run -- sh -c 'echo out' > out2.txt", tmp_path)
    assert (tmp_path / "out2.txt").read_text() == "out\n"
    assert "exited with 0" in with_stderr.stderr  # the summary is on stderr when there is one


def test_an_error_with_stderr_closed_is_dropped_not_printed_to_stdout(tmp_path: Path) -> None:
    bash(f"{VRAMSCOPE} run -- surely-not-a-program-xyz > out.txt 2>&-; echo $? > code", tmp_path)
    assert (tmp_path / "out.txt").read_text() == ""
    assert (tmp_path / "code").read_text() == "127\n"


@pytest.mark.parametrize("prefix", ["", f"{VRAMSCOPE} run --quiet -- "], ids=["plain", "vramscope"])
def test_the_command_starts_with_stderr_closed_as_the_caller_left_it(prefix: str, tmp_path: Path) -> None:
    probe = f"{PYTHON} -c 'import os, sys; print(\"closed\" if sys.stderr is None else \"open\")'"
    result = bash(f"{prefix}{probe} > out.txt 2>&-", tmp_path)
    assert result.returncode == 0
    assert (tmp_path / "out.txt").read_text() == "closed\n"


def test_json_is_the_only_thing_on_stdout(tmp_path: Path) -> None:
    result = bash(f"{VRAMSCOPE} run --json -- sh -c 'echo out' > out.txt", tmp_path)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[0] == "out" and len(lines) == 2, result.stderr
    assert json.loads(lines[1])["exit_code"] == 0


# -- 12. argv[0] and the signals Python resets ----------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", f"{VRAMSCOPE} run --quiet -- "], ids=["plain", "vramscope"])
def test_argv0_is_the_name_as_typed(prefix: str, tmp_path: Path) -> None:
    result = bash(f"{prefix}cat /proc/self/cmdline", tmp_path)
    assert result.stdout.split("\0")[0] == "cat", result.stdout


@pytest.mark.parametrize("prefix", ["", f"{VRAMSCOPE} run --quiet -- "], ids=["plain", "vramscope"])
def test_sigpipe_and_sigxfsz_start_at_the_shells_default(prefix: str, tmp_path: Path) -> None:
    # SigIgn in /proc: the mask of ignored signals the command started with (SIGPIPE is 13, SIGXFSZ 25).
    probe = "awk '/^SigIgn/ {print $2}' /proc/self/status"
    result = bash(f"{prefix}{probe}", tmp_path)
    ignored = int(result.stdout.strip(), 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1)), result.stdout
    # A pipe whose reader left ends the writer by SIGPIPE, as without vramscope (141 in the pipeline).
    piped = bash(f"{prefix}yes | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}", tmp_path)
    assert piped.stdout.strip().splitlines()[-1] == "141", piped.stderr


# -- 13. every interface, in every spelling -------------------------------------------------------------

@pytest.mark.parametrize("host", ["0", "0.0", "0.0.0.0", "000.0.0.0", "0x0", "::", "::0", "0:0::", "[::]", "[::0]", ""])
def test_every_spelling_of_the_unspecified_address_is_every_interface(host: str) -> None:
    assert binds_every_interface(host)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1", "localhost", "::1", "[::1]", "10.0.0.1", "192.168.1.1"])
def test_a_single_address_is_not_every_interface(host: str) -> None:
    assert not binds_every_interface(host)


def _ipv6_works() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("address", ["0:0", "0.0:0", "0.0.0.0:0", "[::0]:0", "[::]:0", "127.0.0.1:0", "0"])
def test_run_warns_when_prometheus_binds_every_interface(address: str, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    if address.startswith("[") and not _ipv6_works():
        pytest.skip("no IPv6 here")
    result = bash(f"{VRAMSCOPE} run --quiet --prometheus '{address}' -- true", tmp_path)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "can be read by anyone" in line]
    every = address.rpartition(":")[0] not in ("127.0.0.1", "")
    assert len(warned) == (1 if every else 0), result.stderr


# -- issue 25: no empty OOM folder ----------------------------------------------------------------------

def test_oom_snapshot_leaves_no_empty_folder_it_created(tmp_path: Path) -> None:
    result = bash(f"{VRAMSCOPE} run --oom-snapshot oomdir -- true", tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "oomdir").exists()
    assert "oomdir" not in result.stderr  # the summary names only what was written
    (tmp_path / "mine").mkdir()  # a folder the user made is theirs, empty or not
    assert bash(f"{VRAMSCOPE} run --quiet --oom-snapshot mine -- true", tmp_path).returncode == 0
    assert (tmp_path / "mine").is_dir()


def test_oom_snapshot_folder_with_a_post_mortem_is_kept_and_named(tmp_path: Path) -> None:
    result = bash(f"{VRAMSCOPE} run --oom-snapshot oomdir -- sh -c 'echo x > \"$VRAMSCOPE_OOM_SNAPSHOT/r.txt\"'",
                  tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "oomdir" / "r.txt").read_text() == "x\n"
    assert "wrote:" in result.stderr and "oomdir" in result.stderr
