"""What `vramscope report` costs in memory, on generated logs (issue 14, item 7; docs/reliability.md).

Two logs are generated, then each is reported by ``python -m vramscope report`` in a child process
whose peak RSS (``ru_maxrss`` of the child) and wall time are recorded; the reading alone is measured
the same way, twice: the cells located (``read_log``) and every column made into its numpy arrays
(``int_column``/``float_column``, ``labels`` for the text columns: what the analysis reads). Run it
against two source trees to compare (``--src``, default this checkout's ``src``; a tree from before
issue 15 has no ``vramscope.logs`` and is read through ``vramscope.logfile``); nothing is asserted, the
figures go to ``--out``.

* ``csv``: a vramscope CSV of two GPUs at 10 Hz with every schema column filled (about 236 bytes a row);
* ``jsonl-keys``: a JSON Lines log whose every row brings a key no other row has (a loop logging a
  field named after its step), the case that cost rows x keys before.

Usage: ``python bench/report_memory.py [--samples 800000] [--key-rows 16000] [--src SRC ...] [--out DIR]``.
The figures in docs/reliability.md used ``--samples 4700000`` (a 2.24 GB CSV).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy
import pyarrow

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from vramscope.logs.schema import COLUMNS  # noqa: E402

READ = (
    "import sys\n"
    "try:\n"
    "    from vramscope.logs.reader import read_log\n"
    "except ImportError:  # a tree from before issue 15\n"
    "    from vramscope.logfile import read_log\n"
    "table = read_log(sys.argv[1])\n"
)
READ_INTO_ARRAYS = READ + (
    "for name in table.columns:\n"
    "    if name in ('time', 'phase', 'gpu_uuid'):\n"
    "        table.labels(name)\n"
    "    elif name == 'elapsed_s':\n"
    "        table.float_column(name)\n"
    "    else:\n"
    "        table.int_column(name)\n"
)


def write_csv(path: Path, samples: int) -> None:
    with path.open("w") as out:
        out.write(",".join(COLUMNS) + "\n")
        for i in range(samples):
            stamp = f"2026-11-29T10:{(i // 600) % 60:02d}:{(i // 10) % 60:02d}.{(i % 10) * 100:03d}+00:00"
            for gpu in (0, 1):
                row = {
                    "time": stamp, "elapsed_s": f"{i * 0.1:.3f}", "step": str(i // 20), "gpu": str(gpu),
                    "allocated_bytes": str(10**10 + (i * 7919) % 10**9),
                    "reserved_bytes": str(2 * 10**10 + (i * 104729) % 10**9),
                    "peak_allocated_bytes": str(11 * 10**9 + i % 1000),
                    "device_used_bytes": str(25 * 10**9 + (i * 31) % 10**8), "device_total_bytes": "150754820096",
                    "process_bytes": str(24 * 10**9 + i % 5000), "host_rss_bytes": str(8 * 10**9 + (i * 13) % 10**7),
                    "phase": "train", "tokens": str(2048 + i % 512), "rank": "0",
                    "gpu_uuid": f"GPU-{gpu}aa5b1c2-0000-1111-2222-333344445555",
                    "active_bytes": str(10**10 + i % 999), "inactive_split_bytes": str(i % 10**6),
                    "num_alloc_retries": "0", "num_ooms": "0", "device_free_bytes": str(125 * 10**9 - i % 10**8),
                    "utilization_pct": str(i % 100), "system_used_bytes": str(60 * 10**9 + i % 10**6),
                }
                out.write(",".join(row.get(c, "") for c in COLUMNS) + "\n")


def write_new_key_per_row(path: Path, rows: int) -> None:
    with path.open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"time": f"2026-11-29T10:00:{i % 60:02d}.000+00:00", "elapsed_s": i * 0.1, "step": i,
                                  "gpu": 0, "allocated_bytes": 10**9 + i, "reserved_bytes": 2 * 10**9 + i,
                                  f"loss_{i}": 0.5}) + "\n")


# A fresh parent per measurement: RUSAGE_CHILDREN's ru_maxrss is the largest child a process ever waited
# for, so each child gets a parent of its own that reports it.
PEAK_OF_ONE_CHILD = (
    "import resource, subprocess, sys\n"
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def measure(src: str, args: list[str]) -> dict[str, float]:
    """Peak RSS (bytes) and seconds of one child ``python ARGS`` with ``src`` first on its path."""
    env = {**os.environ, "PYTHONPATH": src}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PEAK_OF_ONE_CHILD, sys.executable, *args], env=env, check=True,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    return {"peak_rss_bytes": int(done.stdout.split()[-1]) * 1024, "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=800_000, help="samples of the CSV (two rows each)")
    parser.add_argument("--key-rows", type=int, default=16_000, help="rows of the JSON Lines log")
    parser.add_argument("--src", action="append", help="source trees to measure (default: this checkout's src)")
    parser.add_argument("--out", default="bench/results", help="folder for report_memory.json and the logs")
    parser.add_argument("--note", default="", help="what to know about the run (a shared machine, say)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_log, keys_log = out / "memory-run.csv", out / "memory-keys.jsonl"
    write_new_key_per_row(keys_log, args.key_rows)
    write_csv(csv_log, args.samples)
    results = []
    load_before = os.getloadavg()
    for src in args.src or [str(ROOT / "src")]:
        for what, child in (("jsonl-keys report", ["-m", "vramscope", "report", str(keys_log)]),
                            ("csv reading (read_log)", ["-c", READ, str(csv_log)]),
                            ("csv reading into arrays (every column)", ["-c", READ_INTO_ARRAYS, str(csv_log)]),
                            ("csv report", ["-m", "vramscope", "report", str(csv_log)])):
            figures = measure(src, child)
            log = keys_log if what.startswith("jsonl") else csv_log
            figures["file_bytes"] = log.stat().st_size
            figures["ratio"] = round(figures["peak_rss_bytes"] / figures["file_bytes"], 2)
            results.append({"src": src, "what": what, **figures})
            print(json.dumps(results[-1]), flush=True)
    document = {
        "benchmark": "report_memory",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count(),
                    "load_average_before": load_before, "load_average": os.getloadavg(),
                    "numpy": numpy.__version__, "pyarrow": pyarrow.__version__},
        "vramscope_commit": _commit(),
        "note": args.note,
        "samples": args.samples,
        "results": results,
    }
    (out / "report_memory.json").write_text(json.dumps(document, indent=1))
    csv_log.unlink()
    keys_log.unlink()


def _commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return done.stdout.strip() or None


if __name__ == "__main__":
    main()
