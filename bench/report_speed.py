"""How fast `vramscope report` is on a day of samples, against one plain csv.reader pass over the file.

The goal (issue 23): a log of one million rows summarised and drawn as HTML in at most 0.5 times one
plain ``csv.reader`` pass over the same file (issue 15's was 1.5 times). This script measures that ratio in one
run, on this machine, with the baseline and the report interleaved (A B A B ...) so that a noisy
neighbour slows both alike. Nothing is asserted: the numbers and every repetition go to
``--out/report_speed.json``.

The read is reported on its own: ``read_s`` is ``read_log`` (the file read by pyarrow, the schema's
number columns typed) and ``columns_s``, timed on a second read outside the report, is every column
made into its numpy arrays (what the analysis then reads; inside the report the analysis pays it where
it first asks for a column).

Three logs are measured; the first two written by vramscope's own CSV sink:

* ``run``: what ``vramscope run --log`` writes at 10 Hz: time-sampled, NVML columns (device used,
  total, the process's memory, utilization), host RSS; no step, no allocator;
* ``steps``: what the step-aligned monitor writes: step, phase and tokens filled, the allocator's
  allocated, reserved and per-step peak, inactive split blocks, NVML and host columns.

* ``nvidia-smi``: nvidia-smi's own CSV at 10 Hz (timestamp, name, memory used and total), which the
  report accepts so that old logs work too.

Usage: ``python bench/report_speed.py [--rows 1000000] [--repeat 3] [--kinds run,steps,nvidia-smi] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# As the CLI reads logs (vramscope.cli): pyarrow's system allocator, not mimalloc's reserved arenas.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import numpy
import pyarrow
from rich.console import Console

from vramscope.analysis.columns import ANALYSED_COLUMNS
from vramscope.logs import halves
from vramscope.logs.csv_sink import CsvSink
from vramscope.logs.reader import read_log
from vramscope.logs.schema import sample_rows
from vramscope.logs.table import LogTable
from vramscope.report import model
from vramscope.report.html import render_html
from vramscope.report.model import build_report
from vramscope.report.terminal import print_report
from vramscope.types import AllocatorReading, GpuReading, HostReading, ProcessGpuReading, Sample

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
MIB = 1024**2
PID = 4242


def write_smi_log(path: Path, rows: int, seed: int = 0) -> None:
    """What ``nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv -lms 100`` writes."""
    rng = random.Random(seed)
    start = datetime(2026, 11, 29)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("timestamp, name, memory.used [MiB], memory.total [MiB]\n")
        for i in range(rows):
            stamp = start + timedelta(milliseconds=100 * i)
            used = 20_000 + i // 1000 + rng.randrange(4_000)
            handle.write(f"{stamp:%Y/%m/%d %H:%M:%S}.{stamp.microsecond // 1000:03d}, NVIDIA H200, "
                         f"{used} MiB, 143771 MiB\n")


def write_log(path: Path, rows: int, kind: str, seed: int = 0) -> None:
    """A QLoRA-like run through the real CSV sink: a base, per-batch peaks, eval every 2000 samples, a slow leak."""
    if kind == "nvidia-smi":
        write_smi_log(path, rows, seed)
        return
    rng = random.Random(seed)
    sink = CsvSink(path)
    batch: list[dict[str, Any]] = []
    start = 1_764_000_000.0
    reserved = 0
    for i in range(rows):
        evaluating = (i // 2000) % 10 == 9
        tokens = rng.choice((256, 512, 1024, 2048)) * 4
        allocated = 5 * GIB + i * 40 + rng.randrange(16 * MIB)
        peak = allocated + tokens * MIB + (3 * GIB if evaluating else 0)
        reserved = max(reserved, peak * 105 // 100)
        used = reserved + 560 * MIB
        gpu = GpuReading(index=0, uuid="GPU-0", name="NVIDIA H200", used_bytes=used, total_bytes=141 * GIB,
                         free_bytes=141 * GIB - used, utilization_pct=rng.randrange(80, 100),
                         processes=(ProcessGpuReading(PID, used - 300 * MIB),))
        host = HostReading(rss_bytes=6 * GIB + rng.randrange(64 * MIB), system_used_bytes=90 * GIB)
        if kind == "run":
            sample = Sample(time=start + i * 0.1, elapsed_s=i * 0.1, gpus=(gpu,), host=host,
                            watched_pids=frozenset({PID}))
        else:
            alloc = AllocatorReading(device=0, allocated_bytes=allocated, reserved_bytes=reserved,
                                     peak_allocated_bytes=peak, active_bytes=allocated,
                                     inactive_split_bytes=(reserved - peak) // 3, num_alloc_retries=0, num_ooms=0,
                                     uuid="GPU-0")
            sample = Sample(time=start + i * 0.1, elapsed_s=i * 0.1, gpus=(gpu,), allocator=(alloc,), host=host,
                            watched_pids=frozenset({PID}), step=i, phase="eval" if evaluating else "train",
                            tokens=tokens)
        batch.extend(sample_rows(sample))
        if len(batch) >= 20_000:
            sink.write_rows(batch)
            batch = []
    sink.write_rows(batch)
    sink.close()


def csv_pass(path: Path) -> tuple[float, float]:
    """The baseline: one plain csv.reader pass over the file, touching every row; (wall, CPU) seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    with open(path, newline="", encoding="utf-8") as handle:
        for _row in csv.reader(handle):
            pass
    return time.perf_counter() - started, time.process_time() - cpu


class _Timed:
    """Wraps analyze() where build_report calls it, to split the build's time between it and the report."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.func(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started


def full_report(path: Path, halves_from: int | None = halves.SPLIT_FROM) -> dict[str, float]:
    """What `vramscope report LOG --html OUT` does, timed by stage (the terminal summary to nowhere).

    The stages are those of ``vramscope.report.load.report_file`` (read, then build), called one by one
    to time each; the garbage collector stays on (the reader makes no Python object per cell).
    ``halves_from``: the size from which the log is read in two halves at once (``vramscope.logs.halves``,
    where the process may use two cores); None: read as one stream, to see what the halves gain.
    """
    times: dict[str, float] = {}
    timed = _Timed(model.analyze)
    model.analyze = timed  # type: ignore[assignment]
    split_from = halves.SPLIT_FROM
    halves.SPLIT_FROM = halves_from if halves_from is not None else 1 << 62
    started, cpu = time.perf_counter(), time.process_time()
    try:
        table = read_log(path, only=ANALYSED_COLUMNS)  # as report_file reads it
        times["read_s"] = time.perf_counter() - started
        mark = time.perf_counter()
        report = build_report(table)
    finally:
        model.analyze = timed.func  # type: ignore[assignment]
        halves.SPLIT_FROM = split_from
    times["analyze_and_build_s"] = time.perf_counter() - mark
    # analyze() converts the columns it reads; the report reuses them from the table's cache.
    times["analyze_s"] = timed.seconds
    mark = time.perf_counter()
    page = render_html([report])
    with open(os.devnull, "w") as sink:
        print_report([report], Console(file=sink, width=100))
    times["render_s"] = time.perf_counter() - mark
    times["total_s"] = time.perf_counter() - started
    times["cpu_s"] = time.process_time() - cpu  # every thread's: pyarrow's CSV reader may use two
    times["html_bytes"] = float(len(page.encode()))
    del table, report, page
    gc.collect()
    return times


def all_columns(path: Path) -> dict[str, float]:
    """A fresh read with every column made into its arrays: the whole cost of reading, apart from the report."""
    started = time.perf_counter()
    table = read_log(path)
    read = time.perf_counter() - started
    mark = time.perf_counter()
    make_arrays(table)
    return {"read_s": read, "columns_s": time.perf_counter() - mark, "columns": float(len(table.columns))}


def make_arrays(table: LogTable) -> None:
    for name in table.columns:
        if name in ("time", "phase", "gpu_uuid"):
            table.labels(name)
        elif name == "elapsed_s":
            table.float_column(name)
        else:
            table.int_column(name)


def measure(kind: str, rows: int, repeat: int, folder: Path) -> dict[str, Any]:
    path = folder / f"{kind}.csv"
    load = [os.getloadavg()]  # the neighbours' load, as each repetition starts: the ratios move with it
    print(f"[{time.strftime('%H:%M:%S')}] writing a {rows:,}-row '{kind}' log", file=sys.stderr, flush=True)
    started = time.perf_counter()
    write_log(path, rows, kind)
    written = time.perf_counter() - started
    baseline: list[float] = []
    baseline_cpu: list[float] = []
    reports: list[dict[str, float]] = []
    one_stream: list[dict[str, float]] = []  # the same report with the log read as one stream (no halves)
    reading: list[dict[str, float]] = []
    csv_pass(path)  # warm the page cache for both arms
    for r in range(repeat):
        print(f"[{time.strftime('%H:%M:%S')}] {kind}: repetition {r + 1}/{repeat}", file=sys.stderr, flush=True)
        load.append(os.getloadavg())
        wall, cpu = csv_pass(path)
        baseline.append(wall)
        baseline_cpu.append(cpu)
        reports.append(full_report(path))
        one_stream.append(full_report(path, halves_from=None))
        reading.append(all_columns(path))
    ratios = [rep["total_s"] / base for rep, base in zip(reports, baseline, strict=True)]
    # CPU seconds, both arms: less at the mercy of the neighbours on a shared machine than the wall clock.
    cpu_ratios = [rep["cpu_s"] / base for rep, base in zip(reports, baseline_cpu, strict=True)]
    # The same without analyze() (the leak test and forecast, another module), to show where time goes.
    own = [(rep["total_s"] - rep["analyze_s"]) / base for rep, base in zip(reports, baseline, strict=True)]
    result = {
        "kind": kind,
        "rows": rows,
        "file_bytes": path.stat().st_size,
        "write_s": written,
        "csv_reader_pass_s": baseline,
        "report": reports,
        "ratio_per_repetition": ratios,
        "ratio_median": statistics.median(ratios),
        "csv_reader_pass_cpu_s": baseline_cpu,
        "cpu_ratio_per_repetition": cpu_ratios,
        "cpu_ratio_median": statistics.median(cpu_ratios),
        "report_total_median_s": statistics.median(r["total_s"] for r in reports),
        "csv_reader_median_s": statistics.median(baseline),
        "ratio_without_analyze_per_repetition": own,
        "ratio_without_analyze_median": statistics.median(own),
        "analyze_median_s": statistics.median(r["analyze_s"] for r in reports),
        "read_median_s": statistics.median(r["read_s"] for r in reports),
        "reading_alone": reading,
        "columns_median_s": statistics.median(r["columns_s"] for r in reading),
        "one_stream_report": one_stream,
        "one_stream_ratio_median": statistics.median(
            rep["total_s"] / base for rep, base in zip(one_stream, baseline, strict=True)),
        "one_stream_cpu_ratio_median": statistics.median(
            rep["cpu_s"] / base for rep, base in zip(one_stream, baseline_cpu, strict=True)),
        "read_and_columns_ratio_median": statistics.median(
            (r["read_s"] + r["columns_s"]) / base for r, base in zip(reading, baseline, strict=True)),
        "html_bytes": reports[-1]["html_bytes"],
        "load_average_per_repetition": load[1:],  # (1, 5, 15 min) as each repetition began
        "load_average_before_writing": load[0],
    }
    path.unlink()
    return result


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return done.stdout.strip() or None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per log (default 1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repetitions (default 3)")
    parser.add_argument("--kinds", default="run,steps,nvidia-smi",
                        help="which logs, of run, steps, nvidia-smi (default all three)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results",
                        help="folder for report_speed.json (default bench/results)")
    parser.add_argument("--note", default="", help="what to know about the run (a shared machine, say)")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in ("run", "steps", "nvidia-smi") for k in kinds) or args.rows < 10 or args.repeat < 1:
        parser.error("--kinds takes run, steps and/or nvidia-smi; --rows at least 10; --repeat at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="vramscope-bench-") as folder:
        results = [measure(kind, args.rows, args.repeat, Path(folder)) for kind in kinds]
    document = {
        "benchmark": "report_speed",
        "goal": "report of 1M rows (read, analyse, HTML) in at most 0.5x one plain csv.reader pass over the same file",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "cores_usable": halves.cores(),
                    "load_average_before": load_before, "load_average": os.getloadavg(),
                    "numpy": numpy.__version__, "pyarrow": pyarrow.__version__,
                    "arrow_memory_pool": pyarrow.default_memory_pool().backend_name},
        "vramscope_commit": git_commit(),
        "note": args.note,
        "results": results,
    }
    target = args.out / "report_speed.json"
    fd, tmp = tempfile.mkstemp(prefix=".report_speed.", suffix=".json", dir=args.out)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)
        handle.write("\n")
    os.replace(tmp, target)
    for r in results:
        loads = ", ".join(f"{one[0]:.1f}" for one in r["load_average_per_repetition"])
        print(f"{r['kind']:>5}: load average (1 min) {loads}")
        print(f"{r['kind']:>5}: {r['rows']:,} rows, {r['file_bytes'] / 1e6:.0f} MB; csv.reader pass "
              f"{r['csv_reader_median_s']:.2f} s; report {r['report_total_median_s']:.2f} s "
              f"(ratio {r['ratio_median']:.2f}, CPU ratio {r['cpu_ratio_median']:.2f}; "
              f"analyze() {r['analyze_median_s']:.2f} s of it; ratio without it "
              f"{r['ratio_without_analyze_median']:.2f}); read {r['read_median_s']:.2f} s, every column into "
              f"arrays {r['columns_median_s']:.2f} s more (read + columns {r['read_and_columns_ratio_median']:.2f}x "
              "the pass); "
              f"HTML {r['html_bytes'] / 1e3:.0f} kB; read as one stream: ratio {r['one_stream_ratio_median']:.2f}, "
              f"CPU ratio {r['one_stream_cpu_ratio_median']:.2f}")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
