"""Where a logged training step's monitor time goes: every call the step path makes, timed one by one.

``bench/overhead.py`` times each arm's hooks as a whole (about 1.3 ms a step on the H200 for
``MemoryMonitor.step``). This script takes that time apart in one process with a CUDA context and a
few GB allocated in many blocks (so the allocator's counters and NVML's process list are those of a
training process): each NVML query the GPU reading makes, the allocator's stats and peak reset, the
host reading, the CSV sink, and the whole ``MemoryMonitor.step``, each called ``--calls`` times with a
small kernel and a ``synchronize()`` between calls (as a step leaves the GPU). It also writes a
``cProfile`` of the step path. Nothing is asserted; everything goes to ``--out/hook_profile.json`` and
``hook_profile.txt``.

    python bench/hook_profile.py --out DIR [--calls 300]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common


def timed(fn: Callable[[], Any], calls: int, between: Callable[[], None]) -> dict[str, float]:
    """Median, p90 and mean microseconds of ``fn`` over ``calls`` calls, ``between`` run untimed before each."""
    seconds = []
    for _ in range(calls):
        between()
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    seconds.sort()
    return {
        "median_us": statistics.median(seconds) * 1e6,
        "p90_us": seconds[int(0.9 * (len(seconds) - 1))] * 1e6,
        "mean_us": statistics.fmean(seconds) * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--gib", type=float, default=4.0, help="GiB to hold in 64 MiB blocks during the timing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import pynvml
    import torch

    from vramscope import MemoryMonitor
    from vramscope.backends.nvml import MEMORY_V2, NvmlBackend
    from vramscope.backends.torch_allocator import TorchAllocatorBackend
    from vramscope.training.readers import ThisProcess

    if not torch.cuda.is_available():
        print("hook_profile: needs a CUDA GPU", file=sys.stderr)
        return 2
    held = [torch.empty(64 << 20, dtype=torch.uint8, device="cuda") for _ in range(int(args.gib * 16))]
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)

    def kernel() -> None:
        (a @ a).sum().item()

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    nvml = NvmlBackend()
    allocator = TorchAllocatorBackend(reset_peak=True)
    host = ThisProcess()
    pids = host.tree_pids()
    n = args.calls
    calls: dict[str, Callable[[], Any]] = {
        "nvml.count": pynvml.nvmlDeviceGetCount,
        "nvml.memory_v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=MEMORY_V2),
        "nvml.memory_v1": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle),
        "nvml.utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "nvml.uuid": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "nvml.name": lambda: pynvml.nvmlDeviceGetName(handle),
        "nvml.processes": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "NvmlBackend.read": nvml.read,
        "torch.memory_stats": lambda: torch.cuda.memory_stats(0),
        "torch.memory_stats_as_nested_dict": lambda: torch.cuda.memory.memory_stats_as_nested_dict(0),
        "torch.reset_peak_memory_stats": lambda: torch.cuda.reset_peak_memory_stats(0),
        "torch.mem_get_info": lambda: torch.cuda.mem_get_info(0),
        "TorchAllocatorBackend.read": allocator.read,
        "ThisProcess.read": lambda: host.read(pids),
    }
    results: dict[str, Any] = {name: timed(fn, n, kernel) for name, fn in calls.items()}

    with tempfile.TemporaryDirectory() as tmp:
        mon = MemoryMonitor(log=str(Path(tmp) / "steps.csv"), every_n_steps=1, warn=False)
        mon.start()
        step = iter(range(1, 10 * n))
        results["MemoryMonitor.step"] = timed(lambda: mon.step(next(step), tokens=4096), n, kernel)
        opened = mon._open  # what step() calls, part by part
        assert opened is not None
        sample = opened.collector.collect(step=0, phase="train")
        results["Collector.collect"] = timed(lambda: opened.collector.collect(step=0, phase="train"), n, kernel)
        results["Sampler.emit (CSV sink)"] = timed(lambda: opened.sampler.emit(sample), n, kernel)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(n):
            kernel()
            mon.step(next(step), tokens=4096)
        profile.disable()
        mon.close()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(40)
    (args.out / "hook_profile.txt").write_text(text.getvalue())
    out = {"benchmark": "hook_profile", "environment": common.environment(), "calls": n,
           "held_gib": args.gib, "held_blocks": len(held), "results": results}
    (args.out / "hook_profile.json").write_text(json.dumps(out, indent=1))
    for name, r in results.items():
        print(f"{name:40s} {r['median_us']:9.1f} us median  {r['p90_us']:9.1f} p90")
    return 0


if __name__ == "__main__":
    sys.exit(main())
