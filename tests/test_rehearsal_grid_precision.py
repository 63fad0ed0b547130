"""bench/rehearsal_grid.py's two precisions (issue 27): the loop without autocast is planned as the planner's
``loop-loss`` framework (the committed grid), the loop under bf16 autocast as ``hf`` (the HF Trainer's run), each
into its own results file; a tiny case runs under autocast on the CPU as rank 0 of 4 on the fake group."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import multigpu_compare as compare  # noqa: E402
import rehearsal_grid as grid  # noqa: E402
from test_rehearsal_grid import run_tiny_case  # noqa: E402


def test_each_precision_is_planned_as_the_framework_that_runs_it() -> None:
    fp32 = grid.cases(["7b", "70b"], (2,), tiny=False)
    autocast = grid.cases(["7b", "70b"], (2,), tiny=False, precision="autocast")
    assert [c.name + "-autocast" for c in fp32] == [c.name for c in autocast]
    for a, b in zip(fp32, autocast, strict=True):
        pa, pb = grid.plan(a, grid.config_of(a.arch)), grid.plan(b, grid.config_of(b.arch))
        assert (pa["planned_framework"], pb["planned_framework"]) == ("loop-loss", "hf")
        if a.arch == "70b":
            # fp32 grouped-query attention goes to SDPA's math kernel (S x S scores); autocast's half inputs do not
            assert pa["planned_peak_allocated_bytes"] > pb["planned_peak_allocated_bytes"] + (1 << 30)
    assert grid.grid_file_name("fp32") == "rehearsal_grid.json"
    assert grid.grid_file_name("autocast") == "rehearsal_grid_autocast.json"
    assert compare.points_file(Path("r/rehearsal_grid_autocast.json")) == Path("r/points_autocast.json")
    assert compare.points_file(Path("r/rehearsal_grid.json")) == Path("r/points.json")
    # A row without a precision (the grid measured before the field existed) is the fp32 loop.
    row = {"arch": "Llama-2-7B", "strategy": "fsdp", "world_size": 2, "offload": "none", "batch": 1, "seq": 2048}
    assert compare.case_of(row).precision == "fp32"
    assert compare.case_of({**row, "precision": "autocast"}) == autocast[0]


@pytest.mark.slow  # one child with transformers, peft and bitsandbytes: about 30 s here
def test_a_tiny_case_runs_under_autocast_as_rank_0_of_4(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    case = grid.Case("tiny", "fsdp", 4, "none", 2, 32, "meta", "autocast")
    result = run_tiny_case(case)
    assert result["precision"] == "autocast" and result["parameters_held"] * 4 <= result["parameters"] + 4096
    assert len(result["rss_steps_bytes"]) == 3 and result["host_pinned_bytes"] is None  # no CUDA here
    assert result["host_optimizer_cpu_bytes"] > 0  # on the CPU every AdamW state is a CPU tensor
