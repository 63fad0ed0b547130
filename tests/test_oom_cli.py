"""``vramscope run --oom-snapshot [DIR]`` hands the folder to the command through VRAMSCOPE_OOM_SNAPSHOT."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from vramscope.cli import main
from vramscope.oom import ENV_VAR, OomRecorder, snapshot_env

CHILD = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('VRAMSCOPE_OOM_SNAPSHOT', '<unset>'))"


def run_child(tmp_path: Path, *flags: str) -> tuple[int, str]:
    seen = tmp_path / "seen.txt"
    code = main(["run", "--quiet", "--no-inject", *flags, "--", sys.executable, "-c", CHILD, str(seen)])
    return code, seen.read_text() if seen.exists() else ""


def test_the_folder_reaches_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, seen = run_child(tmp_path, "--oom-snapshot", "post-mortems")
    assert code == 0
    assert seen == str(tmp_path / "post-mortems")  # absolute: the child may change directory
    # Created for the command, and removed after it since nothing was written there (issue 25).
    assert not (tmp_path / "post-mortems").exists()


def test_without_a_folder_it_goes_beside_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, seen = run_child(tmp_path, "--log", "mem.csv", "--oom-snapshot")
    assert code == 0
    assert seen == str(tmp_path / "mem.oom")


def test_without_the_flag_nothing_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    code, seen = run_child(tmp_path)
    assert (code, seen) == (0, "<unset>")


def test_a_file_in_the_way_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("")
    code = main(["run", "--oom-snapshot", str(blocker), "--", sys.executable, "-c", "pass"])
    err = capsys.readouterr().err
    assert code == 2
    assert "is a file; give a folder" in err
    assert len(err.strip().splitlines()) == 1


def test_snapshot_env_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert snapshot_env("") == {ENV_VAR: str(tmp_path / "vramscope-oom")}
    assert snapshot_env(None, "logs/run.jsonl") == {ENV_VAR: str(tmp_path / "logs" / "run.oom")}
    # what the child does with it
    recorder = OomRecorder.from_env(environ=snapshot_env("x"))
    assert recorder is not None and recorder.out_dir == tmp_path / "x"
