"""Trial children of `vramscope tune -- CMD`, on the CPU: the user's real command, started with VRAMSCOPE_TRIAL,
trains at the overridden batch and length for the overridden steps, records them, and exits before anything
after train() runs; an out-of-memory error ends that child only; other failures are reported, never hidden.

The memory figures need CUDA (tests/test_command_tuner_gpu.py); everything else is checked here for real.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vramscope.run.inject import SITE_DIR
from vramscope.tune.command import TrialFailed, child_environment, run_trial_child
from vramscope.tune.command_trial import ENV_TRIAL, TrialRequest, record_path, shape_batch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
PY = sys.executable


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tiny") / "model"
    words = [f"w{i}" for i in range(120)]
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                            eos_token="</s>").save_pretrained(out)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=len(vocab), max_position_embeddings=256,
                         pad_token_id=0, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(out)
    data = out.parent / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w", encoding="utf-8") as f:
        for i in range(12):
            f.write(json.dumps({"text": " ".join(words[(i * 7 + j) % 120] for j in range(4 + i))}) + "\n")
    return out


def request(tmp_path: Path, **kw: int | None) -> TrialRequest:
    fields = {"batch_size": 3, "seq_len": 40, "max_steps": 2, **kw}
    return TrialRequest(record=str(tmp_path / "trial.json"), **fields)  # type: ignore[arg-type]


@pytest.mark.slow  # a child Python that imports transformers and peft: 10-20 s here
def test_an_hf_trainer_script_trains_at_the_trial_shape_and_exits(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "out"
    argv = [PY, str(EXAMPLE), "--model_name_or_path", str(tiny_model), "--output_dir", str(out),
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4", "--max_steps", "50",
            "--max_seq_length", "16", "--save_steps", "1", "--eval_strategy", "steps", "--eval_steps", "1",
            "--report_to", "none", "--use_cpu", "--rows", "5"]
    outcome = run_trial_child(argv, request(tmp_path), log_path=str(tmp_path / "trial.log"), timeout_s=300)
    record = json.loads((tmp_path / "trial.json").read_text())
    assert outcome.trial.ok and record["status"] == "done"
    # Two optimizer steps, one micro-batch each (accumulation 1), every batch 3 rows of 40 tokens: the data's
    # rows are 8-16 tokens and only 5, so the collated batches were tiled to the trial's shape.
    assert [s["step"] for s in record["steps"]] == [1, 2]
    assert [s["inputs"] for s in record["steps"]] == [[[3, 40]], [[3, 40]]]
    assert record["cuda"] is False and outcome.trial.peak_bytes is None  # no CUDA here: shapes only
    # It exited after the last step: no checkpoint, no evaluation, no save_model, no line after train().
    assert not (out / "finished.txt").exists()
    assert not list(out.glob("checkpoint-*")) if out.exists() else True
    assert "trained" not in (tmp_path / "trial.log").read_text()


@pytest.mark.slow  # a child Python that imports transformers and peft: 10-20 s here
def test_without_a_length_the_data_keeps_its_own(tmp_path: Path, tiny_model: Path) -> None:
    argv = [PY, str(EXAMPLE), "--model_name_or_path", str(tiny_model), "--output_dir", str(tmp_path / "o"),
            "--report_to", "none", "--use_cpu", "--max_seq_length", "12", "--rows", "9"]
    run_trial_child(argv, request(tmp_path, batch_size=4, seq_len=None, max_steps=1),
                    log_path=str(tmp_path / "t.log"), timeout_s=300)
    steps = json.loads((tmp_path / "trial.json").read_text())["steps"]
    rows, tokens = steps[0]["inputs"][0]
    assert len(steps) == 1 and rows == 4 and 6 <= tokens <= 12


SCRIPT = """
import sys, torch
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
sys.path.insert(0, {examples!r})
from hf_trainer_lora import RandomRows, collate

class Fail(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            raise {error}

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
model.train()
args = TrainingArguments(output_dir=sys.argv[2], use_cpu=True, report_to=[], max_steps=5)
trainer = Trainer(model=model, args=args, train_dataset=RandomRows(8, 100, 16), data_collator=collate,
                  callbacks=[Fail()])
try:
    trainer.train()
finally:
    print("AFTER TRAIN")
"""


def failing_script(tmp_path: Path, error: str) -> Path:
    path = tmp_path / "fails.py"
    path.write_text(textwrap.dedent(SCRIPT.format(examples=str(EXAMPLE.parent), error=error)))
    return path


@pytest.mark.slow  # a child Python that imports transformers and peft: 10-20 s here
def test_an_out_of_memory_error_ends_only_the_trial_child(tmp_path: Path, tiny_model: Path) -> None:
    script = failing_script(tmp_path, 'torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")')
    outcome = run_trial_child([PY, str(script), str(tiny_model), str(tmp_path / "o")], request(tmp_path),
                              log_path=str(tmp_path / "t.log"), timeout_s=300)
    assert not outcome.trial.ok and outcome.trial.error is not None
    assert outcome.trial.error.startswith("cuda_allocator: CUDA out of memory")
    record = json.loads((tmp_path / "trial.json").read_text())
    assert record["status"] == "oom" and len(record["steps"]) == 1  # the first step ran, the second failed
    assert "AFTER TRAIN" not in (tmp_path / "t.log").read_text()  # the child ended at the OOM


@pytest.mark.slow  # a child Python that imports transformers and peft: 10-20 s here
def test_any_other_failure_is_reported_with_its_message(tmp_path: Path, tiny_model: Path) -> None:
    script = failing_script(tmp_path, 'ValueError("the dataset has no text column")')
    with pytest.raises(TrialFailed, match="ValueError: the dataset has no text column"):
        run_trial_child([PY, str(script), str(tiny_model), str(tmp_path / "o")], request(tmp_path),
                        log_path=str(tmp_path / "t.log"), timeout_s=300)


def test_a_command_that_never_starts_a_trainer(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed, match="without starting an HF Trainer"):
        run_trial_child([PY, "-c", "print('no trainer here')"], request(tmp_path), log_path=str(tmp_path / "t.log"))
    with pytest.raises(TrialFailed, match="exited with 3 before training began: SystemExit: 3"):
        run_trial_child([PY, "-c", "import sys; print('SystemExit: 3'); sys.exit(3)"], request(tmp_path),
                        log_path=str(tmp_path / "t.log"))


def test_a_trial_that_runs_too_long_is_stopped(tmp_path: Path) -> None:
    with pytest.raises(TrialFailed, match="ran past 1 s"):
        run_trial_child([PY, "-c", "import time; time.sleep(60)"], request(tmp_path),
                        log_path=str(tmp_path / "t.log"), timeout_s=1)


def test_the_child_environment_keeps_the_users(tmp_path: Path) -> None:
    env = child_environment(request(tmp_path), {"PYTHONPATH": "/theirs", "VRAMSCOPE_INJECT": "1", "A": "b"})
    assert env["PYTHONPATH"].split(":") == [SITE_DIR, "/theirs"] and env["A"] == "b"
    assert "VRAMSCOPE_INJECT" not in env  # a trial measures the step without the monitor's callback
    assert TrialRequest.from_env(env[ENV_TRIAL]) == request(tmp_path)
    assert record_path("/r/trial1.json", 2) == "/r/trial1.rank2.json"


def test_shape_batch_tiles_rows_and_tokens_alike() -> None:
    import torch

    ids = torch.arange(6).reshape(2, 3)
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones(2, 3), "other": torch.ones(5)}
    out = shape_batch(batch, rows=3, seq=7)
    assert out["input_ids"].shape == out["labels"].shape == out["attention_mask"].shape == (3, 7)
    assert out["input_ids"][2].tolist() == [0, 1, 2, 0, 1, 2, 0] and out["other"].shape == (5,)
    flat = {"input_ids": torch.arange(5).reshape(1, 5), "position_ids": torch.arange(5).reshape(1, 5)}
    assert shape_batch(flat, rows=4, seq=8)["input_ids"].shape == (1, 32)  # padding-free: one row of 4 x 8
    assert shape_batch(batch, rows=1, seq=2)["input_ids"].tolist() == [[0, 1]]  # longer data is cut


@pytest.mark.slow
def test_trl_sft_trains_at_the_trial_shape(tmp_path: Path, tiny_model: Path) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    argv = [PY, "-m", "trl.scripts.sft", "--model_name_or_path", str(tiny_model), "--dataset_name",
            str(tiny_model.parent / "data"), "--use_peft", "--lora_target_modules", "all-linear", "--output_dir",
            str(tmp_path / "out"), "--per_device_train_batch_size", "2", "--max_length", "32", "--report_to", "none",
            "--use_cpu", "--bf16", "false", "--max_steps", "20"]
    outcome = run_trial_child(argv, request(tmp_path, batch_size=3, seq_len=24), log_path=str(tmp_path / "t.log"),
                              timeout_s=300)
    record = json.loads((tmp_path / "trial.json").read_text())
    assert outcome.trial.ok and [s["inputs"] for s in record["steps"]] == [[[3, 24]], [[3, 24]]]
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()  # sft.py's save_model never ran


@pytest.mark.slow
def test_tuning_needs_the_trials_on_a_gpu(tmp_path: Path, tiny_model: Path) -> None:
    from vramscope.commands import parse_command
    from vramscope.tune.command import SearchSettings, tune_command

    argv = [PY, str(EXAMPLE), "--model_name_or_path", str(tiny_model), "--output_dir", str(tmp_path / "o"),
            "--report_to", "none", "--use_cpu", "--max_seq_length", "16", "--rows", "4"]
    with pytest.raises(TrialFailed, match="saw no CUDA device"):
        tune_command(parse_command(argv), SearchSettings(timeout_s=300))


@pytest.mark.slow
def test_the_start_up_hook_loads_the_trial_only_when_asked(tmp_path: Path) -> None:
    import os
    import subprocess

    from vramscope.run.inject import child_env

    code = "import transformers.trainer as t; print(getattr(t.Trainer, '_vramscope_trial', False))"
    base = {k: v for k, v in os.environ.items() if k not in ("VRAMSCOPE_INJECT", ENV_TRIAL)}
    monitored = {**base, **child_env(None, environ=base)}  # `vramscope run`: the callback, no trial
    trial = child_environment(request(tmp_path), base)
    # The two interpreters start at once: each spends seconds importing transformers.
    children = [subprocess.Popen([PY, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True) for env in (monitored, trial)]
    try:
        answers = [child.communicate(timeout=120)[0].split() for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert answers == [["False"], ["True"]]


def test_parameter_counts_see_through_fsdp1_flat_parameters_and_fsdp2_shards() -> None:
    """What `tune --gpus N` prints as "rank 0 holds X of the model's Y parameters": under FSDP1 the flat parameter
    is already rank 0's shard, so the model's size comes from the unsharded size it was cut from (on the H200 the
    FSDP1 rehearsal of a 423.8M-parameter model printed "211.9M of the model's 211.9M"). Real FSDP1 and FSDP2 on
    torch's fake process group, on the CPU."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from vramscope.tune.command_trial import parameter_counts

    def model() -> Any:
        return torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 3))  # 143 parameters

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

        fsdp1 = FullyShardedDataParallel(model(), device_id=torch.device("cpu"), use_orig_params=False)
        total, held = parameter_counts(fsdp1.parameters())
        assert total == 143 and held == 72  # the flat parameter padded to an even split, rank 0's half
        fsdp2 = model()
        fully_shard(fsdp2)
        total, held = parameter_counts(fsdp2.parameters())
        assert total == 143 and 0 < held < 143
        assert parameter_counts(model().parameters()) == (143, 143)
    finally:
        dist.destroy_process_group()
