"""``vramscope plan ... -- <training command>`` and ``vramscope tune ... -- <training command>``: the CLI side.

:func:`add_command_argument` gives a subcommand the trailing ``-- COMMAND`` and remembers which of its own
flags were given explicitly (they override what the command says); :func:`read_command` parses the command
(:func:`vramscope.commands.parse_command`) and merges those overrides; :func:`format_command`
prints what was read. The plan and tune modules call these and stay thin.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from vramscope.cli.common import UsageError
from vramscope.commands import ASSUMED_SHARDED_WORLD, ParsedCommand, parse_command
from vramscope.planner.document import Alternative
from vramscope.planner.errors import PlanInputError
from vramscope.recipe import QLoraSpec

_EXPLICIT = "_vramscope_explicit"
SPEC_FIELDS = tuple(f.name for f in fields(QLoraSpec))


def add_command_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """The trailing ``-- COMMAND ...``; call it after every other flag of ``parser`` is added."""
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help=f"a training command to {what} (TRL, an HF Trainer script, axolotl), after '--'")
    parser.set_defaults(_command_prog=parser.prog)  # "vramscope tune": its errors show its own example
    for action in parser._actions:  # argparse keeps no record of which flags were given; the actions do
        if action.option_strings:
            action.__class__ = _tracking(type(action))


_TRACKING: dict[type[argparse.Action], type[argparse.Action]] = {}


def _tracking(cls: type[argparse.Action]) -> type[argparse.Action]:
    """A subclass of ``cls`` that notes its ``dest`` in the namespace when the flag is given."""
    if getattr(cls, "_vramscope_tracks", False):
        return cls
    if cls in _TRACKING:
        return _TRACKING[cls]

    def __call__(self: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        seen = set(getattr(namespace, _EXPLICIT, ()))
        seen.add(self.dest)
        setattr(namespace, _EXPLICIT, seen)
        cls.__call__(self, parser, namespace, values, option_string)

    tracked = type(cls.__name__, (cls,), {"__call__": __call__, "_vramscope_tracks": True})
    _TRACKING[cls] = tracked
    return tracked


def explicit(args: argparse.Namespace) -> set[str]:
    """The ``dest`` of every flag given on the command line (not left at its default)."""
    return set(getattr(args, _EXPLICIT, ()))


def command_argv(args: argparse.Namespace) -> list[str] | None:
    """The training command after ``--``, or None when there is none."""
    words = list(getattr(args, "command", None) or [])
    if not words:
        return None
    if words[0] != "--":
        prog = getattr(args, "_command_prog", "vramscope plan")
        raise UsageError(f"unexpected {words[0]!r}; put a training command after '--', "
                         f"e.g. {prog} -- trl sft --model_name_or_path ...")
    words = words[1:]
    if not words:
        raise UsageError("nothing after '--'; give the training command, e.g. -- python qlora.py ...")
    return words


@dataclass(frozen=True)
class CommandInputs:
    """The parsed command with vramscope's explicit flags applied on top."""

    parsed: ParsedCommand
    spec: QLoraSpec
    overrides: tuple[str, ...]  # "--seq-len 2048": the vramscope flags that replaced the command's values

    def to_dict(self) -> dict[str, Any]:
        out = self.parsed.to_dict()
        out["spec"] = self.spec.to_dict()
        out["overridden_by_flags"] = list(self.overrides)
        return out


def read_command(args: argparse.Namespace, argv: Sequence[str]) -> CommandInputs:
    """Parse ``argv`` and apply the explicit recipe flags of ``args`` over it (a one-line UsageError otherwise)."""
    try:
        parsed = parse_command(argv)
    except PlanInputError as exc:
        raise UsageError(str(exc)) from None
    given = explicit(args)
    spec = parsed.spec
    overrides: list[str] = []
    for name in SPEC_FIELDS:
        if name in given and hasattr(args, name) and getattr(args, name) != getattr(spec, name):
            spec = spec.with_(**{name: getattr(args, name)})
            overrides.append(f"{_flag(name)} {_shown(getattr(args, name))}")
    return CommandInputs(parsed=parsed, spec=spec, overrides=tuple(overrides))


def apply_to_plan_args(args: argparse.Namespace, inputs: CommandInputs) -> CommandInputs:
    """Fill ``plan``'s model, batch and length from the command where the flags did not give them.

    Returns the inputs with those flags added to ``overrides``.
    """
    parsed = inputs.parsed
    given = explicit(args)
    extra: list[str] = []
    if getattr(args, "model", None) is None and getattr(args, "config", None) is None:
        if parsed.model is None:
            raise UsageError("the command names no model (--model_name_or_path, base_model: ...); add it to the "
                             "command, or pass --model NAME or --config PATH before '--'")
        if parsed.model_config is not None:
            args.config = parsed.model
        else:
            args.model = parsed.model
    else:
        extra.append("--model" if args.model is not None else "--config")
    if args.batch_size is None:
        args.batch_size = parsed.batch_size
    else:
        extra.append(f"--batch-size {args.batch_size}")
    if args.seq_len is None:
        if parsed.seq_len is None:
            raise UsageError("the command sets no maximum sequence length; pass --seq-len S before '--'")
        args.seq_len = parsed.seq_len
    else:
        extra.append(f"--seq-len {args.seq_len}")
    if "framework" not in given and hasattr(args, "framework"):
        args.framework = inputs.spec.framework
    launch = parsed.launch
    world = launch.world_size
    if world is None and launch.strategy in SHARDED:
        world = ASSUMED_SHARDED_WORLD  # said in parsed.assumed: sharding over "every visible GPU"
    if hasattr(args, "gpus") and "gpus" not in given and world is not None and world > 1:
        # Several processes: the per-GPU plan under the command's strategy (`plan --gpus N --strategy S`).
        args.gpus = world
        if launch.strategy is not None and "strategy" not in given:
            args.strategy = launch.strategy
            if launch.offload and "offload" not in given:
                args.offload = "params" if launch.strategy == "fsdp" else "optimizer"
    if launch.fsdp_version is not None and "fsdp_version" not in given:
        args.fsdp_version = launch.fsdp_version  # what FSDP's parameter offload pins on the host depends on it
    elif "fsdp_version" in given and args.fsdp_version != launch.fsdp_version:
        extra.append(f"--fsdp-version {args.fsdp_version}")
    return replace(inputs, overrides=(*extra, *inputs.overrides))


SHARDED = ("fsdp", "zero2", "zero3")


def first_lines(inputs: CommandInputs) -> list[str]:
    """What the plan must say before anything else: each guess it made and each setting it does not model."""
    p = inputs.parsed
    given = " ".join(inputs.overrides)
    assumed = [a for a in p.assumed if not _overridden(a, given)]
    lines = []
    if assumed:
        lines.append("ASSUMED: " + "; ".join(assumed))
    if p.unsupported:
        lines.append("NOT MODELLED: " + "; ".join(p.unsupported))
    return lines


def _overridden(assumption: str, given: str) -> bool:
    """A guess that a vramscope flag replaced (``--bits 4`` answers the 16-bit guess) is no longer one."""
    return ("bit" in assumption and "--bits" in given) or ("rank" in assumption and "--lora-r" in given) or (
        "processes" in assumption and "--gpus" in given) or ("length" in assumption and "--seq-len" in given) or (
        "fsdp_version" in assumption and "--fsdp-version" in given)


def json_fields(inputs: CommandInputs) -> dict[str, Any]:
    """``plan --json``'s top-level ``assumed`` and ``unsupported`` (a short string each)."""
    given = " ".join(inputs.overrides)
    return {"assumed": [a for a in inputs.parsed.assumed if not _overridden(a, given)],
            "unsupported": list(inputs.parsed.unsupported)}


def alternative_plans(inputs: CommandInputs, args: argparse.Namespace, model: Any, plan_one: Any,
                      plan_many: Any) -> list[tuple[str, Any, int | None]]:
    """The other readings worth showing beside the plan: ``(label, plan or per-GPU bytes, world size)`` each.

    ``plan_one(spec, seq_len)`` plans one GPU with a recipe (and a length; None: the command's);
    ``plan_many(spec, gpus)`` returns the worst GPU's bytes under the command's strategy. Guesses that a
    vramscope flag answered are left out.
    """
    given = explicit(args)
    out: list[tuple[str, Any, int | None]] = []
    for alt in inputs.parsed.alternatives:
        if alt.world_size is not None:
            if "gpus" in given:
                continue
            out.append((alt.label, plan_many(inputs.spec, alt.world_size), alt.world_size))
            continue
        if any(name in given for name in alt.spec) or (alt.seq_len is not None and "seq_len" in given):
            continue
        out.append((alt.label, plan_one(inputs.spec.with_(**alt.spec), alt.seq_len), None))
    return out


def _flag(name: str) -> str:
    return {"attn": "--attn", "double_quant": "--no-double-quant"}.get(name, "--" + name.replace("_", "-"))


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    if value is None:
        return "all-linear"
    return str(value).lower() if isinstance(value, bool) else str(value)


def format_command(inputs: CommandInputs) -> str:
    """The short "read from the command" block that precedes the plan."""
    p = inputs.parsed
    launch = p.launch
    world = "every visible GPU" if launch.world_size is None else f"{launch.world_size} process" + (
        "es" if launch.world_size != 1 else "")
    strategy = f", {launch.strategy}" + (" with offload" if launch.offload else "") if launch.strategy else ""
    strategy += f" (FSDP{launch.fsdp_version})" if launch.fsdp_version is not None else ""
    lines = [
        *first_lines(inputs),
        f"read from the command ({p.title}; framework {inputs.spec.framework}"
        f"{'' if p.title_names_trainer else '; trainer ' + p.trainer.kind}):",
        f"  model {p.model or '(none)'}, batch {p.batch_size} per device x {p.grad_accum} accumulation, "
        f"{p.seq_len if p.seq_len is not None else 'no'} max tokens; {launch.launcher}, {world}{strategy}",
    ]
    if p.read:
        lines.append("  read: " + ", ".join(_read_item(k, v) for k, v in p.read.items()))
    if p.defaults:
        lines.append(f"  {p.title} defaults: " + ", ".join(f"{k} {v}" for k, v in p.defaults.items()))
    if inputs.overrides:
        lines.append("  overridden by vramscope flags: " + ", ".join(inputs.overrides))
    if p.unknown:
        lines.append("  not understood (ignored): " + " ".join(p.unknown))
    lines += [f"  note: {n}" for n in p.notes]
    return "\n".join(lines)


def _read_item(key: str, value: str) -> str:
    if key.endswith(")"):  # "lora_r (sft.yaml)": a config file's key
        return f"{key}: {value}"
    return key if value == "true" and key.startswith("-") else f"{key} {value}"


def _needs(result: Any, capacity: int | None) -> tuple[int, bool | None]:
    """What must fit on one GPU (the planner's device bytes) and whether it does."""
    if isinstance(result, int):
        return result, None if capacity is None else result <= capacity
    return int(result.process_bytes), result.fits


def format_alternatives(alternatives: list[tuple[str, Any, int | None]], capacity: int | None) -> str:
    """``also, if the script loads the model in 4-bit: needs 9.80 GiB on the GPU (fits in 24.00 GiB)``."""
    from vramscope.units import gib

    lines = []
    for label, result, world in alternatives:
        need, fits = _needs(result, capacity)
        where = f" per GPU of {world}" if world else " on the GPU"
        verdict = "" if fits is None or capacity is None else (
            f" ({'fits' if fits else 'does NOT fit'} in {gib(capacity)})")
        lines.append(f"also, {label}: needs {gib(need)}{where}{verdict}")
    return "\n".join(lines)


def alternatives_of(alternatives: list[tuple[str, Any, int | None]], capacity: int | None) -> tuple[Alternative, ...]:
    """``plan --json``'s ``alternatives``: each other reading's label, process count, bytes and verdict (the plan
    document's own type, which writes them)."""
    out = []
    for label, result, world in alternatives:
        need, fits = _needs(result, capacity)
        out.append(Alternative(label, world, need, fits))
    return tuple(out)


def apply_dataset(args: argparse.Namespace, inputs: CommandInputs) -> str | None:
    """``plan --dataset`` from the local data the command names, where the flags did not give one.

    Returns the path taken (None when the command names no local data, or ``--dataset`` was given). The
    dataset's own reading says in one line when it cannot read it, and the plan falls back to batch x max_length.
    """
    if getattr(args, "dataset", None) or not hasattr(args, "dataset"):
        return None
    parsed = inputs.parsed
    found = next((p for p in (*parsed.dataset.paths, *parsed.dataset.data_files) if os.path.exists(p)), None)
    if found is None:
        # A hub id (owner/name) is read from the local HF cache when it is there; when it is not, the plan says so
        # in its one fallback line rather than nothing (nothing is downloaded either way).
        found = next((n for n in parsed.dataset.names if _hub_id(n)), None)
    if found is None:
        return None
    args.dataset = found
    if getattr(args, "dataset_field", None) is None and parsed.dataset.text_field:
        args.dataset_field = parsed.dataset.text_field
    if parsed.memory.packing and hasattr(args, "packing"):
        args.packing = True
    ref = parsed.dataset
    if getattr(args, "dataset_split", None) is None and ref.split:
        args.dataset_split = ref.split
    if ref.source_max_len is not None and ref.target_max_len is not None:  # qlora.py: its collator's two cuts
        args.dataset_qlora = (ref.qlora_format, ref.source_max_len, ref.target_max_len)
    if parsed.memory.padding_free and hasattr(args, "padding_free"):
        args.padding_free = True
    if parsed.memory.group_by_length and hasattr(args, "group_by_length"):
        args.group_by_length = True
    if parsed.memory.pad_to_multiple_of:
        args.dataset_pad_to_multiple_of = parsed.memory.pad_to_multiple_of
    # The dataset is tokenized the way the command's trainer does (pairs, prompts): cli/plan.py reads the trainer
    # from the command itself, so that no phase flag is set that the user did not give.
    return found


def _hub_id(name: str) -> bool:
    """``trl-lib/Capybara``: an owner/name that is not a local path (LLaMA-Factory's registered names are not)."""
    owner, _, rest = name.partition("/")
    return bool(owner and rest) and "/" not in rest and not name.startswith((".", "~")) and not os.path.exists(name)
