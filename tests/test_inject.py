"""Zero-code injection: `vramscope run` gives every HF Trainer in the command the memory callback.

The child processes here are real: a Python that never imports transformers, a Python with its own
sitecustomize, a shell, and (slow) an unmodified HF training script under `vramscope run`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vramscope.run.inject import (
    ENV_INJECT,
    ENV_STEP_LOG,
    SITE_DIR,
    attach,
    child_env,
    steps_log_path,
)

PYTHON = sys.executable


def run_child(argv: list[str], env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", ENV_INJECT, ENV_STEP_LOG)}
    env.update(env_extra)
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_child_env_puts_the_hook_first_and_keeps_the_users_path(tmp_path: Path) -> None:
    env = child_env(str(tmp_path / "runs" / "mem.csv"), environ={"PYTHONPATH": f"/a{os.pathsep}/b"})
    assert env["PYTHONPATH"].split(os.pathsep) == [SITE_DIR, "/a", "/b"]
    assert (Path(SITE_DIR) / "sitecustomize.py").is_file()
    assert env[ENV_STEP_LOG] == str(tmp_path / "runs" / "mem.steps.csv")
    assert env[ENV_INJECT] == "1"
    again = child_env(None, environ={"PYTHONPATH": env["PYTHONPATH"]})  # vramscope run inside vramscope run
    assert again["PYTHONPATH"].split(os.pathsep).count(SITE_DIR) == 1
    assert ENV_STEP_LOG not in again


def test_steps_log_path_is_absolute_and_keeps_the_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert steps_log_path("mem.jsonl") == str(tmp_path / "mem.steps.jsonl")
    assert steps_log_path("logs/run") == str(tmp_path / "logs" / "run.steps.csv")


def test_a_python_child_that_never_imports_transformers_is_untouched(tmp_path: Path) -> None:
    code = ("import sys, json; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('transformers', 'vramscope', 'torch')))))")
    result = run_child([PYTHON, "-c", code], child_env(str(tmp_path / "mem.csv")), tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []  # nothing imported on its behalf
    assert result.stderr == ""


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    code = ("import os, sys; "
            "print(os.environ.get('THEIRS_RAN'), any(type(f).__name__ == '_Finder' for f in sys.meta_path))")
    env = child_env(None, environ={"PYTHONPATH": str(theirs)})
    result = run_child([PYTHON, "-c", code], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["yes", "True"]  # theirs ran, and the hook is installed


def test_a_broken_sitecustomize_is_reported_in_one_line_and_the_program_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    result = run_child([PYTHON, "-c", "print('ran')"], child_env(None, environ={"PYTHONPATH": str(theirs)}), tmp_path)
    assert result.returncode == 0
    assert result.stdout.strip() == "ran"
    assert result.stderr.strip().splitlines() == [
        "vramscope: the sitecustomize module this one wraps failed: RuntimeError: boom"]


def test_a_child_that_is_not_python_ignores_it(tmp_path: Path) -> None:
    result = run_child(["sh", "-c", "echo shell ok"], child_env(str(tmp_path / "mem.csv")), tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "shell ok"


def _tiny_trainer(tmp_path: Path, callbacks: list[Any] | None = None) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=32)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, report_to=[],
                                          use_cpu=True, save_strategy="no")
    data = [{"input_ids": torch.zeros(4, dtype=torch.long), "labels": torch.zeros(4, dtype=torch.long)}]
    return transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args, train_dataset=data,
                                callbacks=callbacks)


def test_attach_puts_the_callback_first_once_per_trainer(tmp_path: Path) -> None:
    from vramscope.integrations.hf import MemoryMonitorCallback

    env = {ENV_STEP_LOG: str(tmp_path / "mem.steps.csv")}
    first = _tiny_trainer(tmp_path)
    callback = attach(first, environ=env)
    assert isinstance(callback, MemoryMonitorCallback)
    assert first.callback_handler.callbacks[0] is callback
    assert attach(first, environ=env) is None  # already there
    second = attach(_tiny_trainer(tmp_path), environ=env)
    assert second is not None
    assert second.monitor.settings.log is not None and ".trainer" in second.monitor.settings.log
    mine = MemoryMonitorCallback(warn=False)
    assert attach(_tiny_trainer(tmp_path, callbacks=[mine]), environ=env) is None  # the user's own one wins


TRAIN_SCRIPT = textwrap.dedent(
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=32)
    data = [{"input_ids": torch.randint(0, 32, (8,)), "labels": torch.randint(0, 32, (8,))} for _ in range(8)]
    args = TrainingArguments(output_dir="out", max_steps=3, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data)
    trainer.train()
    print("first callback:", type(trainer.callback_handler.callbacks[0]).__name__)
    """
)


@pytest.mark.slow
def test_vramscope_run_attaches_the_callback_to_an_unmodified_script(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    vramscope = [PYTHON, "-m", "vramscope", "run", "--quiet", "--log", "mem.csv", "--", PYTHON, "train.py"]
    result = run_child(vramscope, {}, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "first callback: MemoryMonitorCallback" in result.stdout
    from vramscope.logs.reader import read_log

    steps = read_log(tmp_path / "mem.steps.csv")
    assert [s for s, p in zip(steps.ints("step"), steps.strings("phase"), strict=True) if p == "train"] == [1, 2, 3]
    assert set(steps.ints("tokens")) - {None} == {16}
    assert (tmp_path / "mem.steps.analysis.json").is_file()
    assert len(read_log(tmp_path / "mem.csv")) >= 1  # the run's own time-based log is there too
