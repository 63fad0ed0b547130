"""The ``plan --json`` document has one owner, :mod:`vramscope.planner.document`: what the real CLI prints is what
``PlanDocument.to_json`` writes, ``from_json`` takes it apart and writes it back key for key, in the same order,
and ``report --plan`` reads its per-GPU figures through it from a file the real ``vramscope plan`` wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramscope.cli import main
from vramscope.cli.labels import totals_lines
from vramscope.cli.plan import format_plan
from vramscope.cli.plan_gpus import format_gpus
from vramscope.planner import plan
from vramscope.planner.api import resolve_model
from vramscope.planner.distributed import estimate_distributed, parallelism
from vramscope.planner.document import (
    PLAN_SCHEMA_VERSION,
    PlanDocument,
    PlanDocumentError,
    dataset_failure,
    plan_document,
)
from vramscope.planner.multigpu import fit_table
from vramscope.recipe import QLoraSpec
from vramscope.report.plan_check import PlanFileError, read_plan
from vramscope.units import GIB

MODEL = ["--model", "Llama-2-7B", "--batch-size", "4", "--seq-len", "2048"]
COMMAND = ["--", "trl", "sft", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "trl-lib/Capybara",
           "--use_peft", "--output_dir", "out"]
CASES = {
    "one GPU": MODEL,
    "with a capacity and a target batch": [*MODEL, "--gpu-memory", "24GiB", "--target-batch", "32"],
    "too large to fit": ["--model", "Llama-2-70B", "--batch-size", "8", "--seq-len", "4096", "--gpu", "RTX-4090"],
    "the whole DPO run": [*MODEL, "--trainer", "dpo", "--eval-batch", "8", "--gpu", "A100-80GB"],
    "a strategy table": [*MODEL, "--gpus", "2", "--gpu", "A100-40GB"],
    "FSDP per GPU": [*MODEL, "--gpus", "2", "--strategy", "fsdp", "--gpu", "RTX-4090"],
    "ZeRO-3 offload, no capacity": [*MODEL, "--gpus", "4", "--strategy", "zero3", "--offload", "optimizer"],
    "a split": [*MODEL, "--gpus", "3", "--strategy", "split", "--gpu", "RTX-4090", "--target-batch", "16"],
    "a pasted command": ["--gpu-memory", "24GiB", *COMMAND],
    "a pasted command over 2 GPUs": ["--gpu-memory", "24GiB", "--gpus", "2", "--strategy", "ddp", *COMMAND,
                                     "--per_device_train_batch_size", "4", "--max_length", "1024"],
}


def printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("argv", CASES.values(), ids=CASES.keys())
def test_the_cli_prints_the_document_and_it_reads_back_key_for_key(
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    text = printed(capsys, ["--json", *argv])  # before a pasted command's "--"
    data = json.loads(text)
    assert next(iter(data)) == "schema_version" and data["schema_version"] == PLAN_SCHEMA_VERSION
    doc = PlanDocument.from_json(data)
    assert doc.dumps() + "\n" == text  # every key, every value, the same order
    assert PlanDocument.from_json(doc.to_json()) == doc
    assert doc.engine == "analytic"
    # the parts are where the layout says they are
    assert (doc.gpus is not None) == ("--gpus" in argv) and (doc.command is not None) == ("--" in argv)
    if doc.gpus is not None and doc.gpus.largest is not None:
        largest = doc.gpus.largest
        assert data["per_gpu"] is True and data["peak_allocated_bytes"] == largest.peak_allocated_bytes
        assert doc.plan["peak_allocated_bytes"] == data["one_gpu"]["peak_allocated_bytes"]  # the one GPU's own
        assert largest.device_bytes == data["gpus"]["plan"]["worst_device_bytes"]


def test_the_dataset_part_reads_back_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tokenizers")
    from dataset_tokenizer import make_tokenizer, words

    tok = make_tokenizer(tmp_path / "tok")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": words(40 + 30 * i, i)}) + "\n" for i in range(20)), encoding="utf-8")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\nnot json\n', encoding="utf-8")
    for argv in (["--seq-len", "1024", "--dataset", str(data), "--tokenizer", str(tok), "--framework", "trl"],
                 ["--seq-len", "1024", "--dataset", str(data), "--tokenizer", str(tok), "--gpus", "2",
                  "--strategy", "ddp"],
                 ["--seq-len", "2048", "--dataset", str(broken)]):
        text = printed(capsys, ["--json", "--model", "Llama-2-7B", "--batch-size", "4", *argv])
        doc = PlanDocument.from_json(json.loads(text))
        assert doc.dataset is not None and doc.dumps() + "\n" == text
    assert doc.dataset == dataset_failure(str(broken), doc.dataset["error"], 4, 2048)
    assert "not JSON" in str(doc.dataset["error"])


def test_a_document_built_from_the_planners_results_round_trips() -> None:
    spec = QLoraSpec()
    one = plan("Llama-2-13B", 2, 4096, spec, gpu="A100-40GB")
    _, shape = resolve_model("Llama-2-13B")
    dist = estimate_distributed(shape, spec, 2, 4096, parallelism(2, "fsdp", "params", layers=shape.layers))
    table = fit_table(shape, spec, 2, 4096, 2, 40 * 10**9, None)
    for doc in (plan_document(one), plan_document(one, table=table),
                plan_document(one, distributed=dist, table=table,
                              dataset=dataset_failure("data.jsonl", "data.jsonl:2: not JSON", 2, 4096))):
        again = PlanDocument.from_json(json.loads(doc.dumps()))
        assert again == doc and again.to_json() == doc.to_json()
    assert doc.gpus is not None and doc.gpus.largest is not None
    assert doc.gpus.largest.strategy == "fsdp" and doc.gpus.largest.offload == "params"
    assert doc.to_json()["host_bytes_machine"] == dist.host_bytes > 0  # params offloaded to the host
    planned = doc.planned()
    assert planned is not None and planned.strategy == "fsdp" and planned.world_size == 2
    assert [g.peak_allocated_bytes for g in planned.per_gpu] == [r.peak_allocated_bytes for r in dist.ranks]


@pytest.mark.slow
def test_a_traced_plan_is_the_same_document() -> None:
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from vramscope.cli.plan_trace import format_trace
    from vramscope.planner.trace.engine import trace_plan

    tiny = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 256}
    traced = trace_plan(tiny, 1, 16, QLoraSpec(lora_r=8, framework="loop"), gpu="RTX-4090")
    doc = plan_document(traced)
    assert doc.engine == "trace" and doc.gpus is None
    assert PlanDocument.from_json(json.loads(doc.dumps())) == doc
    planned = doc.planned()
    assert planned is not None and planned.strategy == "single"
    assert planned.per_gpu[0].peak_allocated_bytes == traced.peak_allocated_bytes
    assert "\n".join(totals_lines(traced)) in format_trace(traced)  # the same block as the analytic plan's


def vramscope_plan(tmp_path: Path, name: str, *argv: str) -> Path:
    """The real ``vramscope plan ... --json > name``, in a child process."""
    out = tmp_path / name
    with open(out, "w", encoding="utf-8") as f:
        done = subprocess.run([sys.executable, "-m", "vramscope", "plan", *argv, "--json"], stdout=f,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return out


def test_report_reads_a_plan_the_real_cli_wrote(tmp_path: Path) -> None:
    fsdp = vramscope_plan(tmp_path, "fsdp.json", *MODEL, "--gpus", "2", "--strategy", "fsdp", "--gpu", "RTX-4090")
    data: dict[str, Any] = json.loads(fsdp.read_text(encoding="utf-8"))
    saved = read_plan(fsdp)
    assert saved.strategy == "fsdp" and saved.world_size == 2
    assert [(g.peak_allocated_bytes, g.process_bytes) for g in saved.per_gpu] == [
        (r["peak_allocated_bytes"], r["process_bytes"]) for r in data["gpus"]["plan"]["per_gpu"]]

    split = read_plan(vramscope_plan(tmp_path, "split.json", *MODEL, "--gpus", "3", "--strategy", "split"))
    assert split.strategy == "split" and split.world_size == 3 and len(split.per_gpu) == 3  # one entry per GPU
    assert len({g.peak_allocated_bytes for g in split.per_gpu}) > 1  # the first and last GPUs hold more

    one_path = vramscope_plan(tmp_path, "one.json", *MODEL, "--gpu", "RTX-4090")
    one = json.loads(one_path.read_text(encoding="utf-8"))
    single = read_plan(one_path)
    assert single.strategy == "single" and single.world_size == 1
    assert single.per_gpu[0].peak_allocated_bytes == one["peak_allocated_bytes"] > GIB
    # a strategy table without --strategy: the one-GPU plan's figures, as before
    table = read_plan(vramscope_plan(tmp_path, "table.json", *MODEL, "--gpus", "2", "--gpu", "RTX-4090"))
    assert table.strategy == "single" and table.per_gpu == single.per_gpu


def test_what_is_not_a_plan_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PlanDocumentError):
        PlanDocument.from_json([1, 2])
    assert PlanDocument.from_json({"model": "x"}).planned() is None  # an object, but no figures in it
    for text, says in (("[1, 2]", "is not a plan"), ('{"model": "x"}', "holds no per-GPU figures")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(PlanFileError, match=says) as caught:
            read_plan(bad)
        assert "\n" not in str(caught.value)


def test_every_plan_ends_with_the_same_totals_block() -> None:
    spec = QLoraSpec()
    one = plan("Llama-2-7B", 4, 2048, spec)
    assert "\n".join(totals_lines(one)) in format_plan(one)
    _, shape = resolve_model("Llama-2-7B")
    dist = estimate_distributed(shape, spec, 4, 2048, parallelism(2, "ddp", layers=shape.layers))
    table = fit_table(shape, spec, 4, 2048, 2, None, None)
    assert "\n".join(totals_lines(dist.worst)) in format_gpus(one, dist, table)
    allocated = f"{one.peak_allocated_bytes / GIB:.2f} GiB"
    assert totals_lines(one)[0] == f"  peak allocated (torch.cuda.max_memory_allocated) {allocated:>11}"
