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
from vramscope.commands.common import model_name_facts, trainer_gaps
from vramscope.commands.dispatch import PROGRAMS, identify
from vramscope.commands.dispatch import Program as ProgramEntry
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_json, load_yaml, script_text
from vramscope.commands.launchers import ACCELERATE_BOOL, ACCELERATE_VALUED, Target, apply_accelerate, split_launcher
from vramscope.commands.programs import IGNORED, model_type_of
from vramscope.commands.reading import Context, Reading
from vramscope.commands.scripts import ScriptFacts, read_script
from vramscope.commands.types import (
    STRATEGIES,
    Alternative,
    DatasetRef,
    EvalSettings,
    Launch,
    MemorySettings,
    ParsedCommand,
    Strategy,
    TrainerSettings,
)
from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks.registry import framework_of_program
from vramscope.recipe import QLoraSpec

__all__ = ["ASSUMED_SHARDED_WORLD", "STRATEGIES", "CommandReadError", "Launch", "ParsedCommand", "Strategy",
           "parse_command"]

_SCRIPT_TEXT_LIMIT = 1 << 20
_SHARDED = ("fsdp", "zero3", "zero2")
ASSUMED_SHARDED_WORLD = 2


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
    facts = read_script(_script_text(target, folder))
    name, kind = identify(target, options, positionals, facts)
    program = PROGRAMS[name]
    options, positionals, config_options, config_file, cfg = _config(program, options, positionals, folder)
    reader = Reader([*config_options, *options])
    models: dict[str | None, str | None] = {}

    def model_type_of_name(model: str | None) -> str | None:
        if model not in models:
            models[model] = model_type_of(_model(model, folder)[1]) if model else None
            if model and models[model] is None:
                models[model] = _registry_type(model)
        return models[model]

    ctx = Context(reader, state, model_type_of_name, cfg, folder, target, facts, kind)
    if program.trainer_signs_needed and not _looks_like_hf(reader, facts):
        raise CommandReadError(
            f"cannot read the model and shapes from '{' '.join(argv[:4])}{' ...' if len(argv) > 4 else ''}': "
            f"it is not a command of a tool vramscope reads (TRL, an HfArgumentParser / HF Trainer script, axolotl, "
            f"LLaMA-Factory, ms-swift, Unsloth ...); {HOW_INSTEAD}")
    reading = program.read(ctx)
    model_name_facts(reading)
    trainer_gaps(reading)
    reader.ignore(IGNORED)
    leftovers = [o for o in reader.unused() if not o.written.endswith(("default)", "code)"))]
    if target.launch_flags_inline:
        # `trl sft` hands the flags its parser does not know to accelerate launch.
        launch_like = [o for o in leftovers if o.name in ACCELERATE_BOOL or o.name in ACCELERATE_VALUED]
        apply_accelerate(state, launch_like, env, folder)
        leftovers = [o for o in leftovers if o not in launch_like]
    model_config = _model(reading.model, folder)[1] if reading.model else None
    return _assemble(argv, target.name, reading, state, reader, leftovers, positionals, model_config, config_file,
                     program)


def _config(program: ProgramEntry, options: list[Option], positionals: list[str], folder: Path
            ) -> tuple[list[Option], list[str], list[Option], str | None, dict[str, Any]]:
    """The program's config file into options (below the command line's), by where the program keeps it
    (its entry's ``config`` fields)."""
    path: Path | None = None
    source = program.config
    what = f"{program.title} config"
    flag = next((o for o in options if o.name == "config"), None) if source in ("flag_or_positional", "flag") else None
    if flag is not None:
        if not flag.values:
            raise CommandReadError(f"--config needs a YAML file ({what})")
        if source == "flag_or_positional" or flag.values[0].endswith((".yaml", ".yml", ".json")):
            path = _under(flag.values[0], folder)
            options = [o for o in options if o is not flag]
    if path is None and source in ("flag_or_positional", "positional"):
        config_words = [p for p in positionals if p.endswith(program.config_suffixes)]
        if config_words:
            path = _under(config_words[0], folder)
            positionals = [p for p in positionals if p != config_words[0]]
        elif program.config_missing is not None:
            raise CommandReadError(f"{program.config_missing}; {HOW_INSTEAD}")
    if path is None:
        return options, positionals, [], None, {}
    cfg = load_json(path, what) if path.suffix == ".json" else load_yaml(path, what)
    cfg.pop("env", None)
    config_options = options_from_mapping(cfg, path.name)
    if program.config_overrides:  # key=value words after the config override it
        pairs = [p for p in positionals if "=" in p and not p.startswith("-")]
        config_options += [Option(k.replace("-", "_"), [v], k) for k, v in (p.split("=", 1) for p in pairs)]
        positionals = [p for p in positionals if p not in pairs]
    return options, positionals, config_options, str(path), cfg


def _looks_like_hf(reader: Reader, facts: ScriptFacts) -> bool:
    """A script whose flags or source say it is an HfArgumentParser / Trainer script."""
    markers = ("per_device_train_batch_size", "gradient_accumulation_steps", "model_name_or_path")
    parsers = {"HfArgumentParser", "TrlParser", "TrainingArguments"}
    return reader.has(*markers) or facts.parser is not None or bool(facts.trainers) or bool(
        parsers & facts.imported_names)


def _script_text(target: Target, folder: Path) -> str:
    if target.kind != "script" or "://" in target.name:
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
              config_file: str | None, program: ProgramEntry) -> ParsedCommand:
    framework = reading.framework or framework_of_program(reading.program).name
    spec = QLoraSpec(framework=framework).with_(**reading.spec)
    unknown = [shown(o) for o in leftovers] + [p for p in positionals]
    read = dict(state.read)
    read.update(reader.read)
    for what, value in (("batch size", reading.batch_size), ("gradient accumulation", reading.grad_accum)):
        if value <= 0:
            raise CommandReadError(f"the command's {what} is {value}; it must be positive")
    launch = state.freeze()
    assumed = [*state.assumed, *reading.assumed]
    alternatives = list(reading.alternatives)
    if launch.world_size is None and launch.strategy in _SHARDED:
        # Sharding over an unknown count: one GPU would be wrong, so plan the smallest sharded run and show 8.
        assumed.append(f"processes: every visible GPU ({launch.strategy}); planned for {ASSUMED_SHARDED_WORLD} "
                       f"(pass --gpus N before '--')")
        alternatives.append(Alternative("on 8 GPUs", world_size=8))
    elif launch.world_size is None:
        state.notes.append("every visible GPU holds the whole model (ddp): the per-GPU plan is the same for any "
                           "count")
    defaults = dict(reading.defaults)
    if launch.strategy == "fsdp" and state.fsdp_version is None:
        version, whose = state.fsdp_default
        if launch.offload:
            # Under parameter offload the two pin different host memory: the plan's host figure rests on it.
            assumed.append(f"FSDP{version}: the command does not say fsdp_version ({whose}); under parameter "
                           f"offload FSDP1 pins more host memory than FSDP2 (say fsdp_version in the command)")
        else:
            defaults["fsdp_version"] = f"{version} ({whose})"
    storage = reading.memory.get("quant_storage")
    if launch.strategy == "fsdp" and reading.spec.get("bits") == 4 and storage in (None, "uint8"):
        # FSDP flattens parameters of one dtype: uint8 4-bit weights beside bf16 ones do not shard.
        reading.unsupported.append("FSDP over 4-bit weights stored as uint8 (bnb_4bit_quant_storage unset): FSDP "
                                   "needs bfloat16 storage to shard them; planned as sharded")
    fields = {**reading.trainer}
    return ParsedCommand(
        argv=tuple(argv),
        program=reading.program,
        framework=framework,
        script=script,
        model=reading.model,
        model_config=model_config,
        spec=spec,
        batch_size=reading.batch_size,
        seq_len=reading.seq_len,
        grad_accum=reading.grad_accum,
        max_steps=reading.max_steps,
        launch=launch,
        read=read,
        defaults=defaults,
        unknown=tuple(unknown),
        notes=tuple([*state.notes, *reading.notes]),
        batch_flag=reading.batch_flag,
        seq_flag=reading.seq_flag,
        accum_flag=reading.accum_flag,
        flags_in_config=reading.flags_in_config,
        seq_parts=reading.seq_parts,
        eval_batch_follows_train=reading.eval_batch_follows_train,
        title=program.title_of(str(fields.get("kind", "sft"))),
        title_names_trainer=program.names_trainer,
        config_path=config_file,
        trainer=TrainerSettings(**fields),
        eval=EvalSettings(**reading.eval),
        dataset=DatasetRef(**_frozen(reading.dataset)),
        memory=MemorySettings(**_frozen(reading.memory)),
        assumed=tuple(assumed),
        unsupported=tuple(dict.fromkeys(reading.unsupported)),
        alternatives=tuple(alternatives),
    )


def _frozen(values: Mapping[str, Any]) -> dict[str, Any]:
    """A reader's mutable fields as a frozen dataclass takes them (lists as tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
