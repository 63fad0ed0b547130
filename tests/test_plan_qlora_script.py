"""qlora.py (artidoro/qlora) as it really runs: its cast back to bf16 only under --bf16, its advice in its own flags.

``get_accelerate_model`` casts every LoraLayer, ``embed_tokens`` and ``lm_head`` back to bf16 only ``if args.bf16``
(with --fp16 it loads fp32 and casts nothing back), so ``--framework qlora`` (qlora.py --bf16) plans bf16 only and
a qlora.py command without --bf16 plans as hf, without that load moment. Its users write HfArgumentParser flags
(``--lora_r``, ``--per_device_train_batch_size``, ``--source_max_len``), not ``LoraConfig`` or
``TrainingArguments``: the ``qlora`` settings style."""

from __future__ import annotations

import json
import shlex

import pytest

from vramscope.cli import main

QLORA = ("python qlora.py --model_name_or_path huggyllama/llama-7b --output_dir ./output/guanaco-7b --lora_r 64 "
         "--lora_alpha 16 --double_quant --quant_type nf4 --bits 4 --gradient_checkpointing --dataset oasst1 "
         "--source_max_len 16 --target_max_len 512 --per_device_train_batch_size 4 --gradient_accumulation_steps 4 "
         "--lora_dropout 0.1")


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_framework_qlora_is_bf16_only_and_says_what_to_plan_instead(capsys: pytest.CaptureFixture[str],
                                                                     dtype: str) -> None:
    code, out, err = plan(capsys, "--model", "Llama-2-7B", "--framework", "qlora", "--compute-dtype", dtype,
                          "--batch-size", "1", "--seq-len", "512", "--gpu", "RTX-4090")
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1
    assert "qlora.py with --bf16" in err and f"--framework hf --compute-dtype {dtype}" in err
    code, out, _ = plan(capsys, "--model", "Llama-2-7B", "--framework", "qlora", "--batch-size", "1", "--seq-len",
                        "512", "--gpu", "RTX-4090")
    assert code == 0 and "at cast back to bf16" in out  # bf16, the flag qlora.py casts back under


def test_a_qlora_command_casts_back_only_under_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    moments = {}
    for flag in ("--bf16", "--fp16"):
        code, out, err = plan(capsys, "--model", "Llama-2-7B", "--gpu-memory", "24GiB", "--json", "--",
                              *shlex.split(QLORA), flag)
        assert code == 0, err
        doc = json.loads(out)
        moments[flag] = (doc["framework"], doc["phases"]["load"]["moments"])
    assert moments["--bf16"][0] == "qlora" and "cast back to bf16" in moments["--bf16"][1]
    assert moments["--fp16"][0] == "hf" and "cast back to bf16" not in moments["--fp16"][1]


@pytest.mark.parametrize("flag", ["--bf16", "--fp16"])
def test_advice_for_a_qlora_command_is_written_in_its_own_flags(capsys: pytest.CaptureFixture[str],
                                                                flag: str) -> None:
    # --bf16 plans as qlora, --fp16 as hf: both are qlora.py's command, and its users write its flags
    code, out, err = plan(capsys, "--model", "Llama-2-7B", "--gpu-memory", "6.5GiB", "--json", "--",
                          *shlex.split(QLORA), flag)
    assert code == 0, err
    recs = {r["name"]: r for r in json.loads(out)["recommendations"]}
    batch = recs["micro_batch"]["change"]
    assert recs["micro_batch"]["how"] == (f"--per_device_train_batch_size {batch['batch_size']} "
                                          f"--gradient_accumulation_steps {batch['grad_accum']}")
    length = recs["seq_len"]["change"]["seq_len"]
    assert recs["seq_len"]["how"].startswith(f"--source_max_len + --target_max_len = {length}")
    assert "(no flag for it)" in recs["lora_targets"]["how"]  # qlora.py targets every linear: find_all_linear_names
    if flag == "--fp16":
        assert recs["lora_rank"]["how"] == f"--lora_r {recs['lora_rank']['change']['lora_r']}"
    for rec in recs.values():
        assert "TrainingArguments(" not in rec["how"] and "LoraConfig(r=" not in rec["how"]
    # the terminal prints the same lines
    code, text, _ = plan(capsys, "--model", "Llama-2-7B", "--gpu-memory", "6.5GiB", "--", *shlex.split(QLORA), flag)
    assert code == 0 and f"        {recs['micro_batch']['how']}\n" in text


def test_framework_qlora_without_a_command_advises_in_qlora_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "--model", "Llama-2-7B", "--framework", "qlora", "--batch-size", "8", "--seq-len",
                        "2048", "--gpu", "RTX-4090", "--json")
    assert code == 0
    how = {r["name"]: r["how"] for r in json.loads(out)["recommendations"]}
    assert how["micro_batch"].startswith("--per_device_train_batch_size ")
