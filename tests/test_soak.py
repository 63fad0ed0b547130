"""Soak: vramscope's own memory stays flat over a long run (bounded buffers, bounded caches).

A day at 20 Hz is 1.7 million samples, too many for a test. Instead the real Sampler, Collector, NVML
backend (over a fake NVML module), CSV sink with rotation, PeakTracker and Prometheus exporter take
``SAMPLES`` samples in a tight loop while an injected clock makes them span a simulated day (so
everything that depends on time sees a day, and everything that depends on the count sees far more
samples than any buffer holds). Memory is measured in a fresh child process, so that pytest's own
allocations do not blur it:

* RSS (psutil) at checkpoints: after warm-up it must stay within a small bound, and below an absolute one;
* tracemalloc over the last fifth: the memory it sees alive may not rise by more than a few bytes per
  sample, which any per-sample leak (a list that grows, a cache keyed by time or pid) exceeds many times.

The same is done for :class:`~vramscope.integrations.loop.MemoryMonitor` at every training step, plus
an exact measure of what the monitor holds (every object reachable from it) each time its history for
the analysis is full: it thins itself instead of growing.

What is faked, and why: NVML (no GPU here) and the host readings of ``HostBackend.read`` in the
sampler soak (psutil reads /proc, 0.4 ms a call on this machine, which alone would take the whole time
budget); process names go through the real psutil path, and the monitor reads the real host.
``VRAMSCOPE_SOAK_SAMPLES`` / ``VRAMSCOPE_SOAK_STEPS`` run them longer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent
SAMPLES = int(os.environ.get("VRAMSCOPE_SOAK_SAMPLES", "20000"))
TRACED = SAMPLES // 5  # the last fifth runs under tracemalloc (which makes each sample several times slower)
STEPS = int(os.environ.get("VRAMSCOPE_SOAK_STEPS", "2400"))
DAY_S = 86400.0

# Bounds. Flat means: after warm-up, RSS rises by less than RSS_GROWTH_BOUND in total, and the memory
# tracemalloc sees alive rises by less than a few bytes per sample. One leaked object per sample is
# more: a float is 24 bytes, a small tuple 56; a leaked log row of the monitor is several hundred.
# For the monitor, what it holds is measured exactly (every object reachable from it, at the points where
# its history is full); the tracemalloc bound is looser there because CPython's free lists (up to 2000
# tuples per size, counted by tracemalloc as live) still fill from the analysis' temporaries in a short run.
RSS_GROWTH_BOUND = 4 * 1024 * 1024
RSS_ABSOLUTE_BOUND = 100 * 1024 * 1024  # the sampler process alone (no torch imported)
LEAK_BYTES_PER_SAMPLE = 16.0
MONITOR_LEAK_BYTES_PER_STEP = 128.0
MONITOR_HELD_BYTES_PER_STEP = 16.0

SOAK = textwrap.dedent(
    """
    import collections, json, os, sys, tracemalloc
    import psutil
    sys.path.insert(0, sys.argv[1])
    import fake_nvml
    from vramscope.sampling.peaks import PeakTracker
    from vramscope.backends.host import HostBackend
    from vramscope.backends.nvml import NvmlBackend
    from vramscope.sampling.sampler import Collector, Sampler
    from vramscope.logs.sinks import CsvSink, log_parts
    from vramscope.exporters import PrometheusSink
    from vramscope.types import HostReading

    samples, traced_tail, out_dir, day = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
    me = psutil.Process()

    class Host(HostBackend):
        # psutil's /proc reads replaced by a counter; describe() (process names) stays real.
        n = 0
        def tree_pids(self):
            return frozenset({os.getpid()})
        def read(self, pids=None):
            self.n += 1
            return HostReading(rss_bytes=1_000_000 + self.n % 977, system_used_bytes=2 << 30,
                               system_total_bytes=8 << 30)

    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    fake.calls = collections.deque(maxlen=64)  # the fake's own call record must not be what grows
    now = [1.7e9]
    def clock():
        now[0] += day / samples  # the run spans a simulated day
        return now[0]

    csv = CsvSink(os.path.join(out_dir, "soak.csv"), max_bytes=1 << 20)
    exporter = PrometheusSink("127.0.0.1:0")
    collector = Collector(nvml=NvmlBackend(nvml=fake), host=Host(), name_processes=True, clock=clock)
    sampler = Sampler(collector, [csv, PeakTracker(), exporter], interval=0.05)

    rss, traced = [], []
    trace_from = samples - traced_tail
    for i in range(samples):
        if i % 100 == 0:  # processes come and go on the GPU (dataloader workers, other jobs)
            fake.gpus[1].processes = {100_000 + i: (i % 7) << 20}
        if i % 5000 == 0:
            exporter.exposition()  # a scrape
        if i <= trace_from and i % (samples // 20) == 0:
            rss.append((i, me.memory_info().rss))  # before tracing, which costs memory itself
        if i == trace_from:
            tracemalloc.start(1)
        if i >= trace_from and (i - trace_from) % (traced_tail // 30) == 0:
            traced.append((i - trace_from, tracemalloc.get_traced_memory()[0]))
        sampler.sample_now()
    traced.append((traced_tail, tracemalloc.get_traced_memory()[0]))
    tracemalloc.stop()
    sampler.close()
    exporter.close()
    parts = log_parts(os.path.join(out_dir, "soak.csv"))
    # Imported only now: the reader (pyarrow) is no part of a sampling process, whose RSS is measured above.
    from vramscope.logs.reader import read_log
    table = read_log(parts[0])
    print(json.dumps({
        "rss": rss, "traced": traced, "samples_taken": sampler.samples_taken, "history": len(sampler.history),
        "simulated_s": now[0] - 1.7e9, "parts": len(parts), "rows": len(table),
        "last_elapsed_s": table.floats("elapsed_s")[-1],
    }))
    """
)

MONITOR_SOAK = textwrap.dedent(
    """
    import collections, json, os, sys, tracemalloc
    import psutil
    sys.path.insert(0, sys.argv[1])
    import fake_nvml
    from vramscope.integrations.loop import MemoryMonitor

    import gc, types
    steps, history, out_dir = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    me = psutil.Process()
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    fake.calls = collections.deque(maxlen=64)

    def deep_size(root):
        # Bytes of every object reachable from the monitor (its rows, sinks, backends, alerts), shared
        # code and classes left out: exactly what the monitor holds, free of allocator caches.
        seen, stack, total = set(), [root], 0
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                                   types.BuiltinFunctionType)):
                continue
            seen.add(id(obj))
            total += sys.getsizeof(obj)
            stack.extend(gc.get_referents(obj))
        return total

    rss, traced, held, full = [], [], [], []
    with MemoryMonitor(log=os.path.join(out_dir, "steps.csv"), nvml=fake, warn=False, history=history,
                       analyze_min_interval_s=0.0, analyze_every=100) as mon:
        tracemalloc.start(1)
        for step in range(1, steps + 1):
            if step % (steps // 60) == 0:
                rss.append((step, me.memory_info().rss))
                traced.append((step, tracemalloc.get_traced_memory()[0]))
                held.append(mon.rows_held())
            mon.step(step, tokens=512 + step % 64)
            if mon.rows_held() >= mon.settings.history:  # the history is full: it thins at the next row
                full.append((step, deep_size(mon)))
        tracemalloc.stop()
    print(json.dumps({"rss": rss, "traced": traced, "full": full, "rows_logged": mon.rows_logged,
                      "rows_held": max(held), "history": mon.settings.history}))
    """
)


def run_soak(script: str, *args: str, timeout: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def growth_after(series: list[list[int]], warmup: int, until: int | None = None) -> tuple[int, int]:
    """(how far the series rises above its warm-up peak, over how many samples) for ``(i, bytes)`` points.

    A bounded structure (the sampler's deque, the monitor's history thinned when full) reaches its
    largest size by the end of warm-up and stays at or below it; a leak climbs past it by its rate
    times the samples after warm-up.
    """
    before = [b for i, b in series if i <= warmup]
    after = [(i, b) for i, b in series if warmup < i <= (until if until is not None else i)]
    assert len(before) >= 2 and len(after) >= 5, series
    return max(b for _, b in after) - max(before), after[-1][0] - warmup


@pytest.mark.slow
def test_sampler_memory_is_flat_over_a_simulated_day_at_20hz(tmp_path: Path) -> None:
    result = run_soak(SOAK, str(SAMPLES), str(TRACED), str(tmp_path), str(DAY_S), timeout=300)
    rss_growth, _ = growth_after(result["rss"], SAMPLES // 5)
    assert rss_growth < RSS_GROWTH_BOUND, result["rss"]
    assert max(b for _, b in result["rss"]) < RSS_ABSOLUTE_BOUND
    # Traced from the start of the tail: after 1000 samples the deque (600) holds only traced samples.
    held, span = growth_after(result["traced"], 1000)
    per = held / span
    assert per < LEAK_BYTES_PER_SAMPLE, result["traced"]
    assert result["samples_taken"] == SAMPLES
    assert result["history"] == 600  # the sampler's history is a bounded deque
    tick = DAY_S / SAMPLES
    assert abs(float(result["simulated_s"]) - DAY_S) <= 3 * tick  # the clock also ticks at start
    # Every sample reached the rotated log (2 GPUs -> 2 rows each), which reads back whole.
    assert result["rows"] == 2 * SAMPLES
    assert int(result["parts"]) > 5
    assert float(result["last_elapsed_s"]) > DAY_S - 3 * tick
    print(
        f"soak: {SAMPLES} samples over a simulated day; RSS {max(b for _, b in result['rss']) / 2**20:.1f} MiB, "
        f"growth after warm-up {rss_growth / 2**20:.2f} MiB; traced growth {held} bytes over {span} samples "
        f"({per:.2f} bytes/sample); {result['parts']} log parts"
    )


@pytest.mark.slow
def test_memory_monitor_history_stays_bounded_over_many_steps(tmp_path: Path) -> None:
    pytest.importorskip("vramscope.integrations.loop")
    # A small history (the default is 8192 rows) so that a few thousand steps see it fill and thin
    # itself several times (its archive doubles its stride each time): the code path is the same.
    result = run_soak(MONITOR_SOAK, str(STEPS), "512", str(tmp_path), timeout=300)
    # (step, bytes the monitor holds) each time its history was full, after warm-up (its first analyses
    # and first fills): every such point holds the same number of rows, so what the monitor holds may
    # not grow from one to the next by more than a few bytes per step (a leaked log row is hundreds).
    full = [(i, b) for i, b in result["full"] if i > STEPS // 3]
    assert len({i // 100 for i, _ in full}) >= 2, result["full"]  # at least two separate fills
    (first_step, first), (last_step, last) = full[0], full[-1]
    per_step = (last - first) / (last_step - first_step)
    assert per_step < MONITOR_HELD_BYTES_PER_STEP, result["full"]
    # Everything else (module caches, the analysis) seen by tracemalloc and RSS: a looser bound.
    third = STEPS // 3
    first_part = max(b for i, b in result["traced"] if third < i <= 2 * third)
    traced = (max(b for i, b in result["traced"] if i > 2 * third) - first_part) / third
    assert traced < MONITOR_LEAK_BYTES_PER_STEP, result["traced"]
    rss_growth, _ = growth_after(result["rss"], third)
    assert rss_growth < RSS_GROWTH_BOUND, result["rss"]
    assert result["rows_logged"] >= STEPS
    assert result["rows_held"] <= result["history"]
    print(
        f"monitor soak: {STEPS} steps, history {result['history']} rows, full {len(full)} times; the monitor "
        f"held {first} bytes at step {first_step} and {last} at step {last_step}; tracemalloc growth "
        f"{traced:.1f} bytes/step; RSS growth {rss_growth / 2**20:.2f} MiB"
    )
