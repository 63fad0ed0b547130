"""Soak through `vramscope run`: a simulated day at 10 Hz (864,000 samples) with log rotation.

The real ``run_monitored`` (the function behind ``vramscope run``) starts a real child process and
samples it on its real sampler thread through the real NVML backend (over the fake NVML module of
``tests/fake_nvml.py``: two GPUs, processes coming and going), the CSV sink rotating at
``--max-log-mb``, the peak tracker and a Prometheus exporter that is scraped now and then. Time is
compressed as in ``tests/test_soak.py``: the collector's clock advances by a day / samples per sample,
and the sampler runs with no pause between samples (``fast=True``), so the day takes minutes. Host
readings are a counter (psutil's /proc reads would take most of the time, as in the sampler soak).

Measured, in this process (which is the monitor):

* rows in (samples taken x GPUs) and rows out (every line of every part of the rotated log, each
  checked to be a whole row), which must be equal;
* RSS at 50 points over the run: its growth after the first tenth (warm-up) is the figure for "flat".

Writes a JSON result with the environment (device, versions, date) to ``--json``.
Usage: ``python bench/soak_run.py [--samples 864000] [--max-log-mb 16] [--json bench/results/soak_run_day.json]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # fake_nvml
sys.path.insert(0, str(REPO / "bench"))  # common

import fake_nvml  # noqa: E402
from vramscope.backends.host import HostBackend  # noqa: E402
from vramscope.backends.nvml import NvmlBackend  # noqa: E402
from vramscope.logs.sinks import log_parts  # noqa: E402
from vramscope.run.runner import run_monitored  # noqa: E402
from vramscope.sampling.sampler import Collector  # noqa: E402
from vramscope.types import HostReading  # noqa: E402

DAY_S = 86400.0
RATE_HZ = 10
GPUS = 2

# The child: waits until the harness says the day is over (a file appears), then exits 0.
CHILD = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)\n"


class CountingHost(HostBackend):
    """The child's process tree as it is, with the host readings replaced by a counter."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.n = 0

    def tree_pids(self) -> frozenset[int]:
        return frozenset({self.root_pid})

    def read(self, pids: frozenset[int] | None = None) -> HostReading:
        self.n += 1
        return HostReading(rss_bytes=1_000_000 + self.n % 977, system_used_bytes=2 << 30, system_total_bytes=8 << 30)


def soak(samples: int, out_dir: Path, max_log_mb: int) -> dict[str, Any]:
    """Run the simulated day; returns what was counted and measured."""
    from vramscope.exporters import PrometheusSink

    log = out_dir / "soak.csv"
    stop = out_dir / "stop"
    fake = fake_nvml.two_healthy_gpus()
    fake.calls = collections.deque(maxlen=64)  # type: ignore[assignment]  # the fake's record must not grow
    exporter = PrometheusSink("127.0.0.1:0")
    me = psutil.Process()
    taken = [0]
    rss: list[tuple[int, int]] = []
    now = [1.7e9]

    def clock() -> float:
        taken[0] += 1
        count = taken[0]
        if count % 100 == 0:  # processes come and go on the GPU (dataloader workers, other jobs)
            fake.gpus[1].processes = {100_000 + count: (count % 7) << 20}
        if count % 50_000 == 0:
            exporter.exposition()  # a scrape
        if count == samples:
            stop.touch()  # the day is over: the child exits
        now[0] += DAY_S / samples
        return now[0]

    def collector(pid: int, backend: NvmlBackend) -> Collector:
        fake.gpus[0].processes = {pid: 3 << 30}
        return Collector(nvml=backend, host=CountingHost(pid), clock=clock)

    done = threading.Event()

    def measure() -> None:
        every = max(1, samples // 50)
        next_at = 0
        while not done.is_set():
            if taken[0] >= next_at:
                rss.append((taken[0], me.memory_info().rss))
                next_at = taken[0] + every
            done.wait(0.02)

    watcher = threading.Thread(target=measure, daemon=True)
    started = time.monotonic()
    watcher.start()
    result = run_monitored(
        [sys.executable, "-c", CHILD, str(stop)],
        log_path=str(log),
        interval=0.0,
        nvml=NvmlBackend(nvml=fake),
        extra_sinks=[exporter],
        max_log_bytes=max_log_mb << 20,
        collector=collector,
        fast=True,
    )
    wall_s = time.monotonic() - started
    done.set()
    watcher.join()
    rss.append((taken[0], me.memory_info().rss))

    rows_out, torn, parts = 0, 0, log_parts(log)
    width = None
    for part in parts:
        with open(part, "rb") as handle:
            header = handle.readline()
            width = header.count(b",") if width is None else width
            for line in handle:
                rows_out += 1
                if not line.endswith(b"\r\n") or line.count(b",") != width:
                    torn += 1
    warm = [value for count, value in rss if count >= samples // 10]
    return {
        "samples_asked": samples,
        "samples_taken": result.peaks.samples,
        "collector_reads": taken[0],
        "simulated_s": round(now[0] - 1.7e9, 1),
        "rate_hz_simulated": round(result.peaks.samples / (now[0] - 1.7e9), 3),
        "gpus": GPUS,
        "rows_in": result.peaks.samples * GPUS,
        "rows_out": rows_out,
        "torn_rows": torn,
        "log_parts": len(parts),
        "log_bytes": sum(os.path.getsize(p) for p in parts),
        "max_log_mb": max_log_mb,
        "exit_code": result.exit_code,
        "left_behind": result.left_behind,
        "wall_s": round(wall_s, 1),
        "rss_bytes": rss,
        "rss_after_warmup_min_bytes": min(warm) if warm else None,
        "rss_after_warmup_max_bytes": max(warm) if warm else None,
        "rss_growth_after_warmup_bytes": (warm[-1] - warm[0]) if warm else None,
        "rss_peak_bytes": max(value for _, value in rss),
    }


def _environment() -> dict[str, Any]:
    """bench/common.environment() without torch's part: the soak imports no torch (and importing it
    would take longer than the soak)."""
    import platform
    from datetime import datetime, timezone

    import common

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": {"kind": "cpu", "name": common.cpu_model(), "gpus": "fake NVML (tests/fake_nvml.py), 2 GPUs"},
        "host": {"cpu_count": os.cpu_count(), "memory_total_bytes": int(psutil.virtual_memory().total),
                 "platform": platform.platform()},
        "python": sys.version.split()[0],
        "versions": common.package_versions(),
        "vramscope_commit": common.git_commit(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=int(DAY_S * RATE_HZ), help="samples (default: a day at 10 Hz)")
    parser.add_argument("--max-log-mb", type=int, default=16, help="rotate the log at this size")
    parser.add_argument("--json", type=Path, help="write the result (with the environment) here")
    parser.add_argument("--keep", type=Path, help="write the log here instead of a temporary folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vramscope-soak-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        measured = soak(args.samples, folder, args.max_log_mb)
    payload: dict[str, Any] = {"benchmark": "soak_run", "result": measured}
    if args.json is not None:
        payload["environment"] = _environment()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    summary = {k: v for k, v in measured.items() if k != "rss_bytes"}
    print(json.dumps(summary, indent=1))
    return 0 if measured["rows_in"] == measured["rows_out"] and not measured["torn_rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
