"""`vramscope watch --once --json` (issue 16, item 5): one JSON object per reading, through the NVML
scenario fakes at the hardware boundary and, for the machine's own answer, a real child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from vramscope.backends import nvml as nvml_backend
from vramscope.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
GIB = fake_nvml.GIB


def watch_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], nvml: Any,
               *args: str) -> list[dict[str, Any]]:
    monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: nvml)
    assert main(["watch", "--json", *args]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines and all(line.startswith("{") for line in lines), out  # JSON Lines: one object a line
    return [json.loads(line) for line in lines]


def test_once_prints_one_object_with_every_gpu_its_processes_and_host_memory(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    [snapshot] = watch_json(monkeypatch, capsys, fake_nvml.two_healthy_gpus(pid=os.getpid()), "--once")
    assert snapshot["schema_version"] == 1
    assert snapshot["time"].endswith("+00:00") and isinstance(snapshot["unix_time"], float)
    assert snapshot["nvml_error"] is None
    gpu0, gpu1 = snapshot["gpus"]
    assert (gpu0["index"], gpu0["name"], gpu0["used_bytes"], gpu0["total_bytes"]) == (0, "NVIDIA H200", 20 * GIB,
                                                                                       141 * GIB)
    assert gpu0["utilization_pct"] == 87 and gpu0["uuid"] and gpu0["error"] is None
    assert gpu0["processes_known"] is True
    [mine] = [p for p in gpu0["processes"] if p["pid"] == os.getpid()]
    assert mine["gpu_bytes"] == 18 * GIB and mine["name"] and mine["cmdline"]
    assert gpu1["index"] == 1 and gpu1["used_bytes"] == 2 * GIB
    host = snapshot["host"]
    assert host["system_total_bytes"] > host["system_used_bytes"] > 0


def test_a_lost_gpu_is_listed_with_unknown_readings_and_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    [snapshot] = watch_json(monkeypatch, capsys, fake_nvml.one_gpu_lost(), "--once")
    lost = snapshot["gpus"][1]
    assert lost["used_bytes"] is None and lost["total_bytes"] is None  # unknown, never a fake 0
    assert "lost" in lost["error"].lower()
    assert snapshot["gpus"][0]["used_bytes"] is not None


@pytest.mark.parametrize("scenario", [fake_nvml.not_supported_fields, fake_nvml.old_driver_without_v2])
def test_fields_the_driver_cannot_give_are_null(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], scenario: Any
) -> None:
    [snapshot] = watch_json(monkeypatch, capsys, scenario(), "--once")
    for gpu in snapshot["gpus"]:
        assert set(gpu) >= {"index", "used_bytes", "total_bytes", "free_bytes", "driver_reserved_bytes",
                            "utilization_pct", "processes", "processes_known", "error"}
    assert any(value is None for gpu in snapshot["gpus"] for value in gpu.values())


def test_without_a_driver_the_object_says_why_and_stdout_stays_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(nvml_backend, "_load_pynvml", fake_nvml.no_driver)
    assert main(["watch", "--once", "--json"]) == 0
    captured = capsys.readouterr()
    snapshot = json.loads(captured.out)
    assert snapshot["gpus"] == [] and snapshot["nvml_error"]
    assert captured.err.startswith("vramscope: no NVIDIA GPU to watch")


def test_count_prints_one_object_per_reading(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    snapshots = watch_json(monkeypatch, capsys, fake_nvml.two_healthy_gpus(pid=os.getpid()), "--count", "3",
                           "--interval", "0.05")
    assert len(snapshots) == 3
    assert snapshots[0]["unix_time"] < snapshots[1]["unix_time"] < snapshots[2]["unix_time"]


def test_hostile_command_lines_stay_inert_in_the_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "\x1b[2J", "x\ny", "\u202e"])
    try:
        import time

        import psutil

        deadline = time.monotonic() + 10
        while len(psutil.Process(proc.pid).cmdline()) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(processes={proc.pid: GIB})])
        monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: fake)
        assert main(["watch", "--once", "--json"]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\u202e" not in out and out.count("\n") == 1
        [entry] = json.loads(out)["gpus"][0]["processes"]
        assert "\x1b[2J" in entry["cmdline"] and "x\ny" in entry["cmdline"]  # the data itself, unchanged
    finally:
        proc.kill()
        proc.wait()


def test_the_real_cli_on_this_machine_prints_one_object() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    result = subprocess.run([sys.executable, "-m", "vramscope", "watch", "--once", "--json"], capture_output=True,
                            text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["schema_version"] == 1 and isinstance(snapshot["gpus"], list)
    assert snapshot["host"]["system_total_bytes"] > 0
