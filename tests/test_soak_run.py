"""Soak through `vramscope run` (the fast version of bench/soak_run.py's simulated day).

The real runner starts a real child and samples it on its sampler thread with the real NVML backend
(over the fake NVML module), a rotating CSV log, the peak tracker and a Prometheus exporter; an
injected clock makes the samples span a day. Run in a fresh process, so that pytest's allocations do
not blur the memory figures. Rows in (samples x GPUs) must equal rows out (every line of every part,
each whole), and the monitor's RSS after warm-up must stay flat. ``VRAMSCOPE_SOAK_RUN_SAMPLES`` runs it
longer (864000 is the benchmark's day at 10 Hz).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = int(os.environ.get("VRAMSCOPE_SOAK_RUN_SAMPLES", "40000"))
RSS_GROWTH_BOUND = 4 * 1024 * 1024  # as in tests/test_soak.py
RSS_ABSOLUTE_BOUND = 100 * 1024 * 1024


@pytest.mark.slow  # a child that replays a simulated day
def test_a_simulated_day_through_vramscope_run_keeps_every_row_in_flat_memory(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "soak_run.py"), "--samples", str(SAMPLES), "--max-log-mb", "1",
         "--keep", str(tmp_path / "logs"), "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    result = json.loads(out.read_text())["result"]
    assert result["exit_code"] == 0 and result["left_behind"] == []
    assert result["samples_taken"] >= SAMPLES
    assert result["simulated_s"] >= 86400.0
    assert result["rows_in"] == result["rows_out"] == 2 * result["samples_taken"]  # nothing lost, nothing extra
    assert result["torn_rows"] == 0
    assert result["log_parts"] > 1  # it rotated
    parts = sorted((tmp_path / "logs").glob("soak.csv*"))
    assert len(parts) == result["log_parts"]
    assert result["rss_growth_after_warmup_bytes"] < RSS_GROWTH_BOUND
    assert result["rss_after_warmup_max_bytes"] - result["rss_after_warmup_min_bytes"] < RSS_GROWTH_BOUND
    assert result["rss_peak_bytes"] < RSS_ABSOLUTE_BOUND
    env_info = json.loads(out.read_text())["environment"]
    assert env_info["date"] and env_info["versions"]
