"""Every file a pasted command names is read bounded (issue 24, item 5): `vramscope plan -- <command>` under a
1 GiB address-space limit, with `/dev/zero`, a real FIFO without a writer, a real YAML alias bomb and numbers that
are not finite, in the places a command names files (the TRL config, accelerate's `--config_file`, the
DeepSpeed JSON, axolotl's YAML, the script itself). Each is one line on stderr, exit 2, within seconds.

Before: `--deepspeed /dev/zero` grew to 23 GB, a FIFO hung forever, a 600-byte alias bomb used 1.8 GB in 60 s,
and `.inf` / `.nan` ended with the catch-all message and exit 1.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")
MEMORY_LIMIT = 1 << 30  # a plan needs a few hundred MB; a reader of /dev/zero would pass this in a second
TIMEOUT_S = 30


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def plan(folder: Path, *command: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    result = subprocess.run([PYTHON, "-m", "vramscope", "plan", "--", *command], capture_output=True, text=True,
                            timeout=TIMEOUT_S, env=env, cwd=folder, preexec_fn=limited)
    return result, time.monotonic() - started


def one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "--debug" not in result.stderr
    return lines[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 512}))
    (tmp_path / "train.py").write_text("from transformers import Trainer\n")
    os.mkfifo(tmp_path / "fifo.yaml")  # a named pipe nobody writes to: an open() for reading blocks forever
    return tmp_path


def hf(*extra: str) -> list[str]:
    return ["python", "train.py", "--model_name_or_path", "model", "--use_peft", "--output_dir", "out", *extra]


def alias_bomb(path: Path) -> Path:
    """The "billion laughs" in YAML: 12 levels of nine aliases each, 600-odd bytes, 9**12 values expanded."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    path.write_text("\n".join([*lines, "model_name_or_path: model", "dataset_text_field: *a11"]) + "\n")
    assert path.stat().st_size < 700
    return path


CASES = {
    "deepspeed /dev/zero": (hf("--deepspeed", "/dev/zero"), "/dev/zero is a character device"),
    "deepspeed FIFO": (hf("--deepspeed", "fifo.yaml"), "fifo.yaml is a FIFO"),
    "accelerate --config_file /dev/zero": (["accelerate", "launch", "--config_file", "/dev/zero", *hf()[1:]],
                                           "/dev/zero is a character device"),
    "accelerate --config_file FIFO": (["accelerate", "launch", "--config_file", "fifo.yaml", *hf()[1:]], "is a FIFO"),
    "TRL config /dev/zero": (["trl", "sft", "--config", "/dev/zero"], "/dev/zero is a character device"),
    "TRL config FIFO": (["trl", "sft", "--config", "fifo.yaml"],
                        "fifo.yaml is a FIFO (named pipe), not a file; give the path of the TRL config"),
    "script FIFO": (["python", "fifo.yaml", "--model_name_or_path", "model"],
                    "fifo.yaml is a FIFO (named pipe), not a file; give the path of the training script"),
    "script /dev/zero": (["python", "/dev/zero", "--model_name_or_path", "model"], "/dev/zero is a character"),
    "axolotl config FIFO": (["axolotl", "train", "fifo.yaml"], "is a FIFO"),
}


@pytest.mark.parametrize("case", CASES)
def test_devices_and_fifos_are_refused_at_once(folder: Path, case: str) -> None:
    command, message = CASES[case]
    result, seconds = plan(folder, *command)
    assert message in one_line_exit_2(result)
    assert seconds < 15


def test_a_yaml_alias_bomb_is_refused_in_bounded_memory(folder: Path) -> None:
    bomb = alias_bomb(folder / "sft.yaml")
    result, seconds = plan(folder, "trl", "sft", "--config", bomb.name)
    assert "aliases expand to more than 100,000 values" in one_line_exit_2(result)
    assert seconds < 15
    # The same bomb as axolotl's config, and as a recursive anchor.
    result, _ = plan(folder, "axolotl", "train", bomb.name)
    assert "alias bomb" in one_line_exit_2(result)
    (folder / "loop.yaml").write_text("base_model: model\nlayers: &x [1, *x]\n")
    result, _ = plan(folder, "axolotl", "train", "loop.yaml")
    assert "an anchor that contains itself" in one_line_exit_2(result)


def test_anchors_and_merge_keys_of_a_real_config_still_read(folder: Path) -> None:
    (folder / "sft.yaml").write_text(
        "defaults: &d\n  per_device_train_batch_size: 3\n  gradient_accumulation_steps: 4\n"
        "<<: *d\nmodel_name_or_path: model\nmax_length: 256\nuse_peft: true\n")
    result, _ = plan(folder, "trl", "sft", "--config", "sft.yaml")
    assert result.returncode == 0, result.stderr
    assert "batch 3 per device x 4 accumulation, 256 max tokens" in result.stdout


@pytest.mark.parametrize(("file", "text", "command", "message"), [
    ("sft.yaml", "model_name_or_path: model\nuse_peft: true\nper_device_train_batch_size: .inf\n",
     ["trl", "sft", "--config", "sft.yaml"], "sft.yaml: per_device_train_batch_size is inf, not a finite number"),
    ("axolotl.yaml", "base_model: model\nadapter: lora\nsequence_len: .nan\nmicro_batch_size: 2\n",
     ["axolotl", "train", "axolotl.yaml"], "sequence_len is nan"),
    ("ds.json", '{"zero_optimization": {"stage": Infinity}}', hf("--deepspeed", "ds.json"),
     "zero_optimization.stage is inf"),
    ("ds.json", '{"train_micro_batch_size_per_gpu": 1e999}', hf("--deepspeed", "ds.json"),
     "train_micro_batch_size_per_gpu is inf"),
    (None, None, hf("--per_device_train_batch_size", "inf"), "--per_device_train_batch_size 'inf' is not a finite"),
    (None, None, hf("--max_seq_length", "nan"), "'nan' is not a finite number"),
])
def test_numbers_that_are_not_finite_are_refused_naming_the_key(
        folder: Path, file: str | None, text: str | None, command: list[str], message: str) -> None:
    if file is not None and text is not None:
        (folder / file).write_text(text)
    result, _ = plan(folder, *command)
    assert message in one_line_exit_2(result)


def test_a_large_script_is_read_only_as_far_as_needed(folder: Path) -> None:
    """The script is read to recognise it (1 MiB at most); a larger one is planned from its flags."""
    with open(folder / "train.py", "w") as f:
        f.write("from transformers import Trainer\n")
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros after the import
    result, _ = plan(folder, *hf("--per_device_train_batch_size", "2", "--max_seq_length", "128"))
    assert result.returncode == 0, result.stderr
