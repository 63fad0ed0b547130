"""Which program a command runs, and the ONE table of program readers.

:func:`identify` names the program from what the launcher runs (``trl dpo``, ``llamafactory-cli train``,
``swift sft``, a module, a script's path, its flags, its source); :data:`PROGRAMS` maps that name to its
reader (a function ``Context -> Reading``), to where its config file comes from and how its command's words
change it, and to whether a command of it must look like an HF Trainer's. Adding a tool is one
reader module, one line here (and how it is recognised, below) and its name in the ``programs`` of the framework
its commands plan with (``planner/frameworks/``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from vramscope.commands.argv import Option
from vramscope.commands.axolotl import read_axolotl
from vramscope.commands.cookbook import read_cookbook
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.fastchat import read_fastchat
from vramscope.commands.fsdp_qlora import read_fsdp_qlora
from vramscope.commands.hfscript import read_hf
from vramscope.commands.launchers import Target
from vramscope.commands.llamafactory import read_llamafactory
from vramscope.commands.programs import read_qlora
from vramscope.commands.reading import Context, Reading
from vramscope.commands.scripts import ScriptFacts
from vramscope.commands.swift import SWIFT_SUBCOMMANDS, read_swift
from vramscope.commands.trl import TRL_KINDS, kind_of_name, read_trl
from vramscope.commands.unsloth import read_unsloth

ConfigSource = Literal["none", "flag_or_positional", "positional", "flag"]
"""Where a program's config file is: ``none``, ``flag_or_positional`` (``--config x.yaml`` or a positional one,
TrlParser's way), ``positional`` (the first positional with one of the program's ``config_suffixes``: axolotl,
LLaMA-Factory), ``flag`` (``--config`` for any script)."""
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Program:
    """A program vramscope reads: its reader, its title in the plan, and where its config file comes from.

    ``names_trainer``: the plan's title names the trainer too (``TRL dpo``). A positional config is the first
    positional word ending in one of ``config_suffixes``; ``config_missing`` is the one-line error (before how
    to plan instead) for a command that names none, where the program cannot run without one (None: a config
    is optional); ``config_overrides``: ``key=value`` words after the config override its keys (LLaMA-Factory's
    CLI). ``trainer_signs_needed``: the program is the fallback for any script, so a command of it is read only
    where its flags or source show an HfArgumentParser / HF Trainer script. The framework a reading plans
    with is not here: it is ``Framework.programs``'s in ``planner/frameworks/`` (a reader overrides it only
    where the command says more).
    """

    read: Callable[[Context], Reading]
    title: str
    config: ConfigSource = "none"
    names_trainer: bool = False
    config_suffixes: tuple[str, ...] = YAML_SUFFIXES
    config_missing: str | None = None
    config_overrides: bool = False
    trainer_signs_needed: bool = False

    def title_of(self, kind: str) -> str:
        """The title of a reading of this program whose trainer is ``kind``."""
        return f"{self.title} {kind}" if self.names_trainer else self.title


PROGRAMS: dict[str, Program] = {
    "trl": Program(read_trl, "TRL", "flag_or_positional", names_trainer=True),
    "qlora": Program(read_qlora, "qlora.py"),
    "hf": Program(read_hf, "HF Trainer script", "flag", trainer_signs_needed=True),
    "axolotl": Program(read_axolotl, "axolotl", "positional",
                       config_missing="axolotl train needs its config file (axolotl train config.yml)"),
    "llamafactory": Program(read_llamafactory, "LLaMA-Factory", "positional", config_suffixes=(*YAML_SUFFIXES, ".json"),
                            config_missing="llamafactory-cli train needs its config file (llamafactory-cli train "
                                           "examples/train_lora/x.yaml)", config_overrides=True),
    "swift": Program(read_swift, "ms-swift", "flag"),
    "unsloth": Program(read_unsloth, "Unsloth"),
    "fsdp_qlora": Program(read_fsdp_qlora, "Answer.AI fsdp_qlora"),
    "cookbook": Program(read_cookbook, "llama-cookbook"),
    "fastchat": Program(read_fastchat, "FastChat"),
}

# Modules run with ``python -m`` (or ``accelerate launch -m``) and the program each is.
MODULES: dict[str, str] = {
    "axolotl.cli.train": "axolotl", "llamafactory.cli": "llamafactory", "llamafactory.launcher": "llamafactory",
    "llamafactory.train.tuner": "llamafactory", "swift.cli.sft": "swift", "swift.cli.rlhf": "swift",
    "swift.cli.pt": "swift", "llama_cookbook.finetuning": "cookbook", "llama_recipes.finetuning": "cookbook",
    "recipes.quickstart.finetuning.finetuning": "cookbook", "fastchat.train.train_lora": "fastchat",
}
# Script paths (their ending) and the program each is; TRL's are recognised by _trl_script.
SCRIPTS: dict[str, str] = {
    "qlora.py": "qlora", "unsloth-cli.py": "unsloth", "fastchat/train/train_lora.py": "fastchat",
    "train_lora.py": "fastchat", "finetuning.py": "cookbook", "swift/cli/sft.py": "swift",
    "swift/cli/rlhf.py": "swift", "swift/cli/pt.py": "swift", "src/train.py": "llamafactory",
}


def identify(target: Target, options: list[Option], positionals: list[str], facts: ScriptFacts
             ) -> tuple[str, str | None]:
    """``(program, trainer kind or None)`` for what the launcher runs.

    Raises:
        CommandReadError: ``trl <sub>`` or a ``trl.``/``axolotl.`` module vramscope does not read.
    """
    names = {o.name for o in options}
    if target.kind == "trl":
        kind = kind_of_name(target.name)
        if target.name not in TRL_KINDS or kind is None:
            raise CommandReadError(f"vramscope reads 'trl sft|dpo|grpo|kto|reward', not 'trl {target.name}'; "
                                   f"{HOW_INSTEAD}")
        return "trl", kind
    if target.kind in ("axolotl", "llamafactory"):
        return target.kind, None
    if target.kind == "swift":
        return "swift", SWIFT_SUBCOMMANDS.get(target.name)
    if target.kind == "module":
        if target.name.startswith("trl.scripts."):
            kind = kind_of_name(target.name.rsplit(".", 1)[-1])
            if kind is None:
                raise CommandReadError(f"vramscope reads TRL's sft, dpo, grpo, kto and reward scripts, not "
                                       f"{target.name}; {HOW_INSTEAD}")
            return "trl", kind
        if target.name in MODULES:
            return MODULES[target.name], None
        if target.name.startswith(("trl.", "axolotl.")):
            raise CommandReadError(f"vramscope reads trl.scripts.* and axolotl.cli.train, not {target.name}; "
                                   f"{HOW_INSTEAD}")
        return _by_contents(names, facts), None
    path = target.name.replace("\\", "/")
    for ending, program in SCRIPTS.items():
        if path == ending or path.endswith("/" + ending):
            if program == "llamafactory" and not any(p.endswith((".yaml", ".yml", ".json")) for p in positionals):
                break  # a src/train.py that is not LLaMA-Factory's
            if program == "cookbook" and not names & {"use_peft", "peft_method", "enable_fsdp", "quantization",
                                                       "batch_size_training"}:
                break
            return program, None
    trl_kind = _trl_script(path, facts)
    if trl_kind is not None:
        return "trl", trl_kind
    if "train_type" in names and names & {"context_length", "model_name", "use_cpu_offload"}:
        return "fsdp_qlora", None  # Answer.AI's train.py: fastcore flags of its own
    return _by_contents(names, facts), None


def _trl_script(path: str, facts: ScriptFacts) -> str | None:
    """A TRL-shaped script: TRL's own (``trl/scripts/x.py``, ``examples/scripts/x.py``), the handbook's
    ``scripts/x.py``, a URL to one of those, or any script parsing with TrlParser into TRL's ModelConfig."""
    base = os.path.basename(path)
    kind = kind_of_name(base)
    if kind is not None and ("trl/" in path or "scripts/" in path or "://" in path):
        return kind
    trl_parser = facts.parser == "trl" or {"TrlParser", "ModelConfig"} <= facts.imported_names
    if trl_parser or ("ModelConfig" in facts.parser_classes and facts.builds_trl):
        return facts.trainer_kind or kind or "sft"
    return None


def _by_contents(names: set[str], facts: ScriptFacts) -> str:
    if facts.uses_unsloth:
        return "unsloth"
    return "hf"
