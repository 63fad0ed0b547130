"""`watch --log FILE` keeps an earlier watch's file unless --overwrite says to replace it (as `run --log` does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")


def watch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "vramscope", "watch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_existing_csv_is_refused_and_kept(tmp_path: Path) -> None:
    old = tmp_path / "gpu.csv"
    old.write_text("time,gpu,device_used_bytes\n2026-12-01T00:00:00,0,1024\n")
    before = old.read_bytes()
    done = watch("--log", str(old), "--count", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"vramscope: error: {old} already exists; give a new name, e.g. --log {tmp_path / 'gpu-2.csv'}, "
        "or add --overwrite to replace it"]
    assert old.read_bytes() == before


def test_overwrite_replaces_it(tmp_path: Path) -> None:
    old = tmp_path / "gpu.csv"
    old.write_text("time,gpu,device_used_bytes\n2026-12-01T00:00:00,0,1024\n")
    done = watch("--log", str(old), "--count", "1", "--overwrite", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "2026-12-01T00:00:00" not in old.read_text()
