"""Which monitor sees a training run's true memory peak, when the peaks are short.

The run: a QLoRA fine-tune with a large vocabulary (Llama-3-8B's shapes, 128k-token vocabulary, fewer
layers by default so that it fits the time budget), batch 4 x 1024 tokens. Its peak is short: the
logits and the cross-entropy (4 x 1024 x 128256 values, upcast to fp32) and the optimizer step exist
for a fraction of each step.

The truth is torch's ``max_memory_allocated``. Two of the methods reset that counter (that is how they
get an exact per-interval peak), so the run is cut into passes of the same steps (same shapes):

1. ``reference_1``: nothing resets the counter; ``max_memory_allocated`` at the end is the true peak.
2. ``step_aligned``: vramscope's ``MemoryMonitor`` reads the allocator at every step end (peak since
   the previous step, counter reset); the same readings give the step-end *current* allocation, what
   a loop that prints ``torch.cuda.memory_allocated()`` every step sees.
3. ``sampler_10hz``: vramscope's ``Sampler`` at 10 Hz with the allocator backend (peak since the previous
   sample) and NVML.
4. ``reference_2``: as 1; that it matches 1 shows the steps' peak is reproducible, so it is the truth for
   passes 2 and 3 too.

During all four passes, in the background: ``nvidia-smi --query-gpu=timestamp,memory.used -l 1`` (a
subprocess, its output parsed), and a 10 Hz NVML + current-allocation series (no counter reset) from
which come: what a 10 Hz poller of ``memory_allocated()`` sees, what NVML at 10 Hz sees (what
``vramscope run`` sees from outside the process), and 15-second averages of NVML's figure (hosted
trackers log system metrics every 15 s; the W&B SDK documents that interval).

NVML's figure is the device memory in use: the CUDA context, the allocator's cached blocks and memory
torch does not allocate (bitsandbytes' paged optimizer state). It is compared with the true peak all
the same, because that is the number users read off nvidia-smi as "the peak".

Writes ``peak_capture.json`` with every step, every sample and every nvidia-smi line.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import common

MIB = 1024**2
PASSES = ("reference_1", "step_aligned", "sampler_10hz", "reference_2")


class NvidiaSmiLoop:
    """``nvidia-smi ... -l 1`` in the background, its output in a file (a pipe could fill and block it)."""

    def __init__(self, uuid: str | None) -> None:
        exe = shutil.which("nvidia-smi")
        self.reason = None if exe is not None else "nvidia-smi is not on PATH"
        self._argv = [
            exe or "nvidia-smi",
            "--query-gpu=timestamp,memory.used",
            "--format=csv,noheader,nounits",
            "-l",
            "1",
            *common.nvidia_smi_query_args(uuid),
        ]
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd, name = tempfile.mkstemp(prefix="vramscope-smi-", suffix=".csv")
        self._path = Path(name)

    def start(self) -> None:
        if self.reason is None:
            self._proc = subprocess.Popen(self._argv, stdout=self._fd, stderr=subprocess.DEVNULL)

    def stop(self) -> list[dict[str, Any]]:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        os.close(self._fd)
        text = self._path.read_text(encoding="utf-8", errors="replace")
        self._path.unlink(missing_ok=True)
        return parse_smi(text)


def parse_smi(text: str) -> list[dict[str, Any]]:
    """Lines of ``timestamp, memory.used`` (MiB) -> {time (Unix, from nvidia-smi's local time), used_bytes}."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            when = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            used = int(float(parts[1]) * MIB)
        except ValueError:  # "[N/A]", a header, a partial last line
            continue
        rows.append({"time": when, "used_bytes": used, "raw": line})
    return rows


class SeriesRecorder:
    """A vramscope Sampler whose every sample is kept as a small dict (time, NVML used, allocator figures)."""

    def __init__(self, reset_peak: bool, interval: float, uuid: str | None) -> None:
        from vramscope.backends.nvml import NvmlBackend
        from vramscope.sampling.sampler import Collector, Sampler

        allocator = None
        if common.cuda_available():
            from vramscope.backends.torch_allocator import TorchAllocatorBackend

            allocator = TorchAllocatorBackend(devices=[0], reset_peak=reset_peak)
        self.nvml = NvmlBackend()
        self._uuid = uuid
        self.rows: list[dict[str, Any]] = []
        self.sampler = Sampler(Collector(nvml=self.nvml, allocator=allocator), interval=interval, on_sample=self._keep)

    def _keep(self, sample: Any) -> None:
        gpu = next((g for g in sample.gpus if self._uuid is None or g.uuid == self._uuid), None)
        if gpu is None and len(sample.gpus) == 1:  # UUIDs spelled differently (MIG, old torch): one GPU is ours
            gpu = sample.gpus[0]
        alloc = sample.allocator[0] if sample.allocator else None
        self.rows.append(
            {
                "time": sample.time,
                "nvml_used_bytes": gpu.used_bytes if gpu is not None else None,
                "allocated_bytes": alloc.allocated_bytes if alloc is not None else None,
                "reserved_bytes": alloc.reserved_bytes if alloc is not None else None,
                "peak_allocated_bytes": alloc.peak_allocated_bytes if alloc is not None else None,
            }
        )

    def start(self) -> None:
        self.sampler.sample_now()  # with reset_peak: the counter starts from here
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.close()  # its last sample holds the peak since the one before
        self.nvml.close()


def reset_peak() -> None:
    if common.cuda_available():
        import torch

        torch.cuda.reset_peak_memory_stats()


def peaks() -> dict[str, int | None]:
    if not common.cuda_available():
        return {"max_allocated_bytes": None, "max_reserved_bytes": None}
    import torch

    return {
        "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def step(trainer: Any, batch: int, seq: int) -> tuple[float, float]:
    common.synchronize()
    started = time.perf_counter()
    loss = trainer.step(batch, seq)
    common.synchronize()
    return time.perf_counter() - started, loss


def step_aligned_pass(
    trainer: Any, steps: int, batch: int, seq: int, records: list[dict[str, Any]], log_dir: Path
) -> dict[str, Any]:
    """MemoryMonitor at every step end; falls back to the allocator backend it uses when it is missing."""
    try:
        from vramscope import MemoryMonitor
    except ImportError as exc:
        MemoryMonitor = None
        common.log(f"MemoryMonitor unavailable ({exc}); reading TorchAllocatorBackend at step ends instead")
    readings: list[dict[str, Any]] = []

    def keep(index: int, sample: Any) -> None:
        alloc = sample.allocator[0] if sample is not None and sample.allocator else None
        readings.append(
            {
                "step": index,
                "peak_allocated_bytes": alloc.peak_allocated_bytes if alloc is not None else None,
                "allocated_bytes": alloc.allocated_bytes if alloc is not None else None,
            }
        )

    error = None
    if MemoryMonitor is not None:
        try:
            with MemoryMonitor(log=str(log_dir / "step_aligned.csv"), every_n_steps=1) as monitor:
                for i in range(steps):
                    seconds, loss = step(trainer, batch, seq)
                    keep(i, monitor.step(i))
                    records.append({"pass": "step_aligned", "step": i, "seconds": seconds, "loss": loss})
            return {
                "how": "vramscope.MemoryMonitor(every_n_steps=1): the Sample mon.step(i) returns",
                "readings": readings,
            }
        except Exception as exc:  # device time is scarce: repeat the pass the way MemoryMonitor reads
            error = f"{type(exc).__name__}: {exc}"
            common.log(f"MemoryMonitor failed ({error}); repeating the pass with TorchAllocatorBackend")
            readings.clear()
            for record in records:
                if record["pass"] == "step_aligned":
                    record["pass"] = "step_aligned_failed_attempt"
            reset_peak()
    how = "TorchAllocatorBackend(reset_peak=True).read() at every step end"
    backend = _allocator_backend()
    read = backend.read if backend is not None else tuple
    read()  # resets the counter: the first step's peak starts here
    for i in range(steps):
        seconds, loss = step(trainer, batch, seq)
        keep(i, _Reading(read()))
        records.append({"pass": "step_aligned", "step": i, "seconds": seconds, "loss": loss})
    return {"how": how, "readings": readings, "monitor_error": error}


class _Reading:
    """Stands in for a Sample (only ``allocator`` is read) when the backend is read directly."""

    def __init__(self, allocator: tuple[Any, ...]) -> None:
        self.allocator = allocator


def _allocator_backend() -> Any:
    if not common.cuda_available():
        return None
    from vramscope.backends.torch_allocator import TorchAllocatorBackend

    return TorchAllocatorBackend(devices=[0], reset_peak=True)


def run_pass(name: str, trainer: Any, steps: int, batch: int, seq: int, records: list[dict[str, Any]]) -> None:
    for i in range(steps):
        seconds, loss = step(trainer, batch, seq)
        records.append({"pass": name, "step": i, "seconds": seconds, "loss": loss})


def windows(rows: list[dict[str, Any]], key: str, start: float, end: float, width: float) -> list[dict[str, Any]]:
    """Means of ``key`` over consecutive ``width``-second windows from ``start``; the last may be partial."""
    out = []
    count = max(1, math.ceil((end - start) / width))
    for k in range(count):
        lo, hi = start + k * width, min(end, start + (k + 1) * width)
        values = [r[key] for r in rows if lo <= r["time"] < hi and r[key] is not None]
        if values:
            out.append(
                {
                    "start_s": lo - start,
                    "seconds": hi - lo,
                    "partial": hi - lo < width - 1e-6,
                    "samples": len(values),
                    "mean_bytes": statistics.fmean(values),
                }
            )
    return out


def _max(values: list[int | float | None]) -> int | None:
    known = [v for v in values if v is not None]
    return int(max(known)) if known else None


def method(
    name: str,
    reads: str,
    where: str,
    reported: int | None,
    truth: int | None,
    samples: int | None,
    reason: str | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "method": name,
        "reads": reads,
        "during": where,
        "reported_bytes": reported,
        "samples": samples,
    }
    if reported is None:
        entry["reason"] = reason or "no CUDA device or tool here"
    if reported is not None and truth:
        entry["error_bytes"] = reported - truth
        entry["error_pct"] = (reported / truth - 1) * 100
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-3-8B", help="planner registry name (default Llama-3-8B)")
    parser.add_argument(
        "--layers",
        type=int,
        default=8,
        help="decoder layers kept (default 8 of 32; the vocabulary, hence the logits, is whole)",
    )
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default 4; 2 with --tiny)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 1024; 32 with --tiny)")
    parser.add_argument("--warmup", type=int, default=None, help="steps before the passes (default 3; 1 with --tiny)")
    parser.add_argument(
        "--pass-s",
        type=float,
        default=None,
        help="seconds per pass; steps per pass follow from the warm-up (default 8)",
    )
    parser.add_argument("--min-steps", type=int, default=None, help="fewest steps per pass (default 5; 2 with --tiny)")
    parser.add_argument("--interval", type=float, default=0.1, help="sampling interval (default 0.1 s)")
    parser.add_argument("--average-s", type=float, default=15.0, help="hosted trackers' window (default 15 s)")
    parser.add_argument(
        "--checkpoint-root",
        type=Path,
        default=None,
        help="where the random checkpoint is written and reused (default /dev/shm/vramscope-bench)",
    )
    args = parser.parse_args(argv)
    tiny = args.tiny
    batch = args.batch or (2 if tiny else 4)
    seq = args.seq or (32 if tiny else 1024)
    warmup = args.warmup if args.warmup is not None else (1 if tiny else 3)
    pass_s = args.pass_s if args.pass_s is not None else (0.0 if tiny else 8.0)
    min_steps = args.min_steps or (2 if tiny else 5)
    if not tiny and not common.cuda_available():
        print("peak_capture.py: no CUDA device; run with --tiny on a CPU", file=sys.stderr)
        return 2

    started = time.perf_counter()
    config = common.model_config(args.model, tiny, num_hidden_layers=args.layers)
    common.log(f"building {args.model} ({config['num_hidden_layers']} layers, vocab {config['vocab_size']}) trainer")
    trainer, model_info = common.build_qlora_trainer(config, tiny, args.checkpoint_root)
    uuid = common.device_uuid() if common.cuda_available() else None

    records: list[dict[str, Any]] = []
    reset_peak()
    run_pass("warmup", trainer, warmup, batch, seq, records)
    warmup_peaks = peaks()
    step_s = statistics.median(r["seconds"] for r in records[-2:])
    steps = max(min_steps, math.ceil(pass_s / step_s)) if step_s > 0 else min_steps
    common.log(f"warm-up step {step_s:.3f} s; 4 passes of {steps} steps")

    log_dir = Path(tempfile.mkdtemp(prefix="vramscope-peak-"))
    smi = NvidiaSmiLoop(uuid)
    background = SeriesRecorder(reset_peak=False, interval=args.interval, uuid=uuid)
    smi.start()
    background.start()
    section_start = time.time()
    passes: dict[str, dict[str, Any]] = {}

    step_info: dict[str, Any] = {}
    sampler = SeriesRecorder(reset_peak=True, interval=args.interval, uuid=uuid)
    for name in PASSES:
        reset_peak()
        t0 = time.time()
        if name == "step_aligned":
            step_info = step_aligned_pass(trainer, steps, batch, seq, records, log_dir)
        elif name == "sampler_10hz":
            sampler.start()
            run_pass(name, trainer, steps, batch, seq, records)
            sampler.stop()
        else:
            run_pass(name, trainer, steps, batch, seq, records)
        # Meaningful for the reference passes only: the other two reset the counter as they go.
        passes[name] = {"start": t0, "end": time.time(), **peaks()}
        common.log(f"pass {name}: {passes[name]['end'] - t0:.1f} s")
    section_end = time.time()
    background.stop()
    smi_rows = smi.stop()
    shutil.rmtree(log_dir, ignore_errors=True)

    # The truth: the reference passes, where nothing reset torch's peak counter.
    ref = [passes["reference_1"], passes["reference_2"]]
    true_alloc = _max([p["max_allocated_bytes"] for p in ref])
    true_reserved = _max([p["max_reserved_bytes"] for p in ref])
    ref_alloc = [p["max_allocated_bytes"] for p in ref]
    first, second = ref_alloc
    reproducible = abs(first - second) / max(first, second) if first and second else None

    in_section = [r for r in background.rows if section_start <= r["time"] <= section_end]
    smi_section = [r for r in smi_rows if section_start - 1 <= r["time"] <= section_end + 1]
    avg = windows(in_section, "nvml_used_bytes", section_start, section_end, args.average_s)
    readings = step_info.get("readings", [])
    sampler_rows = sampler.rows
    outside = [
        r["nvml_used_bytes"] - r["reserved_bytes"]
        for r in in_section
        if r["nvml_used_bytes"] is not None and r["reserved_bytes"] is not None
    ]

    methods = [
        method(
            "vramscope_step_aligned",
            "allocator peak since the previous step, at every step end",
            "step_aligned",
            _max([r["peak_allocated_bytes"] for r in readings]),
            true_alloc,
            len(readings),
        ),
        method(
            "vramscope_sampler_10hz",
            "allocator peak since the previous sample, every 0.1 s",
            "sampler_10hz",
            _max([r["peak_allocated_bytes"] for r in sampler_rows]),
            true_alloc,
            len(sampler_rows),
        ),
        method(
            "step_end_memory_allocated",
            "torch.cuda.memory_allocated() at every step end",
            "step_aligned",
            _max([r["allocated_bytes"] for r in readings]),
            true_alloc,
            len(readings),
        ),
        method(
            "poll_memory_allocated_10hz",
            "torch.cuda.memory_allocated() every 0.1 s",
            "all passes",
            _max([r["allocated_bytes"] for r in in_section]),
            true_alloc,
            len(in_section),
        ),
        method(
            "vramscope_nvml_10hz",
            "NVML device memory used every 0.1 s (what `vramscope run` sees)",
            "all passes",
            _max([r["nvml_used_bytes"] for r in in_section]),
            true_alloc,
            sum(r["nvml_used_bytes"] is not None for r in in_section),
            reason=background.nvml.init_error or None,
        ),
        method(
            "nvidia_smi_l1",
            "nvidia-smi --query-gpu=memory.used -l 1",
            "all passes",
            _max([r["used_bytes"] for r in smi_section]),
            true_alloc,
            len(smi_section),
            reason=smi.reason,
        ),
        method(
            f"average_{args.average_s:g}s",
            f"NVML used averaged over {args.average_s:g} s windows (hosted trackers)",
            "all passes",
            _max([w["mean_bytes"] for w in avg]),
            true_alloc,
            len(avg),
            reason=background.nvml.init_error or None,
        ),
    ]
    payload = {
        "description": "peak memory each monitoring method reports vs torch's max_memory_allocated",
        "model": {"name": f"{args.model} ({config['num_hidden_layers']} layers)", **model_info},
        "batch": batch,
        "seq_len": seq,
        "logits_bytes_fp32": batch * seq * int(config["vocab_size"]) * 4,
        "steps_per_pass": steps,
        "truth": {
            "max_allocated_bytes": true_alloc,
            "max_reserved_bytes": true_reserved,
            "reference_passes_allocated_bytes": ref_alloc,
            "reference_relative_difference": reproducible,
            "warmup": warmup_peaks,
        },
        "nvml_minus_reserved_bytes": common.summarize(outside) if outside else None,
        "methods": methods,
        "passes": {
            k: {**v, "start": v["start"] - section_start, "end": v["end"] - section_start} for k, v in passes.items()
        },
        "step_aligned_how": step_info.get("how"),
        "step_aligned_readings": readings,
        "sampler_10hz_samples": [{**r, "time": r["time"] - section_start} for r in sampler_rows],
        "background_samples": [{**r, "time": r["time"] - section_start} for r in in_section],
        "nvidia_smi": [{**r, "time": r["time"] - section_start} for r in smi_section],
        "average_windows": avg,
        "steps": records,
        "wall_s": time.perf_counter() - started,
    }
    path = common.write_result(common.out_dir(args), "peak_capture", payload, tiny)
    gib = 1024**3
    common.log(f"true peak allocated: {true_alloc / gib:.3f} GiB" if true_alloc else "true peak: no CUDA here")
    for m in methods:
        seen = f"{m['reported_bytes'] / gib:.3f} GiB" if m["reported_bytes"] is not None else m.get("reason")
        pct = f" ({m['error_pct']:+.2f} %)" if "error_pct" in m else ""
        common.log(f"{m['method']}: {seen}{pct}")
    common.log(f"wrote {path} in {payload['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
