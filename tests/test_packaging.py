"""The package as people install it: a wheel built without warnings, with the metadata an index shows."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_builds_without_warnings_and_says_what_it_needs(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    noise = [line for line in (built.stdout + built.stderr).splitlines()
             if "Warning" in line or "deprecated" in line.lower()]
    noise = [line for line in noise if "Location 'file://" not in line]  # the machine's pip index config
    assert not noise, noise
    wheel = next(tmp_path.glob("vramscope-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        names = archive.namelist()
    assert "License-Expression: Apache-2.0" in meta
    assert "Classifier: Operating System :: POSIX :: Linux" in meta
    assert "Classifier: Programming Language :: Python :: 3.12" in meta
    bnb = next(line for line in meta.splitlines() if line.startswith("Requires-Dist: bitsandbytes"))
    assert "aarch64" in bnb and "x86_64" in bnb  # GH200 users keep QLoRA
    all_extra = [line for line in meta.splitlines() if 'extra == "all"' in line]
    assert all_extra and not any(tool in line for line in all_extra for tool in ("pytest", "ruff", "mypy"))
    assert any(n.endswith("run/_sitecustomize/sitecustomize.py") for n in names)  # the start-up hook ships
    assert any(n.endswith("planner/models.json") for n in names)
