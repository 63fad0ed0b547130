"""When loading the model holds more than the card (planner/loading.py's ``load`` phase), the plan says so, and its
advice is judged against the whole run: a change to the step's batch or length does not lower what loading holds.

Each test drives the real CLI (``python -m vramscope plan``) or the real API on the registry's shapes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from vramscope.planner import plan
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB

SRC = Path(__file__).resolve().parents[1] / "src"


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, "-m", "vramscope", "plan", *argv], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


# Mixtral-8x7B under TRL at 1 x 256: loading (86.73 GiB at from_pretrained) holds more than the step (86.34 GiB)
MIXTRAL = ("--model", "Mixtral-8x7B", "--batch-size", "1", "--seq-len", "256", "--framework", "trl")
# qlora.py's cast back on Llama-3-8B: loading 9.61 GiB, the 4 x 512 step 11.20 GiB
QLORA = ("--model", "Llama-3-8B", "--batch-size", "4", "--seq-len", "512", "--framework", "qlora")


def _json(*argv: str) -> dict[str, Any]:
    done = _cli("--json", *argv)  # before any "--" and its command
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def test_loading_alone_overflowing_says_loading_not_a_no_grad_forward() -> None:
    # 86.5 GiB: the step (86.3 GiB) fits, loading (86.7 GiB) does not
    done = _cli(*MIXTRAL, "--gpu-memory", "86.5GiB")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert ("does NOT fit in 86.50 GiB; no batch or sequence length fits: loading the model alone overflows "
            "the GPU") in out
    why = next(line for line in out.splitlines() if line.startswith("  why:"))
    assert "loading the model needs 86.7 GiB at from_pretrained, before the first step" in why
    assert "84.5 GiB of weights left unquantized" in why
    assert "no-grad forward" not in out and "beside the load phase" not in out
    doc = _json(*MIXTRAL, "--gpu-memory", "86.5GiB")
    assert doc["fits"] is False and doc["peak_phase"] == "load" and doc["max_batch_size"] == 0
    assert doc["cannot_fit_reason"] == why.removeprefix("  why: ")


def test_step_advice_is_not_enough_where_loading_alone_overflows() -> None:
    # 9.5 GiB: the step (11.2) and loading (9.61) both overflow; a smaller micro-batch brings the step to 9.6 GiB at
    # best (it was marked sufficient against the step alone, beside "no batch fits")
    doc = _json(*QLORA, "--gpu-memory", "9.5GiB")
    load = doc["phases"]["load"]["process_bytes"]
    assert load > 9.5 * GIB and doc["max_batch_size"] == 0
    recs = {r["name"]: r for r in doc["recommendations"]}
    for name in ("micro_batch", "seq_len", "expandable_segments", "lora_rank"):
        assert recs[name]["sufficient"] is False, name
    # the batch's saving stops at what loading holds: the run's peak goes from the step's to loading's
    assert recs["micro_batch"]["saving_bytes"] == doc["process_bytes"] - load
    # TRL's SFTTrainer loads without the fp32 upcast: it lowers the loading too, and is enough
    assert recs["framework"]["sufficient"] is True
    assert "and loading the model needs 9.6 GiB at cast back to bf16" in doc["cannot_fit_reason"]
    out = _cli(*QLORA, "--gpu-memory", "9.5GiB").stdout
    assert "no batch or sequence length fits: loading the model alone overflows the GPU" in out


def test_a_peak_set_by_loading_offers_no_saving_of_the_step_alone() -> None:
    # Mixtral under TRL: expandable segments shrink the step's fragments, 0.04 GiB, but loading stays the peak
    p = plan("Mixtral-8x7B", 1, 256, QLoraSpec(framework="trl"))
    assert p.run_peak_phase == "load"
    assert "expandable_segments" not in [r.name for r in p.recommendations]
    assert "to use less memory" not in _cli(*MIXTRAL).stdout
    # every saving offered is what the run's peak (the larger of loading and the step) drops by
    q = plan("Llama-3-8B", 1, 256, QLoraSpec(framework="qlora"))
    assert q.run is not None and q.run_peak_phase == "load"
    names = [r.name for r in q.recommendations]
    assert "seq_len" not in names and "expandable_segments" not in names  # the step's alone: loading is untouched
    assert "lora_targets" in names  # fewer adapters: fewer fp32 adapters beside the cast-back embedding


def test_a_step_peak_keeps_its_savings() -> None:
    # loading far below the step: the savings are the step's, as before loading was a phase
    p = plan("Llama-2-7B", 8, 2048, QLoraSpec(), gpu="RTX-4090")
    assert p.run is not None and p.run_peak_phase == "train"
    step = p.run.phases["train"].device_bytes
    load = p.run.phases["load"].device_bytes
    for rec in p.recommendations:
        assert rec.saving_bytes <= step - load or rec.name in ("more_gpus", "cpu_offload")
    assert {"micro_batch", "seq_len"} <= {r.name for r in p.recommendations}


# qlora.py's guanaco-7b command (tests/data/commands/qlora_guanaco_7b.yaml, trimmed to the flags that plan it)
GUANACO = ("python qlora.py --model_name_or_path huggyllama/llama-7b --output_dir ./output/guanaco-7b "
           "--evaluation_strategy steps --per_device_eval_batch_size 1 --lora_r 64 --lora_alpha 16 --lora_modules all "
           "--double_quant --quant_type nf4 --bf16 --bits 4 --gradient_checkpointing --dataset oasst1 "
           "--source_max_len 16 --target_max_len 512 --per_device_train_batch_size 1 "
           "--gradient_accumulation_steps 16 --lora_dropout 0.1")


def test_a_command_whose_loading_sets_the_peak_keeps_its_ways_out() -> None:
    # loading (5.67 GiB at qlora.py's cast back) is the peak and overflows 5.5 GiB, the step too: the plan said
    # why and offered nothing (the step's advice was dropped as for a peak set by evaluation)
    done = _cli("--model", "Llama-2-7B", "--gpu-memory", "5.5GiB", "--", *shlex.split(GUANACO))
    assert done.returncode == 0, done.stderr
    assert "loading the model needs 5.7 GiB at cast back to bf16" in done.stdout
    assert "  what would fit:" in done.stdout and "lower the LoRA rank from 64 to 16" in done.stdout
    doc = _json("--model", "Llama-2-7B", "--gpu-memory", "5.5GiB", "--", *shlex.split(GUANACO))
    assert doc["peak_phase"] == "load" and doc["fits"] is False
    assert {"lora_rank", "framework", "more_gpus"} <= {r["name"] for r in doc["recommendations"]}
    # more GPUs as a split: every FSDP rank would load the whole 4-bit model first, as this one GPU does
    # (parallel_loading), where a split loads each GPU's own layers
    more = next(r for r in doc["recommendations"] if r["name"] == "more_gpus")
    assert more["change"]["strategy"] == "split"
