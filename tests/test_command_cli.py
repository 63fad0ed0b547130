"""`vramscope plan -- CMD` and `vramscope tune -- CMD` at the command line: what is printed, what overrides what,
one-line errors with exit 2, and that `plan` never runs the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vramscope.cli import main

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no accelerate default config of the machine's user
    monkeypatch.delenv("HF_HOME", raising=False)
    d = tmp_path / "llama-7b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    return tmp_path


TRL = ["python", "-m", "trl.scripts.sft", "--model_name_or_path", "llama-7b", "--use_peft", "--load_in_4bit",
       "--dtype", "bfloat16", "--per_device_train_batch_size", "2", "--max_length", "2048", "--report_to", "none",
       "--dataset_name", "local", "--weird_flag", "1"]


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_a_trl_command_prints_what_it_read(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = plan(capsys, "--gpu", "RTX-4090", "--", *TRL)
    assert code == 0 and err == ""
    block, table = out.split("\n\n", 1)
    assert block.startswith("read from the command (TRL sft; framework trl):")
    assert "batch 2 per device x 1 accumulation, 2048 max tokens; python -m, 1 process" in block
    assert "--load_in_4bit," in block and "lora_r 16" in block  # read, and TRL's defaults
    assert "not understood (ignored): --weird_flag 1" in block
    assert "batch 2 x 2048 tokens" in table and "LoRA r=16 on q_proj,v_proj" in table


def test_plan_json_has_the_command_object(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(capsys, "--json", "--", "torchrun", "--nproc_per_node", "2", "-m", *TRL[2:])
    assert code == 0
    data = json.loads(out)
    command = data["command"]
    assert command["program"] == "trl" and command["launch"]["world_size"] == 2
    assert command["launch"]["strategy"] == "ddp" and command["launch"]["launcher"] == "torchrun"
    assert command["read"]["--per_device_train_batch_size"] == "2"
    assert command["unknown"] == ["--weird_flag 1"]
    assert data["batch_size"] == 2 and data["seq_len"] == 2048
    assert "gpus" in data  # two processes: the per-GPU plan, as `plan --gpus 2 --strategy ddp`


def test_a_command_with_several_processes_is_planned_per_gpu(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
                                    "  fsdp_offload_params: true\n")
    code, out, _ = plan(capsys, "--", "accelerate", "launch", "--config_file", "fsdp.yaml", "-m", *TRL[2:])
    assert code == 0
    assert "accelerate, 4 processes, fsdp with offload" in out
    assert "FSDP" in out.split("\n\n", 1)[1]  # the per-GPU plan names the strategy it planned


def test_vramscope_flags_before_the_command_override_it(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --lora-r 64 is the flag's own default: given explicitly, it still wins over the command's 16.
    code, out, _ = plan(capsys, "--json", "--seq-len", "512", "--batch-size", "1", "--lora-r", "64",
                        "--no-gradient-checkpointing", "--", *TRL)
    assert code == 0
    data = json.loads(out)
    assert (data["batch_size"], data["seq_len"]) == (1, 512)
    spec = data["command"]["spec"]
    assert spec["lora_r"] == 64 and spec["gradient_checkpointing"] is False and spec["lora_alpha"] == 32
    assert data["command"]["overridden_by_flags"] == ["--batch-size 1", "--seq-len 512", "--lora-r 64",
                                                      "--gradient-checkpointing false"]
    _, out2, _ = plan(capsys, "--json", "--", *TRL)
    assert json.loads(out2)["command"]["spec"]["lora_r"] == 16  # without the flag, the command's value


def test_plan_never_runs_the_command(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = here / "train.py"
    script.write_text("from transformers import HfArgumentParser\nopen('RAN', 'w').write('yes')\n")
    code, _, _ = plan(capsys, "--", "python", str(script), "--model_name_or_path", "llama-7b",
                      "--per_device_train_batch_size", "1", "--max_seq_length", "256")
    assert code == 0
    assert not (here / "RAN").exists()


@pytest.mark.parametrize(("command", "needle"), [
    (["bash", "train.sh"], "vramscope reads python, accelerate launch"),
    (["python", "train.py", "--steps", "3"], "cannot read the model and shapes"),
    (["python", "-m", "trl.scripts.sft", "--use_peft"], "names no model"),
    (["python", "-m", "trl.scripts.sft", "--use_peft", "--model_name_or_path", "llama-7b", "--max_length", "none"],
     "no maximum sequence length"),
    (["axolotl", "train", "missing.yml"], "not found"),
])
def test_commands_that_cannot_be_read_are_one_line_and_exit_2(here: Path, capsys: pytest.CaptureFixture[str],
                                                              command: list[str], needle: str) -> None:
    code, out, err = plan(capsys, "--", *command)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_a_command_without_the_separator(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = plan(capsys, "trl", "sft")
    assert code == 2 and "after '--'" in err
    code, _, err = plan(capsys, "--batch-size", "1", "--seq-len", "8")
    assert code == 2 and "one of the arguments" in err


def test_a_bad_yaml_config_is_one_line(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (here / "cfg.yml").write_text("base_model: llama-7b\nadapter: qlora\n  bad: [indent\n")
    code, _, err = plan(capsys, "--", "axolotl", "train", "cfg.yml")
    assert code == 2 and "not valid YAML" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_tune_a_command_without_a_gpu_says_so(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--", *TRL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA GPU" in err
    assert "vramscope plan -- <command>" in err


def test_tune_a_command_refuses_recipe_flags(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--lora-r", "8", "--", *TRL]) == 2
    err = capsys.readouterr().err
    assert "--lora-r do not apply with a command" in err
    assert main(["tune", "--", "bash", "x.sh"]) == 2  # unreadable commands before any GPU check
    assert "vramscope reads python" in capsys.readouterr().err
