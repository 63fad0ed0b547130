"""Logs for the report tests, written by vramscope's own sampling code.

The only fakes stand at the hardware boundary: NVML (the scenario module ``fake_nvml``) and torch's
allocator (an object whose ``read()`` returns what ``torch.cuda.memory_stats`` would). Everything
after them is the real path: ``Collector`` -> ``Sampler`` -> ``CsvSink``/``JsonlSink`` -> file. The
memory follows a QLoRA run on a 24 GB card: a constant base (4-bit weights, LoRA, optimizer state),
a per-step peak that grows with the batch's tokens, eval phases that peak higher, an allocator cache
that only grows, and optionally a planted leak.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import fake_nvml
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.csv_sink import CsvSink
from vramscope.logs.reader import read_log
from vramscope.logs.sinks import log_sink
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.types import AllocatorReading

GIB = 1024**3
MIB = 1024**2
CONTEXT = 560 * MIB  # CUDA context and library workspaces: on the device, outside torch's counters


class FakeAllocator:
    """torch's caching allocator at its boundary: the readings ``torch.cuda.memory_stats`` would give."""

    def __init__(self) -> None:
        self.readings: tuple[AllocatorReading, ...] = ()

    def read(self) -> tuple[AllocatorReading, ...]:
        return self.readings


@dataclass
class Run:
    steps: int = 600
    gpus: int = 1
    capacity: int = 24 * GIB
    base: int = 5 * GIB + 300 * MIB
    bytes_per_token: int = 1 * MIB
    leak_per_step: int = 0
    leak_from: int = 0
    eval_every: int = 200
    eval_steps: int = 20
    eval_extra: int = 3 * GIB
    eval_phase: str = "eval"
    seconds_per_step: float = 0.8
    seed: int = 0


def write_training_log(path: Path, run: Run | None = None) -> Path:
    """A step-aligned log of ``run`` at ``path`` (.csv or .jsonl), one sample per step."""
    run = run or Run()
    rng = random.Random(run.seed)
    gpus = [fake_nvml.FakeGpu(name="NVIDIA GeForce RTX 4090", total=run.capacity, used=CONTEXT, reserved=0, util=0)
            for _ in range(run.gpus)]
    nvml = fake_nvml.FakeNvml(gpus)
    allocator = FakeAllocator()
    now = [1_764_000_000.0]
    collector = Collector(nvml=NvmlBackend(nvml=nvml), allocator=allocator, clock=lambda: now[0])
    sampler = Sampler(collector, [log_sink(path)], interval=1.0)
    reserved = [0] * run.gpus
    for step in range(run.steps):
        evaluating = run.eval_every > 0 and step % run.eval_every >= run.eval_every - run.eval_steps
        tokens = rng.choice((256, 384, 512, 768, 1024, 1536, 2048)) * 4
        readings = []
        for g in range(run.gpus):
            leak = run.leak_per_step * max(0, step - run.leak_from)
            allocated = run.base + leak + rng.randrange(0, 24 * MIB)
            peak = allocated + tokens * run.bytes_per_token + (run.eval_extra if evaluating else 0)
            # The cache only grows: it keeps the largest peak seen, rounded to 2 MiB blocks, plus split blocks.
            reserved[g] = max(reserved[g], (peak * 105 // 100) // (2 * MIB) * (2 * MIB))
            gpus[g].used = reserved[g] + CONTEXT
            readings.append(AllocatorReading(device=g, allocated_bytes=allocated, reserved_bytes=reserved[g],
                                             peak_allocated_bytes=peak, active_bytes=allocated,
                                             inactive_split_bytes=(reserved[g] - peak) // 3, num_alloc_retries=0,
                                             num_ooms=0, uuid=gpus[g].uuid))
        allocator.readings = tuple(readings)
        sampler.sample_now(step=step, phase=run.eval_phase if evaluating else "train", tokens=tokens)
        now[0] += run.seconds_per_step * (0.5 if evaluating else 1.0)
    sampler.close()
    return path


def write_nvidia_smi_log(path: Path, rows: int = 120, gpus: int = 2, truncate_last: bool = False) -> Path:
    """What ``nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv -l 1`` writes.

    Byte for byte: ", " between fields, the unit in the header and after every number, one line per GPU
    per tick, GPUs of a tick sharing its timestamp.
    """
    lines = ["timestamp, name, memory.used [MiB], memory.total [MiB]"]
    for t in range(rows):
        for g in range(gpus):
            used = 800 + min(t, 60) * 300 + (g * 1000) + (t % 7) * 40
            lines.append(f"2026/11/29 10:{t // 60:02d}:{t % 60:02d}.{(t * 37) % 1000:03d}, "
                         f"NVIDIA GeForce RTX 4090, {used} MiB, 24564 MiB")
    text = "\n".join(lines) + "\n"
    if truncate_last:
        text = text[:-9]  # a crash in the middle of the last line
    path.write_text(text, encoding="utf-8")
    return path


def test_training_log_is_a_real_vramscope_log(tmp_path: Path) -> None:
    """The fixture goes through the real sampler and sink: the reader sees the columns it writes."""
    path = write_training_log(tmp_path / "train.csv", Run(steps=50, gpus=2, eval_every=20, eval_steps=5))
    table = read_log(path)
    assert len(table) == 100
    assert table.gpus() == [0, 1]
    assert set(table.strings("phase")) == {"train", "eval"}
    assert min(v for v in table.ints("peak_allocated_bytes") if v is not None) > Run().base
    used = [v for v in table.ints("device_used_bytes") if v is not None]
    reserved = [v for v in table.ints("reserved_bytes") if v is not None]
    assert all(u - r == CONTEXT for u, r in zip(used, reserved, strict=False))


def test_nvidia_smi_fixture_reads_as_nvidia_smi(tmp_path: Path) -> None:
    table = read_log(write_nvidia_smi_log(tmp_path / "smi.csv", rows=10, gpus=2))
    assert table.kind == "nvidia-smi"
    assert len(table) == 20
    assert table.ints("device_total_bytes")[0] == 24564 * MIB


def write_rotated_log(path: Path, rows: int = 40) -> Path:
    """A real CSV sink's log of two fake GPUs, one row each a step, rotated into parts of 2 KiB (``path``,
    ``path.1``, ...): the file a long `vramscope run --log` leaves."""
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=(i + 1) * 2**30) for i in range(2)])
    clock = iter(range(10**9))
    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), clock=lambda: 1.7e9 + next(clock))
    sink = CsvSink(path, max_bytes=2048)
    for step in range(rows):
        sink.write(collector.collect(step=step))
    sink.close()
    return path
