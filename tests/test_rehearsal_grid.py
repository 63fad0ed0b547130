"""bench/rehearsal_grid.py and bench/h200/rehearsal_grid.sh on the CPU (issue 27): the dry run builds every case's
command and plan and both TRL rehearsal commands, which vramscope reads as FSDP1 over accelerate and DDP over
torchrun; one real case child (the 70B path: built on meta, quantized per layer) runs on the CPU as rank 0 of 4
on the fake group and holds a quarter of the parameters; the results table says what each row is."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import rehearsal_grid as grid  # noqa: E402
from vramscope.commands import parse_command  # noqa: E402
from vramscope.tune.rehearse import worker_of  # noqa: E402


def run_tiny_case(case: grid.Case) -> dict[str, Any]:
    """The grid's child for ``case`` on the CPU (a tiny 4-bit Llama), as the H200 runs it; its RESULT, checked ok."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(grid.child_command(case, None, tiny=True), env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    assert result["status"] == "ok", result.get("error")
    return result


def test_the_grid_covers_every_strategy_world_size_and_offload() -> None:
    cases = grid.cases(["7b", "13b", "70b"], grid.WORLDS, tiny=False)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) == 24
    for arch in ("7b", "13b"):
        for w in (2, 4, 8, 16):
            assert f"{arch}-fsdp{w}" in names and f"{arch}-fsdp{w}-offload" in names
        assert f"{arch}-ddp2" in names
    assert {c.world_size for c in cases if c.arch == "70b"} == {2, 4, 8}
    assert {c.build for c in cases if c.arch == "70b"} == {"meta"} and "70b-ddp2" not in names
    # World size by world size: the budget's end cuts 16 ranks first.
    assert [c.world_size for c in cases] == sorted(c.world_size for c in cases)


def test_the_dry_run_builds_every_command_and_the_trl_rehearsals(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(["bash", str(ROOT / "bench/h200/rehearsal_grid.sh"), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "24 cases" in proc.stdout and "grid exit 0" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if "--child" in ln]
    assert len(lines) == 24
    for line in lines:
        case = grid.Case(**json.loads(line.split("--child ", 1)[1].split(" --ckpt")[0]))
        plan = grid.plan(case, grid.config_of(case.arch))
        assert f"plan alloc {plan['planned_peak_allocated_bytes'] / 2**30:6.2f} GiB" in line
        assert (plan["planned_host_bytes"] > 0) == (case.offload == "params")
    # Both TRL commands, as the script would run them: vramscope reads them as the run they describe.
    commands = (tmp_path / "out" / "trl.commands").read_text().splitlines()
    assert [c.split()[0] for c in commands] == ["accelerate_fsdp", "torchrun_ddp"]
    folder = Path(commands[0].split("--config_file ")[1].split()[0]).parent
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text(json.dumps({**grid.TRL_ARCH, "architectures": ["LlamaForCausalLM"]}))
    (folder / "fsdp.yaml").write_text(grid.FSDP_YAML)
    seen = {}
    for line in commands:
        name, _, text = line.partition(" ")
        argv = shlex.split(text)
        assert argv[1:6] == ["-m", "vramscope", "tune", "--gpus", "2"]
        parsed = parse_command(argv[argv.index("--") + 1:])
        launch = worker_of(parsed, 2)
        assert launch.argv[1:4] == ("-u", "-m", "trl.scripts.sft") and parsed.spec.bits == 4
        seen[name] = (launch.strategy, launch.fsdp_version, launch.env.get("FSDP_USE_ORIG_PARAMS"))
    assert seen == {"accelerate_fsdp": ("fsdp", 1, "false"), "torchrun_ddp": ("ddp", None, None)}


@pytest.mark.slow  # one child with transformers, peft and bitsandbytes: about 25 s here
def test_a_case_built_on_meta_runs_as_rank_0_of_4_and_holds_a_quarter(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    case = grid.Case("tiny", "fsdp", 4, "none", 2, 32, "meta")
    result = run_tiny_case(case)
    assert result["backend"] == "fake" and result["parameters_held"] * 4 == result["parameters"]
    row = grid.row(case, result, grid.plan(case, grid.config_of("tiny")))
    assert (row["how"], row["rank"], row["world_size"], row["strategy"]) == ("fake_pg", 0, 4, "fsdp")
    for key in ("arch", "batch", "seq", "offload", "measured_peak_allocated_bytes", "planned_peak_allocated_bytes",
                "measured_host_bytes", "planned_host_bytes"):
        assert key in row
    table = grid.table([row])
    assert "| tiny | FSDP | 4 | none |" in table and table.count("\n") == 2
