"""What a training command says about its run, as typed data (see :func:`vramscope.commands.parse_command`).

:class:`Launch` is how the command starts its processes (the launcher, the world size, the distributed
strategy); :class:`ParsedCommand` is the whole reading: the model, the recipe, the shapes, what was
read and what was not understood. Pure data: no torch, no file access.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vramscope.recipe import QLoraSpec

Strategy = Literal["ddp", "fsdp", "zero2", "zero3"]
"""How the processes share the model: ``ddp`` (every rank holds everything; also ZeRO stage 0 and 1, planned
as ddp because only the optimizer states would shrink: erring high), ``fsdp`` (FSDP, any sharding strategy),
``zero2`` / ``zero3`` (DeepSpeed ZeRO stage 2 / 3)."""

STRATEGIES: tuple[str, ...] = ("ddp", "fsdp", "zero2", "zero3")

Program = Literal["trl", "qlora", "hf", "axolotl"]
"""Which program's defaults were applied: TRL's ``sft`` script, the QLoRA reference ``qlora.py``, a generic
HF ``TrainingArguments`` script, or axolotl."""


@dataclass(frozen=True)
class Launch:
    """How the command starts its processes.

    Attributes:
        launcher: ``python`` (a script), ``python -m`` (a module), ``accelerate`` (``accelerate launch``),
            ``torchrun`` (also ``python -m torch.distributed.run``), ``deepspeed``, ``trl`` (``trl sft``, which
            runs ``accelerate launch`` itself) or ``axolotl`` (``axolotl train``).
        world_size: processes in all (per node x nodes); None when the launcher decides at start-up (every
            visible GPU: ``torchrun --nproc_per_node gpu``, ``accelerate launch`` without a process count).
        strategy: ``ddp``, ``fsdp``, ``zero2``, ``zero3`` (see :data:`Strategy`), or None for one process
            (or when nothing says; ``device_map="auto"`` model parallelism cannot be seen from argv).
        offload: FSDP ``offload_params`` or a ZeRO ``offload_optimizer`` / ``offload_param`` device other
            than ``none``: some state lives on the host.
        zero_stage: the DeepSpeed ZeRO stage as configured (0-3), when DeepSpeed is used.
        config_file: the launcher's or the program's distributed config that was read (accelerate
            ``--config_file`` YAML, DeepSpeed JSON), if any.
        nodes: machines (``--nnodes``, ``--num_machines``, ``--num_nodes``); 1 when unsaid.
    """

    launcher: str = "python"
    world_size: int | None = 1
    strategy: Strategy | None = None
    offload: bool = False
    zero_stage: int | None = None
    config_file: str | None = None
    nodes: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "offload": self.offload,
            "zero_stage": self.zero_stage,
            "config_file": self.config_file,
            "nodes": self.nodes,
        }


@dataclass(frozen=True)
class ParsedCommand:
    """What a training command would run, read from its argv (and the config files it names) without running it.

    Attributes:
        argv: the command as given.
        program: whose defaults apply (:data:`Program`).
        framework: the training framework for the memory model (``trl``, ``hf``; see ``vramscope.recipe``).
        script: the script path or module the command runs (``trl.scripts.sft``, ``qlora.py``,
            ``axolotl.cli.train``).
        model: the model as the command names it (a local directory, a hub id, a registry name), or None.
        model_config: the config.json fields when ``model`` is a local directory that holds one.
        spec: the recipe (quantization, LoRA, checkpointing, attention, optimizer, framework).
        batch_size: the per-device micro-batch.
        seq_len: the longest sequence a batch can hold (None when the command sets no limit).
        grad_accum: gradient accumulation steps.
        max_steps: optimizer steps (None: by epochs).
        launch: the launcher, world size and strategy (:class:`Launch`).
        read: what shaped the plan: ``flag -> value`` as the command (or its config file) says it; the
            program's defaults that were applied are in ``defaults``.
        defaults: ``field -> value`` of the program defaults used because the command did not say.
        unknown: flags (and config keys) not understood: listed, never an error.
        notes: what the reading assumed, in a sentence each.
        batch_flag: how to set the per-device batch in this command (``--per_device_train_batch_size``, or
            ``micro_batch_size`` for an axolotl YAML).
        seq_flag: how to set the sequence length in this command (``--max_length``, ``sequence_len``), or None.
        config_path: the program's own config file (axolotl YAML, TRL ``--config``), if any.
    """

    argv: tuple[str, ...]
    program: Program
    framework: str
    script: str
    model: str | None
    model_config: Mapping[str, Any] | None
    spec: QLoraSpec
    batch_size: int
    seq_len: int | None
    grad_accum: int
    max_steps: int | None
    launch: Launch
    read: Mapping[str, str] = field(default_factory=dict)
    defaults: Mapping[str, str] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    batch_flag: str = "--per_device_train_batch_size"
    seq_flag: str | None = None
    config_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The reading as JSON-ready data (``vramscope plan --json``'s ``command`` object)."""
        return {
            "argv": list(self.argv),
            "program": self.program,
            "framework": self.framework,
            "script": self.script,
            "model": self.model,
            "model_from": "directory" if self.model_config is not None else ("name" if self.model else None),
            "spec": self.spec.to_dict(),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "grad_accum": self.grad_accum,
            "max_steps": self.max_steps,
            "launch": self.launch.to_dict(),
            "read": dict(self.read),
            "defaults": dict(self.defaults),
            "unknown": list(self.unknown),
            "notes": list(self.notes),
            "batch_flag": self.batch_flag,
            "seq_flag": self.seq_flag,
            "config_path": self.config_path,
        }
