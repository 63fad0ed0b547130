"""The longest batches a report names and the longest-batch forecast are the training phase's: an eval batch
(often longer: a bigger eval batch size, no backward) is not the run's longest training batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramscope.analysis.summary import analyze_columns
from vramscope.cli import main
from vramscope.logs.reader import read_log

GIB = 1024**3


def test_a_trainer_run_with_evaluation_names_training_batches_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    from test_hf import train  # a real Trainer on a tiny CPU model, eval every 5 steps in batches of 4 x 40
    from vramscope.integrations.hf import MemoryMonitorCallback

    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=log, warn=False)
    train(tmp_path, callback)
    callback.close()
    capsys.readouterr()  # the Trainer's own log lines
    table = read_log(log)
    rows = list(zip(table.ints("step"), table.strings("phase"), table.ints("tokens"), strict=True))
    train_tokens = {s: t for s, p, t in rows if p == "train" and t is not None}
    assert max(t for _, p, t in rows if p == "eval" and t is not None) > max(train_tokens.values())  # the trap

    assert main(["report", str(log), "--json"]) == 0
    batches = json.loads(capsys.readouterr().out)["devices"]["host"]["longest_batches"]
    assert len(batches) == 5
    assert {b["phase"] for b in batches} == {"train"}
    assert [b["tokens"] for b in batches] == sorted(train_tokens.values(), reverse=True)[:5]
    assert all(train_tokens[b["step"]] == b["tokens"] for b in batches)
    assert set(batches[0]) == {"step", "tokens", "peak_allocated_bytes", "phase", "elapsed_s"}  # the pinned fields


def test_the_longest_batch_forecast_leaves_out_eval_rows_of_a_log_without_steps() -> None:
    # A log without steps (the leak test reads it against time), its batches tagged by phase: the eval batch of
    # 4096 tokens and 30 GiB is not the training's longest.
    n = 40
    lengths = [512 + 64 * (i % 8) for i in range(n)]
    phases: list[str | None] = ["train"] * n
    peaks = [GIB * 2 + t * 1024 * 1024 for t in lengths]
    lengths[20], peaks[20], phases[20] = 4096, 30 * GIB, "eval"
    columns = {"elapsed_s": [float(i) for i in range(n)], "phase": phases, "tokens": lengths, "gpu": [0] * n,
               "peak_allocated_bytes": peaks, "allocated_bytes": [GIB] * n, "device_total_bytes": [80 * GIB] * n}
    result = analyze_columns(columns).to_json()
    fit = result["forecast"]["longest_batch"]
    assert fit["tokens_seen_max"] == max(lengths[:20] + lengths[21:]) == 960
    assert fit["peak_at_seen_max_bytes"] == GIB * 2 + 960 * 1024 * 1024
