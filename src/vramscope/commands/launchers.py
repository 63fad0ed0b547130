"""The launcher in front of a training program: ``python``, ``python -m``, ``accelerate launch``, ``torchrun``,
``deepspeed``, ``trl sft``, ``axolotl train``; what it says about processes and strategy, and what it runs.

:func:`split_launcher` peels the launcher off the argv and returns the program to read; the distributed
reading (world size, ``ddp`` / ``fsdp`` / ``zero2`` / ``zero3``, offload) is accumulated in
:class:`LaunchState` from the launcher's flags, accelerate's ``--config_file`` YAML, DeepSpeed's JSON and
the program's own ``--fsdp`` / ``--deepspeed`` flags, then frozen into a :class:`~.types.Launch`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from vramscope.commands.argv import Option, is_flag, normalise, to_bool
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_json_or_text, load_yaml
from vramscope.commands.fsdp import ACCELERATE_DEFAULT, fsdp_version_of
from vramscope.commands.types import Launch, Strategy

PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?(\.exe)?$")  # python, python3, python3.11, python.exe
_PYTHON_FLAGS_WITH_VALUE = {"-W", "-X"}
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# accelerate launch's flags that take no value (accelerate 1.x `launch_command_parser`); every other takes one.
ACCELERATE_BOOL = frozenset(normalise(f) for f in (
    "--quiet", "--cpu", "--multi_gpu", "--tpu", "--enable_cpu_affinity", "--dynamo_use_fullgraph",
    "--dynamo_use_dynamic", "--dynamo_use_regional_compilation", "--use_deepspeed", "--use_fsdp",
    "--use_parallelism_config", "--use_megatron_lm", "--same_network", "--module", "--no_python", "--tpu_cluster",
    "--no_tpu_cluster", "--tpu_use_sudo", "--downcast_bf16", "--fp8_use_autocast_during_eval", "--debug",
))
ACCELERATE_VALUED = frozenset(normalise(f) for f in (
    "--config_file", "--mixed_precision", "--num_processes", "--num_machines", "--num_cpu_threads_per_process",
    "--dynamo_backend", "--dynamo_mode", "--gpu_ids", "--machine_rank", "--main_process_ip", "--main_process_port",
    "--tee", "--log_dir", "--role", "--rdzv_backend", "--rdzv_conf", "--max_restarts", "--monitor_interval",
    "--main_training_function", "--deepspeed_config_file", "--zero_stage", "--offload_optimizer_device",
    "--offload_param_device", "--zero3_init_flag", "--zero3_save_16bit_model", "--deepspeed_hostfile",
    "--deepspeed_multinode_launcher", "--fsdp_version", "--fsdp_offload_params", "--fsdp_sharding_strategy",
    "--fsdp_reshard_after_forward", "--fsdp_auto_wrap_policy", "--fsdp_transformer_layer_cls_to_wrap",
    "--fsdp_backward_prefetch", "--fsdp_state_dict_type", "--fsdp_forward_prefetch", "--fsdp_use_orig_params",
    "--fsdp_cpu_ram_efficient_loading", "--fsdp_sync_module_states", "--fsdp_activation_checkpointing",
    "--fsdp_min_num_params", "--accelerate_config",
))
_TORCHRUN_BOOL = frozenset(normalise(f) for f in ("--standalone", "--module", "--no_python", "--run_path", "--use_env"))
_DEEPSPEED_BOOL = frozenset(normalise(f) for f in (
    "--no_python", "--module", "--no_local_rank", "--force_multi", "--save_pid", "--elastic_training",
    "--bind_cores_to_rank", "--no_ssh", "--no_ssh_check", "--autotuning",
))
# The launcher whose rank environment a command's processes start in (what a rehearsal rebuilds for rank 0).
RankLauncher = Literal["torchrun", "accelerate", "deepspeed"]

_SHORT = {"m": "module", "q": "quiet", "t": "tee", "H": "hostfile", "i": "include", "e": "exclude", "r": "redirects"}


@dataclass
class LaunchState:
    """The distributed reading so far; later sources (the program's own flags) override earlier ones."""

    launcher: str = "python"
    per_node: int | None = 1  # None: one process per visible GPU, decided at start-up
    nodes: int = 1
    total: int | None = None  # accelerate's --num_processes counts all machines' processes
    strategy: Strategy | None = None
    offload: bool = False
    zero_stage: int | None = None
    config_file: str | None = None
    visible: int | None = None  # CUDA_VISIBLE_DEVICES' count, when the command sets it
    fsdp_version: int | None = None  # as the command states it; None: unsaid (fsdp_default applies)
    fsdp_default: tuple[int, str] = ACCELERATE_DEFAULT  # the version that runs when unsaid, and whose default
    read: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)  # guesses about processes and strategy (see ParsedCommand)
    cwd: Path = field(default_factory=Path.cwd)  # relative config paths are read from here
    # What a rehearsal of one rank needs beside the reading: the variables assigned in front of the command
    # (``FOO=1 torchrun ...``), the command's first word once those and any runner (``uv run``, ``srun``) are
    # peeled off (its Python, or the console script whose ``#!`` names one), the launcher that starts the ranks
    # and that launcher's own flags as read.
    assigned: dict[str, str] = field(default_factory=dict)
    executable: str = ""
    starts: RankLauncher | None = None
    launch_options: list[Option] = field(default_factory=list)

    def deepspeed(self, config: Mapping[str, Any], source: str) -> None:
        """A DeepSpeed config (``ds.json``, or accelerate's ``deepspeed_config``)."""
        zero = config.get("zero_optimization")
        stage: Any = zero.get("stage", 0) if isinstance(zero, Mapping) else config.get("zero_stage", 0)
        try:
            stage = int(stage)
        except (TypeError, ValueError):
            raise CommandReadError(f"{source}: ZeRO stage {stage!r} is not a number 0-3") from None
        self.set_zero(stage, source)
        if isinstance(zero, Mapping):
            for key in ("offload_optimizer", "offload_param"):
                part = zero.get(key)
                device = part.get("device") if isinstance(part, Mapping) else None
                if isinstance(device, str) and device.lower() not in ("none", ""):
                    self.offload = True
        for key in ("offload_optimizer_device", "offload_param_device"):
            device = config.get(key)
            if isinstance(device, str) and device.lower() not in ("none", ""):
                self.offload = True

    def set_fsdp_version(self, value: Any, source: str) -> None:
        """The FSDP version a launcher or program states (a later source overrides an earlier one)."""
        self.fsdp_version = fsdp_version_of(value, source)

    def set_zero(self, stage: int, source: str) -> None:
        if not 0 <= stage <= 3:
            raise CommandReadError(f"{source}: ZeRO stage {stage} is not 0-3")
        self.zero_stage = stage
        if stage >= 2:
            self.strategy = "zero3" if stage == 3 else "zero2"
        else:
            self.strategy = "ddp"
            if stage == 1:
                self.notes.append("ZeRO stage 1 (sharded optimizer states) is planned as ddp, which errs high")

    def freeze(self) -> Launch:
        world = self.total if self.total is not None else None if self.per_node is None else self.per_node * self.nodes
        strategy = self.strategy
        if strategy is None and (world is None or world > 1):
            strategy = "ddp"  # several processes and nothing sharded: each holds the whole model
        version = (self.fsdp_version or self.fsdp_default[0]) if strategy == "fsdp" else None
        return Launch(launcher=self.launcher, world_size=world, strategy=strategy, offload=self.offload,
                      zero_stage=self.zero_stage, config_file=self.config_file, nodes=self.nodes,
                      fsdp_version=version)


@dataclass
class Target:
    """What the launcher runs: ``kind`` is ``script``, ``module``, or a program's own CLI: ``trl`` (``trl <sub>``),
    ``axolotl``, ``llamafactory``, ``swift`` (the executable's name).

    Attributes:
        worker: the module a program's own CLI starts its workers as, through a launcher (``trl sft``:
            ``trl.scripts.sft``; ``axolotl train``: ``axolotl.cli.train``), so a rehearsal runs it directly; None
            where the command runs its script or module itself (or vramscope does not rehearse the CLI).
        starts: the launcher that CLI starts the workers with (``accelerate``, ``torchrun``), with ``worker``.
        launch_flags_inline: the CLI takes its launcher's flags among the program's (``trl sft --num_processes 2``).
    """

    kind: str
    name: str
    args: list[str]
    worker: str | None = None
    starts: RankLauncher | None = None
    launch_flags_inline: bool = False


def _rank_launcher(name: str) -> RankLauncher | None:
    """``name`` as a launcher that starts ranks (axolotl's ``--launcher``), None for any other (``python``)."""
    return cast("RankLauncher", name) if name in get_args(RankLauncher) else None


def _flag_options(tokens: Sequence[str], start: int, bools: frozenset[str],
                  valued: frozenset[str] | None = None) -> tuple[list[Option], int]:
    """A launcher's flags from ``tokens[start:]`` up to the program; returns them and the program's index."""
    options: list[Option] = []
    i = start
    while i < len(tokens):
        token = tokens[i]
        if not is_flag(token):
            break
        if token == "--":
            i += 1
            break
        written = token
        if "=" in token and token.startswith("--"):
            name, value = token.split("=", 1)
            options.append(Option(normalise(name), [value], name))
            i += 1
            continue
        name = normalise(token)
        if not token.startswith("--"):
            name = _SHORT.get(name, name)
        i += 1
        if name in bools:
            options.append(Option(name, [], written))
            continue
        nxt = tokens[i] if i < len(tokens) else None
        known = valued is None or name in valued
        if nxt is not None and not is_flag(nxt) and (known or not nxt.endswith(".py")):
            options.append(Option(name, [nxt], written))
            i += 1
        else:
            options.append(Option(name, [], written))
    return options, i


def _int(option: Option, what: str) -> int | None:
    value = option.values[0] if option.values else ""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value in ("gpu", "auto"):
        return None
    raise CommandReadError(f"{option.written} {value!r}: expected the number of {what}")


def _record(state: LaunchState, option: Option) -> None:
    state.read[option.written] = " ".join(option.values) if option.values else "true"


def apply_accelerate(state: LaunchState, options: Sequence[Option], environ: Mapping[str, str],
                     cwd: Path) -> list[Option]:
    """accelerate launch's flags (and the ``--config_file`` they name) into ``state``; returns the others."""
    by_name = {o.name: o for o in options}
    config_option = by_name.get("config_file")
    trl_named = by_name.get("accelerate_config")
    config_path: Path | None = None
    if trl_named is not None and trl_named.values:
        config_path = _trl_accelerate_config(trl_named.values[0], cwd)
        _record(state, trl_named)
    if config_option is not None and config_option.values:
        config_path = _resolve(config_option.values[0], cwd)
        _record(state, config_option)
    if config_path is None:
        default = Path(environ.get("HF_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".cache/huggingface")
        candidate = default / "accelerate" / "default_config.yaml"
        if candidate.is_file():
            config_path = candidate
            state.notes.append(f"accelerate's default config {candidate} applies (no --config_file)")
    state.per_node = None  # accelerate launch without a count starts one process per visible GPU
    if config_path is not None:
        _accelerate_config(state, load_yaml(config_path, "accelerate config"), str(config_path), cwd)
    rest: list[Option] = []
    for o in options:
        n = o.name
        if n in ("config_file", "accelerate_config"):
            continue
        if n == "num_processes":
            state.total = _int(o, "processes")
        elif n == "num_machines":
            state.nodes = _int(o, "machines") or 1
        elif n == "multi_gpu":
            state.strategy = state.strategy or "ddp"
        elif n == "use_fsdp":
            state.strategy = "fsdp"
        elif n == "use_deepspeed":
            if state.zero_stage is None:
                state.set_zero(2, o.written)  # accelerate's default --zero_stage
        elif n == "zero_stage":
            state.set_zero(_int(o, "ZeRO stage") or 0, o.written)
        elif n in ("offload_optimizer_device", "offload_param_device"):
            if o.values and o.values[0].lower() != "none":
                state.offload = True
        elif n == "fsdp_offload_params":
            state.offload = bool(to_bool(o.values[0])) if o.values else True
        elif n == "fsdp_version":
            state.set_fsdp_version(o.values[0] if o.values else "", o.written)  # beats the config file's
        elif n == "deepspeed_config_file" and o.values:
            state.deepspeed(load_json_or_text(str(_resolve(o.values[0], cwd)), "DeepSpeed config"), o.written)
            state.config_file = o.values[0]
        elif n == "gpu_ids" and o.values and o.values[0] != "all" and state.total is None:
            state.total = len([g for g in o.values[0].split(",") if g.strip()])
        elif n == "cpu":
            state.notes.append("accelerate launch --cpu: the run uses no GPU")
        elif n not in ACCELERATE_BOOL and n not in ACCELERATE_VALUED:
            rest.append(o)
            continue
        _record(state, o)
    if state.total is None and state.per_node is None:
        state.notes.append("accelerate launch starts one process per visible GPU unless --num_processes says")
    return rest


def _accelerate_config(state: LaunchState, cfg: Mapping[str, Any], source: str, cwd: Path) -> None:
    state.config_file = source
    kind = str(cfg.get("distributed_type", "NO")).upper()
    processes = cfg.get("num_processes")
    machines = cfg.get("num_machines", 1)
    if isinstance(machines, int) and machines > 0:
        state.nodes = machines
    if isinstance(processes, int) and processes > 0:
        state.total = processes
    if kind == "MULTI_GPU":
        state.strategy = "ddp"
    elif kind == "FSDP":
        state.strategy = "fsdp"
        fsdp = cfg.get("fsdp_config")
        fsdp = fsdp if isinstance(fsdp, Mapping) else {}
        # accelerate reads fsdp_config's bare keys as fsdp_<key> (`version: 2` is fsdp_version)
        if to_bool(str(fsdp.get("fsdp_offload_params", fsdp.get("offload_params", False)))):
            state.offload = True
        key = next((k for k in ("fsdp_version", "version") if fsdp.get(k) is not None), None)
        if key is not None:
            state.set_fsdp_version(fsdp[key], f"{Path(source).name}: fsdp_config.{key}")
            state.read[f"fsdp_version ({Path(source).name})"] = str(state.fsdp_version)
    elif kind == "DEEPSPEED":
        ds = cfg.get("deepspeed_config")
        ds = ds if isinstance(ds, Mapping) else {}
        file = ds.get("deepspeed_config_file")
        if isinstance(file, str) and file.strip():
            state.deepspeed(load_json_or_text(str(_resolve(file, cwd)), "DeepSpeed config"), source)
        else:
            state.deepspeed(ds, source)
    elif kind not in ("NO", "NONE"):
        state.notes.append(f"accelerate distributed_type {kind} is not planned; read as one process per GPU")
    state.read[f"distributed_type ({Path(source).name})"] = kind


def _trl_accelerate_config(value: str, cwd: Path) -> Path:
    """``trl sft --accelerate_config zero2``: a file, or a config TRL ships under that name."""
    path = _resolve(value, cwd)
    if path.is_file():
        return path
    spec = importlib.util.find_spec("trl")  # finds the package without importing it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            shipped = Path(folder) / "accelerate_configs" / f"{value}.yaml"
            if shipped.is_file():
                return shipped
    raise CommandReadError(f"--accelerate_config {value!r} is neither a file nor a config TRL ships "
                           "(fsdp1, fsdp2, multi_gpu, single_gpu, zero1, zero2, zero3)")


def _resolve(value: str, cwd: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else cwd / p


def _torchrun(state: LaunchState, options: Sequence[Option]) -> None:
    for o in options:
        if o.name in ("nproc_per_node",):
            state.per_node = _int(o, "processes per node")
        elif o.name == "nnodes" and o.values:
            nodes = o.values[0].split(":")[-1]
            if not nodes.isdigit():
                raise CommandReadError(f"{o.written} {o.values[0]!r}: expected a number of nodes")
            state.nodes = max(1, int(nodes))
        elif o.name == "standalone":
            pass
        else:
            continue
        _record(state, o)


def _deepspeed_launcher(state: LaunchState, options: Sequence[Option]) -> None:
    state.per_node = None  # every visible GPU unless --num_gpus / --include says
    for o in options:
        if o.name == "num_gpus":
            state.per_node = _int(o, "GPUs")
        elif o.name == "num_nodes":
            state.nodes = _int(o, "nodes") or 1
        elif o.name == "include" and o.values:
            # localhost:0,1 (one host): the GPUs after the colon
            hosts = o.values[0].split("@")
            state.per_node = len(hosts[0].split(":", 1)[-1].split(","))
        else:
            continue
        _record(state, o)


def _program(tokens: Sequence[str], i: int, module: bool, what: str) -> Target:
    if i >= len(tokens):
        raise CommandReadError(f"{what} is not given a script or module to run; {HOW_INSTEAD}")
    if module:
        return Target("module", tokens[i], list(tokens[i + 1:]))
    return Target("script", tokens[i], list(tokens[i + 1:]))


def split_launcher(argv: Sequence[str], environ: Mapping[str, str], cwd: Path) -> tuple[LaunchState, Target]:
    """The launcher's reading and the program it runs.

    Raises:
        CommandReadError: an empty command, an unknown launcher, ``python -c``, a launcher with no program.
    """
    tokens = list(argv)
    state = LaunchState(cwd=cwd)
    env: dict[str, str] = {}
    while tokens and (_ENV_ASSIGNMENT.match(tokens[0]) or tokens[0] == "env"):
        if tokens[0] != "env":
            key, value = tokens[0].split("=", 1)
            state.read[key] = value
            env[key] = value
        tokens.pop(0)
    state.assigned = dict(env)
    tokens = _peel_runners(tokens, state)
    _environment(state, env)
    if not tokens:
        raise CommandReadError(f"no training command after '--'; {HOW_INSTEAD}")
    state.executable = tokens[0]
    head = os.path.basename(tokens[0])
    if PYTHON_NAME.match(head):
        return _after_python(tokens, state, environ, cwd)
    if head == "accelerate":
        if len(tokens) < 2 or tokens[1] != "launch":
            raise CommandReadError(f"'accelerate {' '.join(tokens[1:2])}' does not train; vramscope reads "
                                   f"'accelerate launch ...'; {HOW_INSTEAD}")
        return _accelerate(tokens, 2, state, environ, cwd)
    if head == "torchrun":
        return _torchrun_target(tokens, 1, state)
    if head == "deepspeed":
        options, i = _flag_options(tokens, 1, _DEEPSPEED_BOOL)
        state.launcher = state.starts = "deepspeed"
        state.launch_options = options
        _deepspeed_launcher(state, options)
        return state, _program(tokens, i, any(o.name == "module" for o in options), "deepspeed")
    if head == "trl":
        if len(tokens) < 2:
            raise CommandReadError(f"'trl' needs a command such as 'trl sft ...'; {HOW_INSTEAD}")
        state.launcher = "trl"  # runs accelerate launch itself, the flags it does not know handed to it
        return state, Target("trl", tokens[1], tokens[2:], worker=f"trl.scripts.{tokens[1]}", starts="accelerate",
                             launch_flags_inline=True)
    if head == "axolotl":
        if len(tokens) < 2 or tokens[1] != "train":
            raise CommandReadError(f"vramscope reads 'axolotl train config.yml', not 'axolotl "
                                   f"{' '.join(tokens[1:2])}'; {HOW_INSTEAD}")
        return state, _axolotl(tokens[2:], state)
    if head in ("llamafactory-cli", "lmf"):
        if len(tokens) < 2 or tokens[1] != "train":
            raise CommandReadError(f"vramscope reads 'llamafactory-cli train config.yaml', not "
                                   f"'{head} {' '.join(tokens[1:2])}'; {HOW_INSTEAD}")
        _llamafactory_launch(state, env, environ)
        # llamafactory-cli train runs its own module under torchrun on several GPUs (cli.py: `torchrun ...
        # launcher.__file__ config.yaml`, FORCE_TORCHRUN or more than one visible GPU): a rank is that module
        return state, Target("llamafactory", "llamafactory-cli train", tokens[2:], worker="llamafactory.launcher",
                             starts="torchrun")
    if head == "swift":
        if len(tokens) < 2 or tokens[1] not in ("sft", "rlhf", "pt"):
            raise CommandReadError(f"vramscope reads 'swift sft', 'swift rlhf' and 'swift pt', not "
                                   f"'swift {' '.join(tokens[1:2])}'; {HOW_INSTEAD}")
        state.launcher = "swift"
        if "NPROC_PER_NODE" not in env:
            state.per_node = 1  # swift runs one process unless NPROC_PER_NODE says (it then runs torchrun)
        return state, Target("swift", tokens[1], tokens[2:])
    if head.endswith(".py"):
        return state, Target("script", tokens[0], tokens[1:])
    raise CommandReadError(f"cannot read the command '{tokens[0]}': vramscope reads python, accelerate launch, "
                           f"torchrun, deepspeed, trl sft and axolotl train commands; {HOW_INSTEAD}")


def _peel_runners(tokens: list[str], state: LaunchState) -> list[str]:
    """What an environment manager or job runner in front runs: ``uv run [flags]``, ``hf jobs uv run [flags]``,
    ``poetry run``, ``srun [flags]``."""
    while tokens:
        if tokens[:3] == ["hf", "jobs", "uv"] and tokens[3:4] == ["run"]:
            state.notes.append("hf jobs uv run: the job runs on one GPU of its --flavor")
            tokens = _skip_flags(tokens[4:], {"flavor", "timeout", "secrets", "env", "e", "s", "namespace",
                                              "with", "image", "python", "token"})
        elif len(tokens) > 1 and tokens[0] in ("uv", "poetry", "pipenv", "pdm") and tokens[1] == "run":
            tokens = _skip_flags(tokens[2:], {"with", "python", "p", "env_file", "extra", "group", "index",
                                              "project", "directory", "package"})
        elif tokens[0] == "srun":
            state.notes.append("srun: the processes per node are what the command after it starts")
            tokens = _skip_flags(tokens[1:], None)
        else:
            return tokens
    return tokens


def _skip_flags(tokens: list[str], valued: set[str] | None) -> list[str]:
    """``tokens`` after the runner's own flags (``--flag value`` for the valued ones, ``--flag=value``)."""
    i = 0
    while i < len(tokens) and tokens[i].startswith("-"):
        flag = tokens[i]
        i += 1
        if "=" in flag:
            continue
        name = normalise(flag)
        takes_value = valued is None or name in valued
        if takes_value and i < len(tokens) and not tokens[i].startswith("-") and (
                valued is not None or not tokens[i].startswith(("python", "torchrun", "accelerate"))):
            i += 1
    return tokens[i:]


def _environment(state: LaunchState, env: Mapping[str, str]) -> None:
    """Environment variables in front of the command that say how processes start or share the model."""
    if env.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true", "yes"):
        state.strategy = "fsdp"
        if env.get("FSDP_OFFLOAD_PARAMS", "").lower() in ("1", "true", "yes"):
            state.offload = True
    if env.get("FSDP_VERSION"):
        state.set_fsdp_version(env["FSDP_VERSION"], "FSDP_VERSION")
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes") and state.strategy is None:
        state.set_zero(int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2") or 2), "ACCELERATE_USE_DEEPSPEED")
    count = env.get("NPROC_PER_NODE")
    if count is not None and count.isdigit() and int(count) > 0:
        state.per_node = int(count)
    nodes = env.get("NNODES")
    if nodes is not None and nodes.isdigit() and int(nodes) > 0:
        state.nodes = int(nodes)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        state.visible = len([g for g in visible.split(",") if g.strip()])


def _llamafactory_launch(state: LaunchState, env: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """llamafactory-cli train: torchrun over NPROC_PER_NODE (default every visible GPU) when FORCE_TORCHRUN
    is set or more than one GPU is visible; one process otherwise."""
    state.launcher = "llamafactory-cli"
    force = env.get("FORCE_TORCHRUN", environ.get("FORCE_TORCHRUN", "")).lower() in ("1", "true", "yes")
    if "NPROC_PER_NODE" in env:
        if force or state.per_node != 1:
            state.launcher = "llamafactory-cli (torchrun)"
        return
    if state.visible is not None:
        state.per_node = state.visible
        if state.visible > 1 or force:
            state.launcher = "llamafactory-cli (torchrun)"
        return
    state.per_node = None
    state.notes.append("llamafactory-cli train runs torchrun over every visible GPU when there are several "
                       "(NPROC_PER_NODE or CUDA_VISIBLE_DEVICES would say how many)")


def _axolotl(args: list[str], state: LaunchState) -> Target:
    """``axolotl train cfg.yml [--launcher accelerate|torchrun] [-- launcher args]``."""
    state.launcher = "axolotl"
    state.per_node = None
    launcher = "accelerate"
    rest: list[str] = []
    launcher_args: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            launcher_args = args[i + 1:]
            break
        if word.startswith("--launcher"):
            if "=" in word:
                launcher = word.split("=", 1)[1]
            elif i + 1 < len(args):
                launcher = args[i + 1]
                i += 1
        else:
            rest.append(word)
        i += 1
    if launcher_args:
        options, _ = _flag_options(launcher_args, 0, _TORCHRUN_BOOL | ACCELERATE_BOOL)
        if launcher == "torchrun":
            _torchrun(state, options)
        else:
            for o in options:
                if o.name == "num_processes":
                    state.total = _int(o, "processes")
                    _record(state, o)
    if state.per_node is None and state.total is None:
        state.notes.append(f"axolotl train starts {launcher}: one process per visible GPU unless told otherwise")
    state.launcher = f"axolotl ({launcher})"
    return Target("axolotl", "axolotl.cli.train", rest, worker="axolotl.cli.train",
                  starts=_rank_launcher(launcher))


def _after_python(tokens: list[str], state: LaunchState, environ: Mapping[str, str],
                  cwd: Path) -> tuple[LaunchState, Target]:
    i = 1
    while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-":
        flag = tokens[i]
        if flag == "-c":
            raise CommandReadError(f"cannot read 'python -c ...': there is no script to read; {HOW_INSTEAD}")
        if flag == "-m" or (flag.startswith("-m") and len(flag) > 2):
            module = tokens[i + 1] if flag == "-m" and i + 1 < len(tokens) else flag[2:]
            rest = tokens[i + 2:] if flag == "-m" else tokens[i + 1:]
            if not module:
                raise CommandReadError(f"'python -m' without a module; {HOW_INSTEAD}")
            if module in ("torch.distributed.run", "torch.distributed.launch"):
                return _torchrun_target([module, *rest], 1, state)
            if module in ("accelerate.commands.launch", "accelerate.commands.accelerate_cli"):
                start = 1 if rest[:1] == ["launch"] else 0
                return _accelerate([module, *rest], 1 + start, state, environ, cwd)
            state.launcher = "python -m"
            return state, Target("module", module, list(rest))
        i += 2 if flag in _PYTHON_FLAGS_WITH_VALUE else 1
    if i >= len(tokens):
        raise CommandReadError(f"'{' '.join(tokens)}' runs no script; {HOW_INSTEAD}")
    return state, Target("script", tokens[i], tokens[i + 1:])


def _accelerate(tokens: list[str], start: int, state: LaunchState, environ: Mapping[str, str],
                cwd: Path) -> tuple[LaunchState, Target]:
    options, i = _flag_options(tokens, start, ACCELERATE_BOOL, ACCELERATE_VALUED)
    state.launcher = state.starts = "accelerate"
    state.launch_options = options
    rest = apply_accelerate(state, options, environ, cwd)
    for o in rest:
        state.notes.append(f"accelerate launch flag {o.written} is not one vramscope knows; ignored")
    return state, _program(tokens, i, any(o.name == "module" for o in options), "accelerate launch")


def _torchrun_target(tokens: list[str], start: int, state: LaunchState) -> tuple[LaunchState, Target]:
    options, i = _flag_options(tokens, start, _TORCHRUN_BOOL)
    state.launcher = state.starts = "torchrun"
    state.launch_options = options
    _torchrun(state, options)
    return state, _program(tokens, i, any(o.name == "module" for o in options), "torchrun")
