"""Distributed training: rank 0's log carries every rank, and the report shows per-rank peaks.

A real two-process ``torchrun`` job on this CPU (torch.distributed with gloo): a tiny DDP model whose
ranks train on different batch sizes, so their memory differs; the monitor's all-gather at each
logged step is the real collective, and rank 1 alone runs an "eval" phase to show that phases do not
take part in it (a phase that gathered would hang here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope.logs.reader import read_log

pytest.importorskip("torch")

SCRIPT = r"""
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from vramscope.integrations.loop import MemoryMonitor

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
keep = []
with MemoryMonitor(log=sys.argv[1], every_n_steps=2, warn=False) as mon:
    for step in range(1, 9):
        # Rank 1 holds a growing list of 4 MiB buffers: a real, different footprint per rank.
        if rank == 1:
            keep.append(torch.ones(1024 * 1024))
        ids = torch.randint(0, 64, (4 * (rank + 1), 16))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(step, tokens=ids.numel())
        if rank == 1 and step == 3:
            with mon.phase("eval"):
                pass
dist.barrier()
dist.destroy_process_group()
"""


def test_rank0_log_has_every_rank_and_report_shows_imbalance(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    log = tmp_path / "mem.csv"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    table = read_log(log)
    steps, ranks, rss = table.ints("step"), table.ints("rank"), table.ints("host_rss_bytes")
    for step in (2, 4, 6, 8):
        assert sorted(r for s, r in zip(steps, ranks, strict=True) if s == step) == [0, 1], step
    tokens = {r: t for s, r, t in zip(steps, ranks, table.ints("tokens"), strict=True) if s == 8}
    assert tokens == {0: 64, 1: 128}  # each rank's own batch, not rank 0's
    assert all(v is not None for v, r in zip(rss, ranks, strict=True) if r == 1)
    # Rank 1's eval phase is in its own log only; rank 0's log has no rank-1 phase row.
    assert "eval" not in {p for p, r in zip(table.strings("phase"), ranks, strict=True) if r == 1}
    assert "eval" in set(read_log(tmp_path / "mem.rank1.csv").strings("phase"))

    report = subprocess.run(
        [sys.executable, "-m", "vramscope", "report", str(log), "--json"], capture_output=True, text=True, timeout=60
    )
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    summary = summary[0] if isinstance(summary, list) else summary
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    assert set(by_rank) == {0, 1}
    assert by_rank[1]["peak_host_rss_bytes"] > by_rank[0]["peak_host_rss_bytes"]
    assert summary["imbalance"] > 0  # max/min - 1 of the peaks below
    assert summary["imbalance_metric"] == "peak_host_rss_bytes"  # no GPU here: the host's RSS

    text = subprocess.run(
        [sys.executable, "-m", "vramscope", "report", str(log)], capture_output=True, text=True, timeout=60
    )
    assert "rank" in text.stdout and "imbalance" in text.stdout


@pytest.mark.slow  # two torchrun ranks, each a Python with torch and transformers
def test_gather_false_keeps_rank0_log_to_itself(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("warn=False", "warn=False, gather=False, rank_logs=False"))
    log = tmp_path / "mem.csv"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert set(read_log(log).ints("rank")) == {0}
    assert not (tmp_path / "mem.rank1.csv").exists()
