"""The rehearsal's worker and launcher environment (issue 27): for accelerate launch (FSDP1, FSDP2, DDP configs,
flags over the file), trl sft, torchrun and deepspeed commands, the worker command and the variables rank 0
would get. accelerate's own code is the judge: its `prepare_multi_gpu_env` on the same command must give the
same ACCELERATE_* / FSDP_* variables as vramscope's rebuild, which never imports accelerate."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

from vramscope.commands import CommandReadError
from vramscope.tune.launch_env import interpreter_of, worker_launch

TRL_CONFIGS = None
_spec = importlib.util.find_spec("trl")
if _spec is not None and _spec.submodule_search_locations:
    TRL_CONFIGS = Path(next(iter(_spec.submodule_search_locations))) / "accelerate_configs"

# PEFT's FSDP-QLoRA recipe's accelerate config (huggingface/peft examples/sft/configs/fsdp_config_qlora.yaml, as
# of peft v0.13), the FSDP1 shape most QLoRA users copy.
FSDP1_QLORA = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: true
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_use_orig_params: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def _accelerates_own(argv_after_launch: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What accelerate launch itself adds to the environment for the command (its own parser and code)."""
    launch = pytest.importorskip("accelerate.commands.launch")
    from accelerate.utils.launch import prepare_multi_gpu_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = launch.launch_command_parser().parse_args(argv_after_launch)
    args, _, _ = launch._validate_launch_command(args)
    before = dict(os.environ)
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if before.get(k) != v}


def _ours(argv: list[str], world: int, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    launch = worker_launch(argv, world, environ=env, cwd=tmp_path)
    return launch.env


def _accelerate_part(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_")) or k == "OMP_NUM_THREADS"}


@pytest.mark.parametrize("config", ["fsdp1", "fsdp2", "multi_gpu", "peft_fsdp1_qlora"])
def test_accelerate_configs_give_the_variables_accelerate_itself_sets(
        config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if config == "peft_fsdp1_qlora":
        path = tmp_path / "fsdp.yaml"
        path.write_text(FSDP1_QLORA, encoding="utf-8")
    else:
        if TRL_CONFIGS is None:
            pytest.skip("trl is not installed")
        path = TRL_CONFIGS / f"{config}.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n", encoding="utf-8")
    reference = _accelerates_own(["--config_file", str(path), "train.py", "--lr", "1"], monkeypatch)
    ours = _ours(["accelerate", "launch", "--config_file", str(path), "train.py", "--lr", "1"], 4, tmp_path)
    assert _accelerate_part(ours) == _accelerate_part(reference)
    if config != "multi_gpu":
        assert ours["ACCELERATE_USE_FSDP"] == "true"
        assert ours["FSDP_VERSION"] == ("2" if config == "fsdp2" else "1")


def test_accelerate_flags_win_over_the_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if TRL_CONFIGS is None:
        pytest.skip("trl is not installed")
    monkeypatch.chdir(tmp_path)
    flags = ["--config_file", str(TRL_CONFIGS / "fsdp2.yaml"), "--fsdp_offload_params", "true",
             "--mixed_precision", "no", "--num_processes", "2", "--dynamo_use_dynamic"]
    reference = _accelerates_own([*flags, "train.py"], monkeypatch)
    launch = worker_launch(["accelerate", "launch", *flags, "train.py"], 8, environ={}, cwd=tmp_path)
    assert _accelerate_part(launch.env) == _accelerate_part(reference)
    assert launch.env["FSDP_OFFLOAD_PARAMS"] == "true" and launch.offload and launch.strategy == "fsdp"
    assert launch.fsdp_version == 2
    # A switch with no value: accelerate writes it only when given (the configs above leave it out).
    assert launch.env["ACCELERATE_DYNAMO_USE_DYNAMIC"] == "True"
    # --gpus wins over the command's own count, and the rehearsal says so.
    assert launch.env["WORLD_SIZE"] == "8" and any("starts 2 processes" in n for n in launch.notes)


def test_torchrun_worker_and_environment(tmp_path: Path) -> None:
    launch = worker_launch(["torchrun", "--standalone", "--nproc_per_node", "2", "train.py", "--epochs", "1"], 2,
                           environ={"PATH": ""}, cwd=tmp_path)
    assert launch.argv == (sys.executable, "-u", "train.py", "--epochs", "1")
    assert launch.launcher == "torchrun" and launch.strategy == "ddp"
    env = launch.env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "0", "2", "2")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit() and env["OMP_NUM_THREADS"] == "1"
    assert not any(k.startswith("ACCELERATE_") for k in env)
    # python -m torch.distributed.run and a module worker.
    launch = worker_launch(["python3", "-m", "torch.distributed.run", "--nproc_per_node=4", "-m", "pkg.train",
                            "--x", "1"], 4, environ={}, cwd=tmp_path)
    assert launch.argv == ("python3", "-u", "-m", "pkg.train", "--x", "1") and launch.env["WORLD_SIZE"] == "4"
    # An assignment in front of the launcher travels in the worker's environment.
    launch = worker_launch(["NCCL_DEBUG=INFO", "torchrun", "--nproc_per_node", "2", "train.py"], 2, environ={},
                           cwd=tmp_path)
    assert launch.env["NCCL_DEBUG"] == "INFO" and launch.argv[-1] == "train.py"


@pytest.mark.parametrize("runner", [
    ["srun", "--nodes", "1", "--gres=gpu:2"],
    ["uv", "run", "--with", "peft"],
    ["hf", "jobs", "uv", "run", "--flavor", "a100x2"],
    ["poetry", "run"],
])
def test_a_runner_in_front_of_the_launcher_changes_nothing_the_rank_gets(runner: list[str], tmp_path: Path) -> None:
    """The plan and the rehearsal read the command through one reader: behind srun, uv run --with or hf jobs the
    rank got accelerate's defaults (mixed precision "no" for a bf16 run), where the plan read the flags."""
    command = ["accelerate", "launch", "--mixed_precision", "bf16", "--num_processes", "2", "train.py", "--lr", "1"]
    plain = worker_launch(["NCCL_DEBUG=INFO", *command], 2, environ={"PATH": ""}, cwd=tmp_path)
    behind = worker_launch(["NCCL_DEBUG=INFO", *runner, *command], 2, environ={"PATH": ""}, cwd=tmp_path)
    assert plain.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and plain.env["NCCL_DEBUG"] == "INFO"
    assert behind.env == plain.env and behind.argv == plain.argv
    assert behind.argv[1:] == ("-u", "train.py", "--lr", "1")
    # a Python behind the runner is the worker's Python
    launch = worker_launch([*runner, "python3.11", "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "train.py"], 2, environ={}, cwd=tmp_path)
    assert launch.argv == ("python3.11", "-u", "train.py") and launch.env["LOCAL_WORLD_SIZE"] == "2"


def test_deepspeed_worker_gets_local_rank_and_its_launchers_variables(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}', encoding="utf-8")
    argv = ["deepspeed", "--num_gpus", "4", "train.py", "--deepspeed", str(ds)]
    launch = worker_launch(argv, 4, environ={}, cwd=tmp_path)
    assert launch.argv[1:] == ("-u", "train.py", "--deepspeed", str(ds), "--local_rank=0")
    env = launch.env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_SIZE"], env["CROSS_SIZE"]) == (
        "0", "0", "4", "4", "1")
    assert "LOCAL_WORLD_SIZE" not in env  # torchrun's, not DeepSpeed's
    launch = worker_launch(["deepspeed", "--no_local_rank", "train.py"], 2, environ={}, cwd=tmp_path)
    assert "--local_rank=0" not in launch.argv


def test_trl_sft_runs_its_script_with_the_training_flags_and_accelerates_variables(tmp_path: Path) -> None:
    if TRL_CONFIGS is None:
        pytest.skip("trl is not installed")
    argv = ["trl", "sft", "--model_name_or_path", "m", "--accelerate_config", "fsdp2", "--num_processes", "2",
            "--per_device_train_batch_size", "2", "--mixed_precision=bf16"]
    launch = worker_launch(argv, 2, environ={"PATH": ""}, cwd=tmp_path)
    assert launch.argv[1:] == ("-u", "-m", "trl.scripts.sft", "--model_name_or_path", "m",
                               "--per_device_train_batch_size", "2")
    assert launch.env["ACCELERATE_USE_FSDP"] == "true" and launch.env["FSDP_VERSION"] == "2"
    assert launch.env["ACCELERATE_MIXED_PRECISION"] == "bf16" and launch.strategy == "fsdp"


def test_axolotl_train_runs_its_cli_module_under_axolotls_python_with_its_launchers_variables(
        tmp_path: Path) -> None:
    # `axolotl train` starts accelerate launch -m axolotl.cli.train (or torchrun with --launcher torchrun): the
    # rank is that module under the console script's own Python (it ran `python axolotl.cli.train`, a file, before)
    script = tmp_path / "axolotl"
    script.write_text("#!/opt/axolotl/bin/python3.11\nimport sys\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "lora.yml").write_text("base_model: m\nadapter: qlora\nmicro_batch_size: 2\n", encoding="utf-8")
    launch = worker_launch(["axolotl", "train", "lora.yml"], 2, environ={"PATH": str(tmp_path)}, cwd=tmp_path)
    assert launch.argv == ("/opt/axolotl/bin/python3.11", "-u", "-m", "axolotl.cli.train", "lora.yml")
    assert launch.env["WORLD_SIZE"] == "2" and "ACCELERATE_MIXED_PRECISION" in launch.env
    launch = worker_launch(["axolotl", "train", "lora.yml", "--launcher", "torchrun"], 2,
                           environ={"PATH": str(tmp_path)}, cwd=tmp_path)
    assert launch.argv[3:] == ("axolotl.cli.train", "lora.yml") and launch.env["LOCAL_WORLD_SIZE"] == "2"
    assert not any(k.startswith("ACCELERATE_") for k in launch.env)  # torchrun sets none of accelerate's


def test_llamafactory_train_runs_its_launcher_module_under_its_own_python(tmp_path: Path) -> None:
    # `llamafactory-cli train x.yaml` on several GPUs is `torchrun ... llamafactory/launcher.py x.yaml`: a rank is
    # that module under the console script's Python (the worker was `python -u "llamafactory-cli train"` before)
    script = tmp_path / "llamafactory-cli"
    script.write_text("#!/opt/lmf/bin/python3.11\nimport sys\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "lora.yaml").write_text("model_name_or_path: m\nstage: sft\nfinetuning_type: lora\n"
                                         "quantization_bit: 4\nper_device_train_batch_size: 2\n", encoding="utf-8")
    launch = worker_launch(["llamafactory-cli", "train", "lora.yaml"], 2, environ={"PATH": str(tmp_path)},
                           cwd=tmp_path)
    assert launch.argv == ("/opt/lmf/bin/python3.11", "-u", "-m", "llamafactory.launcher", "lora.yaml")
    assert launch.env["WORLD_SIZE"] == "2" and launch.env["LOCAL_WORLD_SIZE"] == "2"
    assert not any(k.startswith("ACCELERATE_") for k in launch.env)  # torchrun's variables, not accelerate's


def test_the_interpreter_is_the_console_scripts_own(tmp_path: Path) -> None:
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/venv/bin/python3.12\nimport sys\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    assert interpreter_of("torchrun", {"PATH": str(tmp_path)}) == "/opt/venv/bin/python3.12"
    script.write_text("#!/usr/bin/env python3\n", encoding="utf-8")
    assert interpreter_of("torchrun", {"PATH": str(tmp_path)}) == "python3"
    assert interpreter_of("no-such-launcher", {"PATH": str(tmp_path)}) == sys.executable
    launch = worker_launch(["torchrun", "--nproc_per_node", "2", "t.py"], 2, environ={"PATH": str(tmp_path)},
                           cwd=tmp_path)
    assert launch.argv[0] == "python3"


def test_a_command_vramscope_cannot_read_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(CommandReadError, match="not given a script"):
        worker_launch(["torchrun", "--nproc_per_node", "2"], 2, environ={}, cwd=tmp_path)
