"""What a program reader hands back (:class:`Reading`) and what it is given (:class:`Context`).

Every reader in :data:`vramscope.commands.dispatch.PROGRAMS` is a function ``Context -> Reading``: one
signature, so adding a tool is one module and one line in that table. The framework a reading plans with is
the registry's for its program (``Framework.programs``) unless the reader says more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.commands.argv import Reader
from vramscope.commands.launchers import LaunchState, Target
from vramscope.commands.scripts import ScriptFacts
from vramscope.commands.types import Alternative

ModelTypeOf = Callable[[str | None], "str | None"]
"""The architecture (config.json ``model_type``) of the model the command names, when it can be known."""


@dataclass
class Reading:
    """What a program reader found; merged into a :class:`~.types.ParsedCommand` by the caller."""

    program: str
    model: str | None
    spec: dict[str, Any]
    batch_size: int
    seq_len: int | None
    grad_accum: int
    max_steps: int | None
    seq_flag: str | None
    batch_flag: str = "--per_device_train_batch_size"
    # None: the framework the registry names for the program (``Framework.programs``); a reader sets one only
    # where the command says more (Unsloth's checkpoints on the host, an HF script that builds TRL's trainer).
    framework: str | None = None
    # How to set the shapes in the program's own spelling (see ParsedCommand's attributes of these names).
    accum_flag: str = "--gradient_accumulation_steps"
    flags_in_config: bool = False
    seq_parts: tuple[str, ...] = ()
    eval_batch_follows_train: bool = False
    defaults: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    trainer: dict[str, Any] = field(default_factory=lambda: {"kind": "sft"})  # TrainerSettings' fields
    eval: dict[str, Any] = field(default_factory=dict)  # EvalSettings' fields
    dataset: dict[str, Any] = field(default_factory=dict)  # DatasetRef's fields
    memory: dict[str, Any] = field(default_factory=dict)  # MemorySettings' fields
    assumed: list[str] = field(default_factory=list)  # guesses of bits, rank, trainer, processes (see ParsedCommand)
    unsupported: list[str] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)


@dataclass
class Context:
    """What a program reader reads from.

    Attributes:
        reader: the options: the program's config file first, then the command line (later wins).
        state: the launcher's reading (processes, strategy), which the program's flags may change.
        model_type_of: the architecture of a model name (local config.json, else the registry).
        cfg: the program's config file as a mapping (axolotl / LLaMA-Factory YAML, TRL ``--config``), or {}.
        folder: the folder the command runs in.
        target: what the launcher runs (its kind, name and arguments).
        script: the static reading of the script's source (empty when there is no readable script).
        kind: the trainer the program's name says (``dpo`` for ``trl dpo`` or ``scripts/dpo.py``), if any.
    """

    reader: Reader
    state: LaunchState
    model_type_of: ModelTypeOf
    cfg: Mapping[str, Any]
    folder: Path
    target: Target
    script: ScriptFacts = field(default_factory=ScriptFacts)
    kind: str | None = None
