"""A recommended change written in the keys of the program that runs the training.

:class:`~vramscope.planner.api.Recommendation` keeps its ``change`` in neutral keys (``batch_size``,
``grad_accum``, ``env``, ...); people need the line to paste: HF ``TrainingArguments`` and TRL ``SFTConfig``
fields, axolotl's YAML keys, a hand-written loop's code, or an ``export`` for the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramscope.planner.frameworks.record import Style
from vramscope.planner.frameworks.registry import (
    FRAMEWORK_TABLE,
    STYLES,
    framework_named,
    style_named,
    style_of_program,
)
from vramscope.trainers import DEFAULT_TRAINER, TRAINERS

__all__ = ["EXPANDABLE_SEGMENTS", "STYLES", "offered", "style_of", "written_as"]

# The allocator setting that lets segments grow in place instead of keeping split blocks, as a change in neutral
# keys: the planner's recommendation, the OOM advice and the log advice all give it.
EXPANDABLE_SEGMENTS: Mapping[str, Any] = {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}

# Neutral keys that are fields of TrainingArguments / SFTConfig under the same name.
_TRAINER_KEYS = ("learning_rate", "max_grad_norm", "bf16", "fp16")


def _py(value: Any) -> str:
    return repr(list(value)) if isinstance(value, (list, tuple)) else repr(value)


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def style_of(program: str | None, framework: str) -> str:
    """Whose keys a plan's advice is written in, for a command read by :mod:`vramscope.commands` (its ``program``:
    ``trl``, ``qlora``, ``hf``, ``axolotl``) under ``framework``: the style that claims the program
    (``Style.programs``: an axolotl user gets axolotl's YAML keys, TRL's script its ``SFTConfig`` fields), else the
    framework's own (a loop its code, the rest HF's ``TrainingArguments``)."""
    claimed = style_of_program(program)
    if claimed is not None:
        return claimed.name
    return framework_named(framework).style


def offered(change: dict[str, Any], style: str | None) -> bool:
    """Whether a change can be said in ``style``'s own keys at all (a change that cannot is not advice there):
    axolotl builds its own trainer (no "switch to TRL's SFTTrainer"), model and loop (no forward arguments to
    pass, no output to drop)."""
    return style is None or not (style_named(style).not_offered & change.keys())


def written_as(change: dict[str, Any], style: str, run_trainer: str = DEFAULT_TRAINER) -> str:
    """``change`` as the user writes it in ``style`` (one of :data:`STYLES`) for a ``run_trainer`` run (a DPO run's
    fields go in ``DPOConfig``, not ``SFTConfig``); ``;``-separated when several."""
    how = style_named(style)
    # TRL's trainers other than SFT take their own config class (``Trainer.config``), with the same field names
    # (TrainingArguments')
    row = TRAINERS.get(run_trainer)
    own = row.config if row is not None else None
    config = (own or how.config) if how.config == "SFTConfig" else how.config
    parts: list[str] = []
    trainer: dict[str, Any] = {}
    lora: dict[str, Any] = {}
    for key, value in change.items():
        if key == "env":
            parts += [f"export {name}={val}" for name, val in dict(value).items()]
        elif key == "batch_size":
            trainer["per_device_train_batch_size"] = value
        elif key == "grad_accum":
            trainer["gradient_accumulation_steps"] = value
        elif key in ("gradient_checkpointing", "optim"):
            trainer[key] = value
        elif key == "seq_len":
            trainer["max_length"] = value
        elif key == "lora_r":
            lora["r"] = value
        elif key == "lora_targets":
            lora["target_modules"] = list(value)
        elif key == "framework":
            target = FRAMEWORK_TABLE.get(str(value))
            parts.append(target.switch_line if target is not None and target.switch_line else f"use {value}")
        elif key == "dtype":
            if how.form == "flags" and value == "bfloat16":
                parts.append("--bf16 True")  # HfArgumentParser's bf16: the script loads and computes in it
            else:
                parts.append(f"--dtype {value}" if how.dtype_flag else f"from_pretrained(..., dtype={value!r})")
        elif key == "keep_output":
            parts.append(_loop_line("keep_output", value))
        elif key == "use_cache":
            parts.append(_loop_line("use_cache", value))
        elif key in _TRAINER_KEYS:
            trainer[key] = value
        # other keys (gpus, strategy, offload, model: a plan's cannot-fit alternatives) have no one setting
    if how.form == "yaml":
        names = dict(how.renamed)
        parts += [f"{names.get(k, k)}: {_yaml(v)}" for k, v in (*trainer.items(), *lora.items())]
    elif how.form == "flags":
        parts += _flags(how, trainer, lora)
    elif how.form == "code":
        parts += [_loop_line(k, v) for k, v in trainer.items()]
        if lora:
            parts.append("LoraConfig(" + ", ".join(f"{k}={_py(v)}" for k, v in lora.items()) + ")")
    else:
        if "max_length" in trainer and not how.length_field:
            # HF Trainer has no length field: the tokenizer's truncation decides
            parts.append(f"tokenizer(..., truncation=True, max_length={trainer.pop('max_length')})")
        if trainer:
            parts.append(f"{config}(" + ", ".join(f"{k}={_py(v)}" for k, v in trainer.items()) + ")")
        if lora:
            parts.append("LoraConfig(" + ", ".join(f"{k}={_py(v)}" for k, v in lora.items()) + ")")
    return "; ".join(parts)


def _flags(how: Style, trainer: dict[str, Any], lora: dict[str, Any]) -> list[str]:
    """A script's flags for the trainer's and LoRA's keys (HfArgumentParser: ``--key value``, booleans as True or
    False); a length over two flags is said as their sum, a key without a flag as the config the script builds."""
    names = dict(how.renamed)
    flags: list[str] = []
    out: list[str] = []
    for key, value in (*trainer.items(), *lora.items()):
        if key == "max_length" and how.split_length:
            out.append(f"{' + '.join(how.split_length)} = {value} (the input's and the output's cut)")
        elif key in how.no_flag:
            out.append(f"LoraConfig({key}={_py(value)}) where the script builds it (no flag for it)")
        else:
            flags.append(f"--{names.get(key, key)} {value}")
    return ([" ".join(flags)] if flags else []) + out


def _loop_line(key: str, value: Any) -> str:
    if key == "per_device_train_batch_size":
        return f"batch {value} rows per forward"
    if key == "gradient_accumulation_steps":
        return f"call opt.step() every {value} backward passes (loss / {value})"
    if key == "gradient_checkpointing":
        return ("model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})"
                if value else "model.gradient_checkpointing_disable()")
    if key == "optim":
        classes = {"paged_adamw_8bit": "bnb.optim.PagedAdamW8bit", "paged_adamw_32bit": "bnb.optim.PagedAdamW32bit",
                   "adamw_8bit": "bnb.optim.AdamW8bit", "adamw_torch": "torch.optim.AdamW"}
        return f"{classes.get(str(value), str(value))}(params, lr=...)"
    if key == "max_length":
        return f"truncate each row to {value} tokens"
    if key == "keep_output":
        return "loss = model(input_ids=x, labels=x).loss  (do not keep `out` through backward)"
    if key == "use_cache":
        return "model(input_ids=x, labels=x, use_cache=False)"
    return f"{key} = {value!r}"
