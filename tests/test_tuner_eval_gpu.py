"""tune -- <command> with the command's evaluation on a real GPU (issue 28 item 8; run on the H200).

An HF Trainer script of the usual shape (HfArgumentParser, its own eval set, compute_metrics) on a small random
Llama with a 32k vocabulary, so that the logits an evaluation keeps are large beside the model: with the logits
kept the evaluation sets the peak at a small batch, with the loss only the training step does."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.commands import parse_command
from vramscope.tune.command import SearchSettings, run_trial_child, tune_command
from vramscope.tune.command_trial import TrialRequest

pytestmark = pytest.mark.gpu

GIB = 1024**3
SEQ = 512
EVAL_ROWS = 8
EVAL_EXAMPLES = 24  # 3 eval batches of 8: each [8, 512, 32000] fp32 logits, 0.5 GiB, held to the end

SCRIPT = textwrap.dedent("""
    from dataclasses import dataclass
    import torch
    from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    @dataclass
    class Extra:
        model_name_or_path: str = "random"
        max_seq_length: int = 512
        metric: bool = False
        eval_examples: int = 24

    extra, args = HfArgumentParser((Extra, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                         num_attention_heads=8, num_key_value_heads=4, vocab_size=32000,
                                         max_position_embeddings=4096)).to(torch.bfloat16)

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n):
            self.rows = [torch.randint(0, 32000, (extra.max_seq_length,)) for _ in range(n)]
        def __len__(self):
            return len(self.rows)
        def __getitem__(self, i):
            return {"input_ids": self.rows[i], "labels": self.rows[i]}

    trainer = Trainer(model=model, args=args, train_dataset=Rows(64), eval_dataset=Rows(extra.eval_examples),
                      compute_metrics=(lambda p: {"n": float(len(p.predictions))}) if extra.metric else None)
    trainer.train()
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpu_eval") / "train_eval.py"
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def _argv(script: Path, out: Path, *flags: str) -> list[str]:
    return [sys.executable, str(script), "--output_dir", str(out), "--per_device_train_batch_size", "1",
            "--per_device_eval_batch_size", str(EVAL_ROWS), "--eval_strategy", "steps", "--eval_steps", "5",
            "--max_steps", "20", "--report_to", "none", "--bf16", "--max_seq_length", str(SEQ),
            "--eval_examples", str(EVAL_EXAMPLES), *flags]


def test_a_trial_measures_its_evaluation_with_the_logits_kept(tmp_path: Path, script: Path) -> None:
    request = TrialRequest(batch_size=1, seq_len=SEQ, max_steps=2, record=str(tmp_path / "t.json"),
                           eval_batch_size=EVAL_ROWS)
    kept = run_trial_child(_argv(script, tmp_path / "o", "--metric", "true"), request,
                           log_path=str(tmp_path / "t.log"), timeout_s=600)
    record = json.loads((tmp_path / "t.json").read_text())
    evaluation = record["eval"]
    assert evaluation["status"] == "done" and evaluation["logits"] == "kept"
    assert evaluation["steps_run"] == evaluation["steps_held"] == 3 and evaluation["extrapolated_steps"] == 0
    assert evaluation["inputs"] == [[EVAL_ROWS, SEQ]] * 3
    logits = EVAL_ROWS * SEQ * 32000 * 4
    # Three batches of logits held and, at the last concatenation, copied: at least 3 batches above the step.
    assert kept.phases.eval_allocated is not None and kept.phases.train_allocated is not None
    assert kept.phases.eval_allocated - record["base_allocated_bytes"] > 3 * logits
    assert kept.phases.phase == "eval" and kept.trial.peak_bytes == kept.phases.eval_allocated

    loss_request = TrialRequest(batch_size=1, seq_len=SEQ, max_steps=2, record=str(tmp_path / "l.json"),
                                eval_batch_size=EVAL_ROWS)
    loss = run_trial_child(_argv(script, tmp_path / "o2"), loss_request, log_path=str(tmp_path / "l.log"),
                           timeout_s=600)
    assert loss.record.status == "done"
    assert json.loads((tmp_path / "l.json").read_text())["eval"]["logits"] == "none"
    assert loss.phases.eval_allocated is not None and kept.phases.eval_allocated > loss.phases.eval_allocated + logits


def test_tune_names_the_evaluation_that_limits_the_batch(tmp_path: Path, script: Path) -> None:
    parsed = parse_command(_argv(script, tmp_path / "o", "--metric", "true"), cwd=tmp_path)
    assert parsed.eval.evaluates and parsed.eval.per_device_eval_batch_size == EVAL_ROWS
    result = tune_command(parsed, SearchSettings(max_trials=4, timeout_s=600), memory_limit_bytes=8 * GIB)
    out = result.to_dict()
    assert out["limiting_phase"] in ("train", "eval")
    assert out["limit"]["words"].startswith(f"batch {result.batch_size} fits")
    peaks = out["phase_peaks"]
    assert peaks["eval"]["logits"] == "kept" and peaks["eval"]["batch_size"] == EVAL_ROWS
    assert peaks["eval"]["peak_reserved_bytes"] is not None and peaks["train"]["peak_reserved_bytes"] is not None
    # Every trial ran its evaluation at the command's eval batch, whatever the batch tried.
    assert all(t.phases.eval is not None and t.phases.eval.batch_size == EVAL_ROWS for t in result.trials)
