"""The foundation on a real GPU: NVML and torch's allocator read right, and `vramscope run` logs a
child's GPU memory that matches what nvidia-smi shows for that process. Run on the H200."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024

CHILD = """
import sys, time, torch
x = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_nvml_reads_the_real_gpu() -> None:
    import torch

    from vramscope.backends.nvml import NvmlBackend

    backend = NvmlBackend()
    gpus = backend.read()
    assert gpus, backend.init_error
    gpu = gpus[0]
    assert gpu.total_bytes is not None and gpu.used_bytes is not None and gpu.free_bytes is not None
    # NVML's total and torch's total are the same card; the driver's reserve is the only difference.
    assert abs(gpu.total_bytes - torch.cuda.get_device_properties(0).total_memory) < 2 * 1024**3
    assert gpu.uuid is not None and gpu.uuid.startswith("GPU-")
    assert gpu.utilization_pct is not None


def test_allocator_reading_is_exact() -> None:
    import torch

    from vramscope.backends.torch_allocator import TorchAllocatorBackend

    backend = TorchAllocatorBackend(devices=[0])
    before = backend.read()[0]
    x = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    y = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del y
    after = backend.read()[0]
    assert after.allocated_bytes - before.allocated_bytes == 256 * MIB
    assert after.peak_allocated_bytes is not None and after.peak_allocated_bytes >= before.allocated_bytes + 768 * MIB
    third = backend.read()[0]  # the peak was reset by the previous reading
    assert third.peak_allocated_bytes == third.allocated_bytes
    assert after.uuid is not None and after.uuid.startswith("GPU-")
    del x


def test_run_logs_child_gpu_memory_matching_nvidia_smi(tmp_path: Path) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not on PATH")
    log = tmp_path / "x.csv"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vramscope",
            "run",
            "--log",
            str(log),
            "--interval",
            "0.2",
            "--",
            sys.executable,
            str(script),
            "2048",
            "6",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    # the GPU may be shared (other runs beside the test): only the monitored command's own row is its memory
    ours = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    listing = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    smi_mib = {int(p): int(m) for p, m in (line.split(",") for line in listing.strip().splitlines() if line.strip())}
    with open(log, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["gpu"] == "0" and r["process_bytes"]]
    logged_peak = max(int(r["process_bytes"]) for r in rows)
    child_mib = [m for pid, m in smi_mib.items() if m >= 2048 and pid in ours]
    assert child_mib, f"nvidia-smi showed no process of 2 GiB or more among the command's {sorted(ours)}: {listing}"
    # nvidia-smi reports MiB; the log holds NVML's bytes for the same process.
    assert abs(logged_peak / MIB - child_mib[0]) <= 2, (logged_peak / MIB, child_mib)
    assert "peak of this command" in err
    print(f"logged {logged_peak / MIB:.0f} MiB, nvidia-smi {child_mib[0]} MiB")
