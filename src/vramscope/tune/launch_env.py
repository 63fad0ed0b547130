"""The worker behind a launcher, and the environment the launcher would give its rank 0 of N.

``vramscope tune --gpus N -- <launcher command>`` runs no launcher: it runs the launcher's worker command
itself, once, as rank 0 of N on one GPU (the process group made fake by :mod:`vramscope.tune.rehearsal_pg`).
So that the worker behaves as it would under its launcher, it gets the variables the launcher sets, built
here without running (or importing) the launcher, from reading their code:

``torchrun`` (torch.distributed.elastic's local agent)
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``,
    ``ROLE_NAME``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, the
    ``TORCHELASTIC_*`` run variables, ``OMP_NUM_THREADS=1`` unless set; the worker is ``python -u script``.
``accelerate launch`` (``prepare_multi_gpu_env``, accelerate 1.x)
    torchrun's, plus ``ACCELERATE_MIXED_PRECISION``, the ``ACCELERATE_DYNAMO_*`` variables,
    ``OMP_NUM_THREADS``; for FSDP ``ACCELERATE_USE_FSDP`` and one ``FSDP_*``
    variable per ``fsdp_config`` key (flags over the config file over accelerate's defaults); for
    DeepSpeed ``ACCELERATE_USE_DEEPSPEED`` and its ``ACCELERATE_DEEPSPEED_*`` variables.
``trl sft`` (which runs ``accelerate launch trl/scripts/sft.py``): accelerate's, the worker
    ``python -m trl.scripts.sft`` with TRL's training flags and without the launch flags.
``deepspeed`` (``deepspeed.launcher.launch``)
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``CROSS_RANK``,
    ``CROSS_SIZE``, ``LOCAL_SIZE``, and ``--local_rank=0`` after the script's arguments unless
    ``--no_local_rank``.

Pure: reads argv and the config files it names; imports no torch and no launcher.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramscope.commands.argv import Option, is_flag, normalise, to_bool
from vramscope.commands.errors import CommandReadError
from vramscope.commands.files import load_yaml
from vramscope.commands.launchers import (
    ACCELERATE_BOOL,
    ACCELERATE_VALUED,
    PYTHON_NAME,
    LaunchState,
    RankLauncher,
    apply_accelerate,
    split_launcher,
)

DEFAULT_PORT = 29500

# accelerate launch's defaults for the FSDP flags (accelerate 1.x `launch_command_parser`), the variable each one
# sets, and whether its value is lower-cased (booleans) or kept (strategy names, numbers); None: unset unless given.
_FSDP_VARIABLES: tuple[tuple[str, str, str | None, bool], ...] = (
    ("fsdp_version", "FSDP_VERSION", "1", False),
    ("fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY", "FULL_SHARD", False),
    ("fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD", "true", True),
    ("fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", "false", True),
    ("fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS", "100000000", False),
    ("fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY", None, False),
    ("fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP", None, False),
    ("fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH", None, False),
    ("fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE", None, False),
    ("fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH", "false", True),
    ("fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS", "true", True),
    ("fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING", "true", True),
    ("fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES", "true", True),
    ("fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING", "false", True),
    ("fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD", "false", True),
    ("fsdp_ignored_modules", "FSDP_IGNORED_MODULES", None, False),
)
# accelerate's DeepSpeed flags -> the variable each sets (only when given), lower-cased but the config file's path.
_DEEPSPEED_VARIABLES: tuple[tuple[str, str, bool], ...] = (
    ("zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", False),
    ("gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", False),
    ("gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING", True),
    ("offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", True),
    ("offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", True),
    ("zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT", True),
    ("zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL", True),
    ("deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE", False),
    ("deepspeed_moe_layer_cls_names", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES", False),
)


@dataclass(frozen=True)
class WorkerLaunch:
    """Rank 0's worker command and the variables its launcher would set, laid over the user's environment.

    Attributes:
        launcher: ``torchrun``, ``accelerate``, ``trl``, ``deepspeed``, ``axolotl`` or ``python`` (no launcher).
        argv: the worker command (``python -u train.py ...``).
        env: the launcher's variables for rank 0 of ``world_size`` (only those; the caller adds the user's).
        world_size: the rehearsed number of ranks.
        strategy, offload, zero_stage: what the launch configures (``fsdp``, ``ddp``, ``zero3`` ...).
        fsdp_version: 1 or 2 for FSDP (accelerate's ``fsdp_version``), else None.
        notes: what the rebuild assumed, a sentence each.
        starts: the launcher whose rank environment the worker got (:data:`~vramscope.commands.launchers.RankLauncher`;
            None: no launcher, torchrun's environment given).
    """

    launcher: str
    argv: tuple[str, ...]
    env: dict[str, str]
    world_size: int
    strategy: str | None
    offload: bool
    zero_stage: int | None
    fsdp_version: int | None
    notes: tuple[str, ...]
    starts: RankLauncher | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"launcher": self.launcher, "worker": list(self.argv), "env": dict(self.env),
                "world_size": self.world_size, "strategy": self.strategy, "offload": self.offload,
                "zero_stage": self.zero_stage, "fsdp_version": self.fsdp_version, "notes": list(self.notes)}


def interpreter_of(executable: str, environ: Mapping[str, str]) -> str:
    """The Python that a console script (``torchrun``, ``accelerate``, ``trl``) runs under: its ``#!`` line."""
    path = shutil.which(executable, path=environ.get("PATH")) if os.sep not in executable else executable
    if path:
        try:
            with open(path, "rb") as f:
                first = f.readline(512).decode("utf-8", "replace").strip()
        except OSError:
            first = ""
        if first.startswith("#!"):
            words = first[2:].split()
            if words and os.path.basename(words[0]) == "env" and len(words) > 1:
                words = words[1:]
            if words and PYTHON_NAME.match(os.path.basename(words[0])):
                return words[0]
    return sys.executable


def torchrun_env(world: int, *, port: int = DEFAULT_PORT, addr: str = "127.0.0.1", nodes: int = 1,
                 environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What torch's elastic agent sets for local rank 0 of a ``world``-rank run (torchrun, accelerate launch)."""
    env = {} if environ is None else environ
    per_node = max(1, world // max(nodes, 1))
    out = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(per_node),
           "GROUP_RANK": "0", "GROUP_WORLD_SIZE": str(nodes), "ROLE_NAME": "default", "ROLE_RANK": "0",
           "ROLE_WORLD_SIZE": str(world), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
           "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
           "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    if per_node > 1 and "OMP_NUM_THREADS" not in env:
        out["OMP_NUM_THREADS"] = "1"  # torchrun's default for more than one process per node
    return out


def deepspeed_env(world: int, *, port: int = DEFAULT_PORT, addr: str = "127.0.0.1", nodes: int = 1) -> dict[str, str]:
    """What ``deepspeed.launcher.launch`` sets for local rank 0."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
            "CROSS_RANK": "0", "CROSS_SIZE": str(nodes), "LOCAL_SIZE": str(max(1, world // max(nodes, 1)))}


def _values(options: Sequence[Option]) -> dict[str, str | None]:
    """Flag name -> its value ("true" for a bare boolean flag), the last one winning."""
    out: dict[str, str | None] = {}
    for o in options:
        out[o.name] = o.values[0] if o.values else "true"
    return out


def _text(value: Any, lower: bool) -> str:
    text = str(value)
    return text.lower() if lower else text


def accelerate_env(config: Mapping[str, Any], options: Sequence[Option], *, cwd: Path,
                   environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``accelerate launch`` adds to torchrun's, from its ``--config_file`` mapping and its flags."""
    flags = _values(options)
    distributed = str(config.get("distributed_type", "NO")).upper()
    use_fsdp = "use_fsdp" in flags or (distributed == "FSDP" and "use_deepspeed" not in flags)
    use_deepspeed = "use_deepspeed" in flags or (distributed == "DEEPSPEED" and not use_fsdp)
    # The config's nested sections become flags (fsdp_config.x -> fsdp_x), which flags given on the line override.
    from_config: dict[str, Any] = {}
    for section, prefix in (("fsdp_config", "fsdp_"), ("deepspeed_config", ""), ("dynamo_config", "dynamo_")):
        part = config.get(section)
        if isinstance(part, Mapping):
            for key, value in part.items():
                from_config[key if key.startswith(prefix) else prefix + key] = value
    for key, value in config.items():
        if not isinstance(value, Mapping) and key not in ("compute_environment", "distributed_type"):
            from_config.setdefault(key, value)

    def get(name: str, default: Any = None) -> Any:
        if name in flags:
            return flags[name]
        value = from_config.get(name)
        return default if value is None else value

    env: dict[str, str] = {
        "ACCELERATE_MIXED_PRECISION": str(get("mixed_precision", "no")).lower(),
        "ACCELERATE_DYNAMO_BACKEND": str(get("dynamo_backend", "no")).upper(),
        "ACCELERATE_DYNAMO_MODE": str(get("dynamo_mode", "default")),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(_flag_bool(get("dynamo_use_fullgraph", False))),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(_flag_bool(get("dynamo_use_regional_compilation", False))),
        "OMP_NUM_THREADS": str(get("num_cpu_threads_per_process", environ.get("OMP_NUM_THREADS", "1"))),
    }
    # accelerate 1.16 sets this one only when the flag or the config gives it (left out, torch.compile picks its
    # own default); older releases wrote "False" always, which their plugin also reads from its absence.
    use_dynamic = get("dynamo_use_dynamic")
    if use_dynamic is not None:
        env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(_flag_bool(use_dynamic))
    if "debug" in flags or to_bool(str(config.get("debug", False))):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    gpu_ids = get("gpu_ids")
    if gpu_ids is not None and str(gpu_ids) != "all":
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_ids)
    if use_fsdp:
        env["ACCELERATE_USE_FSDP"] = "true"
        for name, variable, default, lower in _FSDP_VARIABLES:
            value = get(name, default)
            if value is not None:
                env[variable] = _text(value, lower)
    elif use_deepspeed:
        pythonpath = environ.get("PYTHONPATH", "")  # DeepSpeed's launch adds the working folder
        env["PYTHONPATH"] = os.pathsep.join([*(p for p in pythonpath.split(os.pathsep) if p), str(cwd.resolve())])
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
        env["ACCELERATE_CONFIG_DS_FIELDS"] = "true" if config.get("deepspeed_config") else "false"
        for name, variable, lower in _DEEPSPEED_VARIABLES:
            value = get(name)
            if value is not None:
                env[variable] = _text(value, lower)
    return env


def _flag_bool(value: Any) -> bool:
    return bool(to_bool(str(value))) if not isinstance(value, bool) else value


def _strip_launch_flags(args: Sequence[str]) -> list[str]:
    """``trl sft``'s argv without the flags it would hand to accelerate launch (and ``--accelerate_config``)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        name = normalise(token.split("=", 1)[0]) if is_flag(token) else ""
        if name in ACCELERATE_BOOL:
            i += 1
            continue
        if name in ACCELERATE_VALUED:
            i += 1 if "=" in token or i + 1 >= len(args) or is_flag(args[i + 1]) else 2
            continue
        out.append(token)
        i += 1
    return out


def worker_launch(argv: Sequence[str], world_size: int, *, environ: Mapping[str, str] | None = None,
                  cwd: str | os.PathLike[str] | None = None, port: int = DEFAULT_PORT) -> WorkerLaunch:
    """Rank 0's worker command and launcher variables for ``argv`` rehearsed at ``world_size`` ranks.

    Raises:
        CommandReadError: a command that cannot be read (the message says what to do), or one that runs on
            more than one machine (a rehearsal is one rank of one machine's launcher).
    """
    env_in = os.environ if environ is None else environ
    folder = Path(cwd) if cwd is not None else Path.cwd()
    # The command is read once, by the launcher's reader: the assignments and runners in front (``srun``,
    # ``uv run --with ...``, ``hf jobs uv run``) peeled off, the launcher's flags read as the plan reads them.
    state, target = split_launcher(argv, env_in, folder)
    notes: list[str] = []
    if state.nodes > 1:
        notes.append(f"the command spans {state.nodes} machines; rehearsed as {world_size} ranks of one")
    launch_opts: list[Option] = list(state.launch_options)
    if PYTHON_NAME.match(os.path.basename(state.executable)):
        python = state.executable  # python train.py, python -m torch.distributed.run ...
    elif state.starts is not None or target.worker is not None:
        python = interpreter_of(state.executable, env_in)  # a console script: the Python its #! names
    else:
        python = sys.executable  # ./train.py
    no_python = any(o.name == "no_python" for o in launch_opts)
    env: dict[str, str] = dict(state.assigned)
    args = list(target.args)
    starts = state.starts or target.starts
    if target.worker is not None:
        # The program's own CLI (`trl sft`, `axolotl train`) starts its workers through a launcher: run the worker
        # module under the CLI's Python with that launcher's environment.
        if target.launch_flags_inline:  # `trl sft`: its launch flags go to accelerate, the rest to the script
            launch_opts = _inline_launch_options(args)
            apply_accelerate(state, launch_opts, env_in, folder)
            args = _strip_launch_flags(args)
        worker = [python, "-u", "-m", target.worker, *args]
    elif target.kind == "module":
        worker = [python, "-u", "-m", target.name, *args]
    elif no_python:
        worker = [target.name, *args]
    else:
        worker = [python, "-u", target.name, *args]
    if starts == "deepspeed":
        env.update(deepspeed_env(world_size, port=port))
        if not any(o.name == "no_local_rank" for o in launch_opts):
            worker.append("--local_rank=0")
    else:
        env.update(torchrun_env(world_size, port=port, environ=env_in))
    if starts == "accelerate":
        config = _accelerate_config(state)
        env.update(accelerate_env(config, launch_opts, cwd=folder, environ=env_in))
    if starts is None and target.kind in ("script", "module"):
        notes.append("the command has no launcher: rehearsed with torchrun's environment")
    launch = state.freeze()
    if launch.world_size is not None and launch.world_size != world_size:
        notes.append(f"the command starts {launch.world_size} processes; rehearsed at {world_size} as --gpus says")
    fsdp_version = None
    if launch.strategy == "fsdp":
        text = env.get("FSDP_VERSION", "1")
        fsdp_version = int(text) if text.isdigit() else 1
    return WorkerLaunch(launcher=state.launcher, argv=tuple(worker), env=env, world_size=world_size,
                        strategy=launch.strategy or ("ddp" if world_size > 1 else None), offload=launch.offload,
                        zero_stage=launch.zero_stage, fsdp_version=fsdp_version, notes=tuple(notes + state.notes),
                        starts=starts)


def _inline_launch_options(args: Sequence[str]) -> list[Option]:
    """The accelerate launch flags inside a ``trl sft`` argv (``Target.launch_flags_inline``), as options."""
    out: list[Option] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not is_flag(token):
            continue
        written, _, inline = token.partition("=")
        name = normalise(written)
        if name in ACCELERATE_BOOL:
            out.append(Option(name, [], written))
        elif name in ACCELERATE_VALUED:
            if inline:
                out.append(Option(name, [inline], written))
            elif i < len(args) and not is_flag(args[i]):
                out.append(Option(name, [args[i]], written))
                i += 1
    return out


def _accelerate_config(state: LaunchState) -> dict[str, Any]:
    """The accelerate config file the reading used (``--config_file``, TRL's ``--accelerate_config``, the default)."""
    if state.config_file is None or not state.config_file.endswith((".yaml", ".yml")):
        return {}
    try:
        return load_yaml(state.config_file, "accelerate config")
    except CommandReadError:
        return {}


__all__ = ["WorkerLaunch", "accelerate_env", "deepspeed_env", "interpreter_of", "torchrun_env", "worker_launch"]
