"""The monitor names the strategy it sees (from a real DDP / FSDP2 wrapping over a gloo group, from the Trainer's
arguments, from accelerate's environment) beside its log, and `vramscope report --plan` holds each rank's peak
against the per-rank plan."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from vramscope.cli import main
from vramscope.training.strategy import detect_strategy

REPO = Path(__file__).resolve().parent.parent
DDP_LOG = REPO / "bench" / "results" / "ddp-qlora" / "ddp_memory.csv"

CHILD = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from vramscope.integrations.loop import MemoryMonitor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for name in ("ddp", "fsdp2"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        if name == "ddp":
            wrapped = DistributedDataParallel(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (1,))
            fully_shard(model[0], mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
        with MemoryMonitor(log=os.path.join(sys.argv[1], name + ".csv")) as mon:
            mon.note_strategy(wrapped)
            for step in range(2):
                wrapped(torch.randn(4, 8)).sum().backward()
                mon.step(step)
    dist.destroy_process_group()
""")


def test_a_real_ddp_and_fsdp2_wrapping_is_recorded_beside_the_log(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), port], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    ddp = json.loads((tmp_path / "ddp.strategy.json").read_text())
    assert ddp == {"strategy": "ddp", "implementation": "DistributedDataParallel", "world_size": 1,
                   "backend": "gloo", "source": "model wrapping"}
    fsdp = json.loads((tmp_path / "fsdp2.strategy.json").read_text())
    assert fsdp["strategy"] == "fsdp" and fsdp["implementation"] == "FSDP2 fully_shard"
    code = main(["report", str(tmp_path / "ddp.csv")])
    assert code == 0


def test_the_trainers_arguments_and_accelerates_environment_name_the_strategy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    fsdp = detect_strategy(None, SimpleNamespace(fsdp=["full_shard", "auto_wrap"], deepspeed=None))
    assert (fsdp.strategy, fsdp.source, fsdp.world_size) == ("fsdp", "TrainingArguments", 4)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert detect_strategy(None, SimpleNamespace(fsdp=[], deepspeed=str(ds))).strategy == "zero3"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert detect_strategy(None, SimpleNamespace(fsdp=[], deepspeed=None)).strategy == "zero2"
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    plain = detect_strategy(None, SimpleNamespace(fsdp=[], deepspeed=None))
    assert (plain.strategy, plain.source) == ("ddp", "process group")  # torchrun, 4 ranks, no config
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert detect_strategy().strategy == "single"


def test_report_holds_each_rank_against_the_per_rank_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The committed real two-GPU DDP job (TinyLlama-1.1B QLoRA, rank 0 at 4 x 1024 tokens), with the sidecar
    # its monitor writes now.
    log = tmp_path / "ddp_memory.csv"
    shutil.copy(DDP_LOG, log)
    (tmp_path / "ddp_memory.strategy.json").write_text(json.dumps(
        {"strategy": "ddp", "implementation": "DistributedDataParallel", "world_size": 2, "backend": "nccl",
         "source": "model wrapping"}))
    # bench/ddp_qlora.py's step keeps only the loss, without autocast: --framework loop-loss
    assert main(["plan", "--model", "TinyLlama-1.1B", "--batch-size", "4", "--seq-len", "1024", "--gpus", "2",
                 "--strategy", "ddp", "--gpu", "H200", "--framework", "loop-loss", "--json"]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(capsys.readouterr().out)
    assert main(["report", str(log), "--plan", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "strategy: DistributedDataParallel, 2 ranks, nccl (from the model wrapping)" in out
    assert "rank 0 vs plan (ddp): peak allocated" in out and "rank 1 vs plan (ddp)" in out
    assert main(["report", str(log), "--plan", str(plan), "--json"]) == 0
    par = json.loads(capsys.readouterr().out)["parallelism"]
    rank0 = par["ranks"][0]
    assert par["plan_strategy"] == "ddp" and par["note"] is None
    assert rank0["measured_peak_allocated_bytes"] == 4669473792  # what the H200 recorded for rank 0
    assert abs(rank0["allocated_error"]) < 0.1  # the plan for rank 0's shape within 10%


def test_a_bad_plan_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("[1, 2]")
    assert main(["report", str(DDP_LOG), "--plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "is not a plan" in err and "--gpus N --strategy S --json" in err and len(err.strip().splitlines()) == 1
    assert main(["report", str(DDP_LOG), "--plan", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_strategy_file_is_one_typed_record(tmp_path: Path) -> None:
    from vramscope.report.plan_check import strategy_beside
    from vramscope.types import RunStrategy

    seen = RunStrategy("zero3", "DeepSpeed ZeRO-3", 8, "nccl", "TrainingArguments")
    (tmp_path / "m.strategy.json").write_text(json.dumps(seen.to_json()))
    assert strategy_beside(tmp_path / "m.csv") == seen  # what the monitor writes, the report reads
    # A file edited by hand: a field of another type reads as unknown; without a strategy name it is no record.
    assert RunStrategy.from_json({"strategy": "ddp", "world_size": True, "backend": 3}) == RunStrategy("ddp")
    with pytest.raises(ValueError, match="no 'strategy'"):
        RunStrategy.from_json({"world_size": 2})
    (tmp_path / "bad.strategy.json").write_text(json.dumps({"world_size": 2}))
    assert strategy_beside(tmp_path / "bad.csv") is None
