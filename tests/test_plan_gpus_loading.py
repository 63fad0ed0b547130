"""`plan --gpus N`: loading the model is part of every strategy's per-GPU figure and of its fit.

Each strategy loads as transformers 5 / accelerate / torch do it (planner/parallel_loading.py): every data-parallel
rank of a 4-bit model loads it whole onto its own GPU before the wrapper shards it; a 16-bit model under FSDP or
ZeRO-3 loads on the host and is brought to the GPU unit by unit; a split loads each GPU's own layers. The table,
its "which way" lines, `--strategy`'s verdict and `--json` take the larger of loading and the step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramscope.cli import main
from vramscope.planner.loading import at_moment
from vramscope.units import gib

GIB = 1024**3
BEFORE = Path(__file__).parent / "data" / "plan_gpus_before"
MIXTRAL = ("--model", "Mixtral-8x7B", "--batch-size", "1", "--seq-len", "1024", "--gpus", "2", "--gpu", "H100")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    assert not out.err or code == 0, out.err
    return code, out.out


def rows_of(doc: dict) -> dict[tuple[str, str], dict]:
    return {(r["strategy"], r["offload"]): r for r in doc["gpus"]["table"]["strategies"]}


def test_mixtral_offload_no_longer_fits_one_gpu_because_every_rank_loads_the_whole_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "FSDP + params offload on 1 GPU fits ... 16.85 GiB", while one GPU's loading alone holds far more
    code, text = run(capsys, *MIXTRAL)
    assert code == 0
    assert "FSDP + params offload on 1 GPU fits" not in text
    code, out = run(capsys, *MIXTRAL, "--json")
    doc = json.loads(out)
    cap = doc["gpus"]["table"]["capacity_bytes"]
    rows = rows_of(doc)
    offload = rows[("fsdp", "params")]
    assert offload["step_device_bytes"] <= cap < offload["load_device_bytes"]  # the step alone would fit
    assert offload["loading_sets_peak"] is True and offload["device_bytes"] == offload["load_device_bytes"]
    assert offload["fits"] is False and offload["min_gpus"] is None and offload["max_batch_size"] == 0
    # the terminal says which part sets the figure, and the reason it does not fit
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("FSDP + params offload "))
    assert gib(offload["device_bytes"]) in line and "loading sets it" in line
    assert gib(offload["step_device_bytes"]) in line
    assert (f"FSDP + params offload does not fit at micro-batch 1: it needs GPUs of "
            f"{offload['device_bytes'] / GIB:.1f} GiB at 2 GPUs to load the model") in text
    # the loader planned is said, and the one that is not
    assert "is not modelled" in text and doc["gpus"]["table"]["notes"] == [text.split("  note: ")[-1].strip()]
    # a data-parallel rank loads what one GPU loads: the one-GPU plan's load phase, to the byte
    one_gpu_load = doc["phases"]["load"]["process_bytes"]
    assert rows[("zero3", "none")]["load_device_bytes"] == one_gpu_load
    assert rows[("ddp", "none")]["load_device_bytes"] == one_gpu_load
    # FSDP1 flattens a unit beside the whole model as it wraps: more than one GPU's loading
    assert rows[("fsdp", "none")]["load_device_bytes"] > one_gpu_load
    assert rows[("fsdp", "none")]["load_moment"] == "FSDP flattens a unit"
    # a split loads each GPU's own layers: less than the whole model on any one of them
    assert 0 < rows[("split", "none")]["load_device_bytes"] < one_gpu_load


def test_one_gpus_ways_out_offer_a_split_not_fsdp_whose_ranks_each_load_the_whole_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "use 3 GPUs with FSDP ... up to micro-batch 7 each" and "offload the parameters ... on this GPU"
    code, text = run(capsys, *MIXTRAL[:6], "--gpu", "H100")
    assert code == 0
    ways = text.split("what would fit:")[1]
    assert "with FSDP" not in ways and "offload the parameters" not in ways
    code, out = run(capsys, *MIXTRAL, "--strategy", "split", "--json")
    table = rows_of(json.loads(out))[("split", "none")]
    assert (f"split the layers over {table['min_gpus']} GPUs" in ways
            and f"up to micro-batch {table['max_batch_size_at_min_gpus']}" in ways)


def test_the_per_gpu_plan_says_loading_sets_its_peak_and_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    flags = (*MIXTRAL, "--strategy", "fsdp", "--offload", "params")
    code, text = run(capsys, *flags)
    code_json, out = run(capsys, *flags, "--json")
    doc = json.loads(out)
    assert code == code_json == 0
    gpu = doc["gpus"]["plan"]["per_gpu"][0]
    assert gpu["loading_sets_peak"] is True and gpu["peak_device_bytes"] == gpu["load_device_bytes"]
    assert doc["gpus"]["plan"]["worst_peak_device_bytes"] == gpu["load_device_bytes"]
    assert "every rank loads the whole 4-bit model onto its own GPU" in doc["gpus"]["plan"]["loading"]
    # the top level (the largest GPU, as the terminal prints it) fits on the peak, loading included
    assert doc["fits"] is False and doc["load_device_bytes"] == gpu["load_device_bytes"]
    assert doc["loading_sets_peak"] is True and doc["device_bytes"] == gpu["device_bytes"]
    held = f"loading the model holds more: {gib(gpu['load_device_bytes'])} on each GPU {at_moment(gpu['load_moment'])}"
    assert held in text
    assert "  does NOT fit in 79.65 GiB per GPU" in text


@pytest.mark.parametrize(("name", "flags"), [
    ("table_llama2_7b_8x4096_a100", ("--gpus", "2", "--gpu", "A100-80GB")),
    ("fsdp_llama2_7b_8x4096_a100", ("--gpus", "2", "--gpu", "A100-80GB", "--strategy", "fsdp")),
    ("ddp_llama2_7b_8x4096_a100", ("--gpus", "2", "--gpu", "A100-80GB", "--strategy", "ddp")),
    ("zero3_llama2_7b_8x4096_a100", ("--gpus", "2", "--gpu", "A100-80GB", "--strategy", "zero3")),
    ("split4_llama2_7b_8x4096_a100", ("--gpus", "4", "--gpu", "A100-80GB", "--strategy", "split")),
])
def test_a_dense_plan_whose_step_dominates_prints_what_it_printed_before(
        capsys: pytest.CaptureFixture[str], name: str, flags: tuple[str, ...]) -> None:
    # the files are this command's output at 2573deb, before loading was planned per GPU
    argv = ("--model", "Llama-2-7B", "--batch-size", "8", "--seq-len", "4096", *flags)
    code, text = run(capsys, *argv)
    assert code == 0 and text == (BEFORE / f"{name}.txt").read_text()
    code, out = run(capsys, *argv, "--json")
    doc = json.loads(out)
    for row in doc["gpus"]["table"]["strategies"]:  # loading is planned, and below the step everywhere
        assert 0 < row["load_device_bytes"] < row["step_device_bytes"] == row["device_bytes"]
        assert row["loading_sets_peak"] is False


def test_a_plan_without_a_gpu_size_prints_what_it_printed_before(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run(capsys, "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "1024", "--gpus", "2")
    assert code == 0 and text == (BEFORE / "table_llama2_7b_2x1024_no_gpu.txt").read_text()


def test_a_16_bit_model_under_fsdp_loads_on_the_host_and_holds_its_shards(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--bits", "16", "--gpus", "4")
    code, out = run(capsys, *argv, "--strategy", "fsdp", "--json")
    doc = json.loads(out)
    assert code == 0
    plan = doc["gpus"]["plan"]
    assert plan["loading"].startswith("loads on the host")
    assert plan["per_gpu"][0]["load_moment"] == "wrapping, unit by unit"
    rows = rows_of(doc)
    # DDP puts a whole 16-bit copy on each GPU; FSDP only its shards and the unit it wraps
    assert rows[("fsdp", "none")]["load_device_bytes"] < rows[("ddp", "none")]["load_device_bytes"] / 2
    assert rows[("ddp", "none")]["load_device_bytes"] == doc["phases"]["load"]["process_bytes"]
