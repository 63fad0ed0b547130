"""`vramscope watch`: real runs without a GPU, and NVML scenarios patched in at the module boundary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import fake_nvml
from vramscope.backends import nvml as nvml_backend
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli import main
from vramscope.logs.reader import read_log
from vramscope.sampling.sampler import Collector
from vramscope.tui.dashboard import render
from vramscope.tui.text import snapshot_lines, sparkline


def test_without_a_gpu_it_says_so_shows_host_memory_and_exits_0() -> None:
    # This machine has no NVIDIA driver: the real path, no fake.
    result = subprocess.run([sys.executable, "-m", "vramscope", "watch"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stderr.startswith("vramscope: no NVIDIA GPU to watch")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "host memory: used" in result.stdout


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> fake_nvml.FakeNvml:
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: fake)
    return fake


def test_once_prints_every_gpu_and_its_processes(
    two_gpus: fake_nvml.FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", "--once"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0 NVIDIA H200: used 20.00 GiB / 141.00 GiB (14%), util 87%" in out
    assert "GPU 1 NVIDIA H200: used 2.00 GiB" in out
    assert f"pid {os.getpid():>7}" in out and "18.0 GiB" in out
    assert "host memory" in out


def test_plain_lines_without_a_tty_and_csv_log(
    two_gpus: fake_nvml.FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "w.csv"
    assert main(["watch", "--interval", "0.05", "--count", "3", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.count("GPU 0 NVIDIA H200") == 3
    table = read_log(log)
    assert table.ints("gpu") == [0, 1] * 3
    assert table.ints("device_used_bytes")[0] == 20 * fake_nvml.GIB


def test_gpu_selection(two_gpus: fake_nvml.FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "--once", "--devices", "1"]) == 0
    out = capsys.readouterr().out
    assert "GPU 1" in out and "GPU 0" not in out


def test_lost_gpu_is_shown_not_fatal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(nvml_backend, "_load_pynvml", fake_nvml.one_gpu_lost)
    assert main(["watch", "--once"]) == 0
    out = capsys.readouterr().out
    assert "GPU 1 ?: used ? / ?" in out and "GPU is lost" in out


def test_dashboard_renders_bars_sparkline_and_escapes_command_lines(tmp_path: Path) -> None:
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), name_processes=True)
    history = []
    for used in (10, 40, 80):
        fake.gpus[0].used = used * fake_nvml.GIB
        history.append(collector.collect())
    console = Console(width=140, record=True, force_terminal=False)
    console.print(render(history, 1.0))
    text = console.export_text()
    assert "80.0 GiB / 141.0 GiB" in text
    assert "87%" in text
    assert sparkline([10, 40, 80], top=141) in text
    # Our own command line (pytest's) is shown literally; markup in it would not be interpreted.
    assert "processes" in text


def test_sparkline_scales_and_marks_unknowns() -> None:
    assert sparkline([0, 50, 100]) == "▁▅█"
    assert sparkline([None, 100]) == " █"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(100)), width=30)) == 30


def test_snapshot_lines_handle_missing_fields() -> None:
    fake = fake_nvml.not_supported_fields()
    lines = snapshot_lines(Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend()).collect())
    assert any("util ?" in line and "not supported" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["watch", "--interval", "0"], "interval must be at least 0.05"),
        (["watch", "--devices", "a,b"], "GPU indices like 0,1"),
        (["watch", "--count", "0"], "positive number"),
        (["watch", "--log", "/nonexistent-dir/w.csv"], "does not exist"),
    ],
)
def test_bad_flags(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_double_dash_value_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse hands `--interval=--` an empty list instead of calling the flag's type (found by the fuzz test)
    from vramscope.cli import main

    assert main(["watch", "--interval=--", "--count", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--interval needs a value" in err
