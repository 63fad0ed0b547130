"""Read a training command's argv into the run it would start, without running it.

``parse_command(["python", "-m", "trl.scripts.sft", "--model_name_or_path", "./llama", ...])`` returns a
:class:`ParsedCommand`: the model, the recipe (:class:`~vramscope.recipe.QLoraSpec` with its ``framework``),
the per-device batch, the sequence length, gradient accumulation, the launcher with its world size and
distributed strategy (:class:`Launch`), what was read (flag -> value), the program defaults it applied and
the flags it did not understand. ``vramscope plan -- <command>`` plans it; ``vramscope tune -- <command>``
runs trials of it. Pure: no torch; it reads only the files the command names (config.json of a local model
directory, YAML and JSON configs, and the script's text to recognise an ``HfArgumentParser`` script).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vramscope.commands.argv import Option, Reader, options_from_mapping, shown, split_options
from vramscope.commands.axolotl import config_path, read_axolotl
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_yaml, script_text
from vramscope.commands.launchers import ACCELERATE_BOOL, ACCELERATE_VALUED, apply_accelerate, split_launcher
from vramscope.commands.programs import (
    IGNORED,
    Reading,
    looks_like_hf,
    looks_like_trl_sft,
    model_type_of,
    read_hf,
    read_qlora,
    read_trl,
)
from vramscope.commands.types import STRATEGIES, Launch, ParsedCommand, Strategy
from vramscope.planner.errors import PlanInputError
from vramscope.recipe import QLoraSpec

__all__ = ["STRATEGIES", "CommandReadError", "Launch", "ParsedCommand", "Strategy", "parse_command"]

_TRL_SCRIPT = ("trl/scripts/sft.py",)
_SCRIPT_TEXT_LIMIT = 1 << 20


def parse_command(argv: Sequence[str], cwd: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> ParsedCommand:
    """What ``argv`` would train, read from its flags and the files it names; nothing is run.

    Args:
        argv: the training command, e.g. ``["trl", "sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", ...]``.
        cwd: the folder the command would run in (relative paths are read from it); default the current one.
        environ: the environment it would run with (accelerate's default config location); default ``os.environ``.

    Raises:
        CommandReadError: a command vramscope cannot read: an unknown launcher, a plain script whose flags say
            nothing about the model and shapes, a config file that does not parse, no model given, a value
            of the wrong type. The message is one line that says how to plan instead.
    """
    folder = Path(cwd) if cwd is not None else Path.cwd()
    env = os.environ if environ is None else environ
    state, target = split_launcher(argv, env, folder)
    options, positionals = split_options(target.args)
    config_options: list[Option] = []
    config_file: str | None = None
    yaml_cfg: dict[str, Any] = {}

    program = _program(target, folder)
    config_option = next((o for o in options if o.name == "config"), None) if program == "trl" else None
    if config_option is not None:  # TrlParser's --config file.yaml: its keys are defaults, the flags win
        if not config_option.values:
            raise CommandReadError("--config needs a YAML file (TRL's --config sft.yaml)")
        config_file = config_option.values[0]
        yaml_cfg = load_yaml(_under(config_file, folder), "TRL config")
        yaml_cfg.pop("env", None)
        config_options = options_from_mapping(yaml_cfg, Path(config_file).name)
        options = [o for o in options if o.name != "config"]
    if program == "axolotl":
        path = config_path(positionals, folder)
        config_file = str(path)
        yaml_cfg = load_yaml(path, "axolotl config")
        config_options = options_from_mapping(yaml_cfg, path.name)
        positionals = [p for p in positionals if _under(p, folder) != path]
    reader = Reader([*config_options, *options])
    models: dict[str | None, str | None] = {}

    def model_type_of_name(model: str | None) -> str | None:
        if model not in models:
            models[model] = model_type_of(_model(model, folder)[1]) if model else None
            if model and models[model] is None:
                models[model] = _registry_type(model)
        return models[model]

    if program == "trl":
        reading = read_trl(reader, state, model_type_of_name)
    elif program == "qlora":
        reading = read_qlora(reader, state)
    elif program == "axolotl":
        reading = read_axolotl(reader, state, model_type_of_name, yaml_cfg, folder)
    else:
        text = _script_text(target, folder)
        if not looks_like_hf(reader, text):
            raise CommandReadError(
                f"cannot read the model and shapes from '{' '.join(argv[:4])}{' ...' if len(argv) > 4 else ''}': "
                f"it is not a TRL, HfArgumentParser / HF Trainer or axolotl command; {HOW_INSTEAD}")
        reading = read_hf(reader, state)
    reader.ignore(IGNORED)
    leftovers = reader.unused()
    if state.launcher == "trl":
        # `trl sft` hands the flags its parser does not know to accelerate launch.
        launch_like = [o for o in leftovers if o.name in ACCELERATE_BOOL or o.name in ACCELERATE_VALUED]
        apply_accelerate(state, launch_like, env, folder)
        leftovers = [o for o in leftovers if o not in launch_like]
    model_config = _model(reading.model, folder)[1] if reading.model else None
    return _assemble(argv, target.name, reading, state, reader, leftovers, positionals, model_config, config_file)


def _program(target: Any, folder: Path) -> str:
    if target.kind == "trl":
        if target.name != "sft":
            raise CommandReadError(f"vramscope reads 'trl sft', not 'trl {target.name}'; {HOW_INSTEAD}")
        return "trl"
    if target.kind == "axolotl":
        return "axolotl"
    if target.kind == "module":
        if target.name == "trl.scripts.sft":
            return "trl"
        if target.name in ("axolotl.cli.train",):
            return "axolotl"
        if target.name.startswith(("trl.", "axolotl.")):
            raise CommandReadError(f"vramscope reads trl.scripts.sft and axolotl.cli.train, not {target.name}; "
                                   f"{HOW_INSTEAD}")
        return "hf"
    path = target.name.replace("\\", "/")
    if path.endswith(_TRL_SCRIPT):
        return "trl"
    if os.path.basename(path) == "qlora.py":
        return "qlora"
    if looks_like_trl_sft(_script_text(target, folder)):
        return "trl"
    return "hf"


def _script_text(target: Any, folder: Path) -> str:
    if target.kind != "script":
        return ""
    return script_text(_under(target.name, folder), _SCRIPT_TEXT_LIMIT)  # bounded; a FIFO is refused, not read


def _under(value: str, folder: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else folder / p


def _model(model: str, folder: Path) -> tuple[str, dict[str, Any] | None]:
    """``(model, config.json fields)`` when ``model`` is a local directory, ``(model, None)`` for a name."""
    from vramscope.planner.shapes import load_config_file

    path = _under(model, folder)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CommandReadError(f"model directory {model} has no config.json; pass the folder of a Hugging Face "
                                   f"model, or {HOW_INSTEAD}")
        try:
            return model, load_config_file(path)
        except PlanInputError as exc:
            raise CommandReadError(str(exc)) from None
    if model.startswith(("/", "./", "../", "~")) or path.is_file():
        raise CommandReadError(f"model directory {model} not found; check the path, or {HOW_INSTEAD}")
    return model, None


def _registry_type(model: str) -> str | None:
    from vramscope.planner import registry

    try:
        return model_type_of(registry.get_config(model))
    except PlanInputError:
        return None


def _assemble(argv: Sequence[str], script: str, reading: Reading, state: Any, reader: Reader,
              leftovers: list[Option], positionals: list[str], model_config: dict[str, Any] | None,
              config_file: str | None) -> ParsedCommand:
    spec = QLoraSpec(framework=reading.framework).with_(**reading.spec)
    unknown = [shown(o) for o in leftovers] + [p for p in positionals]
    read = dict(state.read)
    read.update(reader.read)
    for what, value in (("batch size", reading.batch_size), ("gradient accumulation", reading.grad_accum)):
        if value <= 0:
            raise CommandReadError(f"the command's {what} is {value}; it must be positive")
    return ParsedCommand(
        argv=tuple(argv),
        program=reading.program,  # type: ignore[arg-type]
        framework=reading.framework,
        script=script,
        model=reading.model,
        model_config=model_config,
        spec=spec,
        batch_size=reading.batch_size,
        seq_len=reading.seq_len,
        grad_accum=reading.grad_accum,
        max_steps=reading.max_steps,
        launch=state.freeze(),
        read=read,
        defaults=dict(reading.defaults),
        unknown=tuple(unknown),
        notes=tuple([*state.notes, *reading.notes]),
        batch_flag="micro_batch_size" if reading.program == "axolotl" else "--per_device_train_batch_size",
        seq_flag=reading.seq_flag,
        config_path=config_file,
    )
