"""`vramscope report LOG --plan plan.json` holds like against like: the whole log's peaks (loading, evaluation
included) against the plan's whole run, and the log's training steps against the plan's step.

The plans are the real CLI's (`vramscope plan ... --json`, one GPU and `--gpus 2 --strategy ddp`); the logs are
written by vramscope's own Collector -> Sampler -> CsvSink, with NVML and torch's allocator faked at their
boundary only (tests/test_report_fixtures.py), sized from the plan's own phases so that the peak is set where a
real run sets it: at the monitor's start row (loading) or in an evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from test_report_fixtures import GIB, MIB, FakeAllocator
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli import main
from vramscope.logs.sinks import log_sink
from vramscope.report.plan_check import read_plan
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.types import AllocatorReading
from vramscope.units import gib

# A shape the real DDP test plans (tests/test_strategy_record.py): TinyLlama QLoRA, 4 x 1024 tokens, on an H200.
MODEL = ["--model", "TinyLlama-1.1B", "--batch-size", "4", "--seq-len", "1024", "--gpu", "H200",
         "--framework", "loop-loss"]
# The evaluation keeps its logits for compute_metrics: 32 examples at 8 rows pile up past the training step.
EVAL = ["--eval-batch", "8", "--eval-logits", "kept", "--eval-examples", "32"]


@dataclass(frozen=True)
class Row:
    """One logged reading of one GPU: its step and phase, the allocator's peak since the last row, NVML's used."""

    step: int | None
    phase: str | None  # None: a log without phases (vramscope run's)
    peak_allocated: int
    device_used: int


def write_log(path: Path, ranks: dict[int, list[Row]], *, ranked: bool) -> Path:
    """The rows of each rank (rank r on GPU r) through one sink, as rank 0's log of a distributed run gathers
    them; ``ranked`` False: a log of one process (no ``rank`` column)."""
    gpus = [fake_nvml.FakeGpu(total=141 * GIB, used=GIB, uuid=f"GPU-{g}") for g in range(len(ranks))]
    nvml = fake_nvml.FakeNvml(gpus)
    now = [1_764_000_000.0]
    sampler = Sampler(Collector(), [log_sink(path)], interval=1.0)
    for rank, rows in ranks.items():
        allocator = FakeAllocator()
        collector = Collector(nvml=NvmlBackend(nvml=nvml, gpus=[rank]), allocator=allocator, clock=lambda: now[0])
        for row in rows:
            gpus[rank].used = row.device_used
            reserved = -(-row.peak_allocated // (2 * MIB)) * 2 * MIB  # the cache holds the peak, in 2 MiB blocks
            allocator.readings = (AllocatorReading(device=rank, allocated_bytes=row.peak_allocated // 3,
                                                   reserved_bytes=reserved, peak_allocated_bytes=row.peak_allocated,
                                                   uuid=f"GPU-{rank}"),)
            sampler.emit(collector.collect(step=row.step, phase=row.phase, tokens=None if row.step is None else 4096,
                                           extra={"rank": rank} if ranked else None))
            now[0] += 1.0
    sampler.close()
    return path


def plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, *argv: str) -> tuple[Path, Any]:
    assert main(["plan", *argv, "--json"]) == 0
    text = capsys.readouterr().out
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path, json.loads(text)


def report(capsys: pytest.CaptureFixture[str], log: Path, plan: Path) -> tuple[Any, str, str]:
    """The report's JSON, its terminal text and its HTML page, of ``log`` against ``plan``."""
    assert main(["report", str(log), "--plan", str(plan), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    page = log.with_suffix(".html")
    assert main(["report", str(log), "--plan", str(plan), "--html", str(page)]) == 0
    return data, capsys.readouterr().out, page.read_text(encoding="utf-8")


def error(measured: int, planned: int) -> float:
    return round((planned - measured) / measured, 4)


def scaled(value: int, factor: float) -> int:
    return int(value * factor)


def test_a_one_gpu_run_whose_peak_is_its_evaluation_is_held_against_the_planned_evaluation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, doc = plan_file(tmp_path, capsys, "plan.json", *MODEL, *EVAL)
    phases = doc["phases"]
    assert doc["peak_phase"] == "eval" and set(phases) == {"load", "train", "eval"}  # the plan's whole run
    load, train, ev = phases["load"], phases["train"], phases["eval"]
    rows = [Row(None, "start", scaled(load["peak_allocated_bytes"], 1.04), scaled(load["process_bytes"], 1.04))]
    rows += [Row(s, "train", scaled(train["peak_allocated_bytes"], 0.95 + s / 1000),
                 scaled(train["process_bytes"], 0.97)) for s in range(1, 31)]
    rows.append(Row(30, "eval", scaled(ev["peak_allocated_bytes"], 1.02), scaled(ev["process_bytes"], 1.01)))
    rows += [Row(s, "train", scaled(train["peak_allocated_bytes"], 0.96), scaled(train["process_bytes"], 0.98))
             for s in range(31, 41)]
    log = write_log(tmp_path / "mem.csv", {0: rows}, ranked=False)

    data, text, page = report(capsys, log, plan)
    par = data["parallelism"]
    assert par["plan_strategy"] == "single" and par["plan_whole_run"] is True and par["note"] is None
    gpu0 = par["ranks"][0]
    peaks = data["devices"]["0"]["peaks"]
    measured, used = peaks["peak_allocated_bytes"], peaks["device_used_bytes"]
    assert (measured["phase"], used["phase"]) == ("eval", "eval")  # the log's peak is its evaluation
    # the whole log against the plan's whole run: the evaluation's, which sets both of the plan's figures
    assert gpu0["measured_peak_allocated_bytes"] == measured["bytes"]
    assert gpu0["planned_peak_allocated_bytes"] == ev["peak_allocated_bytes"] == doc["max_allocated_bytes"]
    assert (gpu0["measured_peak_phase"], gpu0["planned_peak_phase"]) == ("eval", "eval")
    assert gpu0["allocated_error"] == error(measured["bytes"], ev["peak_allocated_bytes"])
    assert gpu0["measured_device_bytes"] == used["bytes"]
    assert gpu0["planned_process_bytes"] == ev["process_bytes"] and gpu0["planned_process_phase"] == "eval"
    assert gpu0["device_error"] == error(used["bytes"], ev["process_bytes"])
    # the steps against the plan's step
    steps = max(r.peak_allocated for r in rows if r.phase == "train")
    assert gpu0["measured_step_peak_allocated_bytes"] == steps
    assert gpu0["planned_step_peak_allocated_bytes"] == train["peak_allocated_bytes"]
    assert gpu0["step_allocated_error"] == error(steps, train["peak_allocated_bytes"])
    step_used = max(r.device_used for r in rows if r.phase == "train")
    assert gpu0["measured_step_device_bytes"] == step_used
    assert gpu0["planned_step_process_bytes"] == train["process_bytes"]
    assert gpu0["step_device_error"] == error(step_used, train["process_bytes"])
    # like for like, both errors are the few percent the run differs by; the step against the whole log is not
    assert max(abs(gpu0[k]) for k in ("allocated_error", "device_error", "step_allocated_error",
                                      "step_device_error")) < 0.05
    assert error(measured["bytes"], train["peak_allocated_bytes"]) < -0.5

    assert (f"GPU 0 vs plan (single): peak allocated {gib(measured['bytes'])} at eval, plan "
            f"{gib(ev['peak_allocated_bytes'])} at evaluation ({gpu0['allocated_error'] * 100:+.1f}%)") in text
    assert (f"GPU 0 steps vs the plan's step: peak allocated {gib(steps)}, plan {gib(train['peak_allocated_bytes'])} "
            f"({gpu0['step_allocated_error'] * 100:+.1f}%); device {gib(step_used)}") in text
    # the page's table: the whole log's row, then the steps'
    assert (f'<td>whole log</td><td class="n">{gib(measured["bytes"])} at eval</td><td class="n">'
            f'{gib(ev["peak_allocated_bytes"])} at evaluation</td><td class="n">{gpu0["allocated_error"] * 100:+.1f}%'
            "</td>") in page
    assert (f'<td>steps</td><td class="n">{gib(steps)}</td><td class="n">{gib(train["peak_allocated_bytes"])} at '
            f'the training step</td><td class="n">{gpu0["step_allocated_error"] * 100:+.1f}%</td>') in page


def test_ddp_ranks_whose_peaks_are_loading_and_evaluation_are_held_against_each_gpus_plan(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, doc = plan_file(tmp_path, capsys, "ddp.json", *MODEL, "--gpus", "2", "--strategy", "ddp")
    gpu = doc["gpus"]["plan"]["per_gpu"][0]
    step_alloc, step_process = gpu["peak_allocated_bytes"], gpu["process_bytes"]
    load_alloc = gpu["load_device_bytes"] - gpu["breakdown"]["cuda_context"]
    assert gpu["loading_sets_peak"] is False and load_alloc < step_alloc  # the plan's peak: its step
    steps = [Row(s, "train", scaled(step_alloc, 0.6 + s / 100), scaled(step_process, 0.7)) for s in range(1, 21)]
    # rank 0's loading outgrows its steps (a from_pretrained copy the plan does not hold); rank 1 evaluates
    rank0 = [Row(None, "start", scaled(step_alloc, 0.9), scaled(step_process, 0.8)), *steps]
    rank1 = [Row(None, "start", scaled(load_alloc, 1.0), scaled(gpu["load_device_bytes"], 1.0)), *steps,
             Row(20, "eval", scaled(step_alloc, 0.95), scaled(step_process, 0.95))]
    log = write_log(tmp_path / "ddp.csv", {0: rank0, 1: rank1}, ranked=True)
    (tmp_path / "ddp.strategy.json").write_text(json.dumps(
        {"strategy": "ddp", "implementation": "DistributedDataParallel", "world_size": 2, "backend": "nccl",
         "source": "model wrapping"}))

    data, text, page = report(capsys, log, plan)
    par = data["parallelism"]
    assert par["plan_strategy"] == "ddp" and par["plan_whole_run"] is True
    # the per-GPU plan plans loading and the step: rank 1's evaluation is outside it, and the note says so
    assert par["note"] == ("the log's peak is in its 'eval' rows, a phase the plan does not plan (it plans loading, "
                           "the training step)")
    by_rank = {r["rank"]: r for r in par["ranks"]}
    measured = {r["rank"]: r for r in data["ranks"]}
    for rank, rows, phase in ((0, rank0, "start"), (1, rank1, "eval")):
        check = by_rank[rank]
        whole = max(r.peak_allocated for r in rows)
        assert check["measured_peak_allocated_bytes"] == whole == measured[rank]["peak_allocated_bytes"]
        assert check["measured_peak_phase"] == phase and measured[rank]["gpus"] == [rank]
        assert check["planned_peak_allocated_bytes"] == step_alloc and check["planned_peak_phase"] == "train"
        assert check["allocated_error"] == error(whole, step_alloc)
        assert check["planned_process_bytes"] == step_process and check["planned_process_phase"] == "train"
        step_peak = max(r.peak_allocated for r in steps)
        assert check["measured_step_peak_allocated_bytes"] == step_peak
        assert check["planned_step_peak_allocated_bytes"] == step_alloc
        assert check["step_allocated_error"] == error(step_peak, step_alloc)
        assert check["measured_step_device_bytes"] == max(r.device_used for r in steps)
        assert check["step_device_error"] == error(max(r.device_used for r in steps), step_process)
        assert (f"rank {rank} vs plan (ddp): peak allocated {gib(whole)} at {phase}, plan {gib(step_alloc)} at the "
                f"training step ({check['allocated_error'] * 100:+.1f}%)") in text
        assert f"rank {rank} steps vs the plan's step: peak allocated {gib(step_peak)}, plan {gib(step_alloc)}" in text
    assert "note: the log's peak is in its 'eval' rows" in text
    assert escape(par["note"]) in page and "<caption>Against the plan (ddp)</caption>" in page


def test_a_log_without_steps_is_held_whole_with_no_step_line_and_no_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan, doc = plan_file(tmp_path, capsys, "plan.json", *MODEL)
    allocated, process = doc["max_allocated_bytes"], doc["process_bytes"]
    # what `vramscope run` logs: readings without a step or a phase, the watched command's run as one stretch
    rows = [Row(None, None, scaled(allocated, 0.5 + k / 20), scaled(process, 0.5 + k / 20)) for k in range(10)]
    log = write_log(tmp_path / "run.csv", {0: rows}, ranked=False)
    data, text, page = report(capsys, log, plan)
    par = data["parallelism"]
    gpu0 = par["ranks"][0]
    assert par["note"] is None and gpu0["measured_peak_phase"] == "run"
    assert gpu0["measured_peak_allocated_bytes"] == max(r.peak_allocated for r in rows)
    assert gpu0["planned_peak_allocated_bytes"] == allocated
    assert all(gpu0[k] is None for k in ("measured_step_peak_allocated_bytes", "planned_step_peak_allocated_bytes",
                                          "step_allocated_error", "measured_step_device_bytes",
                                          "planned_step_process_bytes", "step_device_error"))
    assert "GPU 0 vs plan (single): peak allocated" in text and "steps vs the plan's step" not in text
    assert "<td>whole log</td>" in page and "<td>steps</td>" not in page


OLD_ONE_GPU_KEYS = ("max_allocated_bytes", "step_peak_phase", "phases", "step_phases", "trainer", "run", "events")
OLD_PER_GPU_KEYS = ("load_device_bytes", "load_moment", "peak_device_bytes", "loading_sets_peak")


def test_a_plan_from_before_the_whole_run_reads_with_its_step_figures_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, one = plan_file(tmp_path, capsys, "one.json", *MODEL)
    _, ddp = plan_file(tmp_path, capsys, "ddp.json", *MODEL, "--gpus", "2", "--strategy", "ddp")
    # the files as the planner wrote them before it planned loading and evaluation: no phases, no loading
    for key in OLD_ONE_GPU_KEYS:
        one.pop(key)
    for key in OLD_PER_GPU_KEYS:
        ddp.pop(key, None)
        for entry in ddp["gpus"]["plan"]["per_gpu"]:
            entry.pop(key)
    old_one, old_ddp = tmp_path / "old-one.json", tmp_path / "old-ddp.json"
    old_one.write_text(json.dumps(one), encoding="utf-8")
    old_ddp.write_text(json.dumps(ddp), encoding="utf-8")
    entry = ddp["gpus"]["plan"]["per_gpu"][0]

    for path, allocated, process in ((old_one, one["peak_allocated_bytes"], one["process_bytes"]),
                                     (old_ddp, entry["peak_allocated_bytes"], entry["process_bytes"])):
        saved = read_plan(path).per_gpu[0]
        assert (saved.peak_allocated_bytes, saved.process_bytes) == (allocated, process)
        assert not saved.whole_run and (saved.run_allocated_bytes, saved.run_process_bytes) == (allocated, process)
        rows = [Row(None, "start", allocated // 2, process // 2),
                *(Row(s, "train", scaled(allocated, 0.9 + s / 100), scaled(process, 0.9)) for s in range(1, 6))]
        log = write_log(tmp_path / f"{path.stem}.csv", {0: rows}, ranked=False)
        data, text, page = report(capsys, log, path)
        par = data["parallelism"]
        gpu0 = par["ranks"][0]
        assert par["plan_whole_run"] is False and "the plan gives the training step's figures only" in par["note"]
        assert gpu0["planned_peak_allocated_bytes"] == gpu0["planned_step_peak_allocated_bytes"] == allocated
        assert gpu0["planned_process_bytes"] == gpu0["planned_step_process_bytes"] == process
        assert gpu0["planned_peak_phase"] == "train"
        assert gpu0["allocated_error"] == error(gpu0["measured_peak_allocated_bytes"], allocated)
        assert "note: the plan gives the training step's figures only" in text and escape(par["note"]) in page
