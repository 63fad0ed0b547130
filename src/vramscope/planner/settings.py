"""A recommended change written in the keys of the program that runs the training.

:class:`~vramscope.planner.api.Recommendation` keeps its ``change`` in neutral keys (``batch_size``,
``grad_accum``, ``env``, ...); people need the line to paste: HF ``TrainingArguments`` and TRL ``SFTConfig``
fields, axolotl's YAML keys, a hand-written loop's code, or an ``export`` for the environment.
"""

from __future__ import annotations

from typing import Any

# Where a change goes, by style: the HF/TRL argument dataclass, axolotl's YAML, or a loop's own code.
STYLES = ("hf", "trl", "loop", "axolotl")

_CONFIG = {"hf": "TrainingArguments", "trl": "SFTConfig"}
# Neutral keys that are fields of TrainingArguments / SFTConfig under the same name.
_TRAINER_KEYS = ("learning_rate", "max_grad_norm", "bf16", "fp16")
_FRAMEWORK_LINES = {
    "trl": "trl.SFTTrainer(model, args=SFTConfig(...), peft_config=LoraConfig(...)) with the same quantization and "
           "LoRA settings",
    "hf": "transformers.Trainer with prepare_model_for_kbit_training",
}


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
    ``trl``, ``qlora``, ``hf``, ``axolotl``) under ``framework``: an axolotl user gets axolotl's YAML keys, a
    loop its code, TRL's script its ``SFTConfig`` fields, the rest HF's ``TrainingArguments``."""
    if program == "axolotl":
        return "axolotl"
    if framework.startswith("loop"):
        return "loop"
    return "trl" if framework == "trl" or program == "trl" else "hf"


# Changes a style has no setting for: axolotl builds its own trainer (no "switch to TRL's SFTTrainer") and
# its model and loop (no forward arguments to pass, no output to drop).
_NOT_OFFERED = {"axolotl": frozenset({"framework", "keep_output", "use_cache"})}


def offered(change: dict[str, Any], style: str | None) -> bool:
    """Whether a change can be said in ``style``'s own keys at all (a change that cannot is not advice there)."""
    return not (_NOT_OFFERED.get(style or "", frozenset()) & change.keys())


def written_as(change: dict[str, Any], style: str) -> str:
    """``change`` as the user writes it in ``style`` (one of :data:`STYLES`); ``;``-separated when several."""
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
            parts.append(_FRAMEWORK_LINES.get(str(value), f"use {value}"))
        elif key == "dtype":
            parts.append(f"--dtype {value}" if style == "trl" else f"from_pretrained(..., dtype={value!r})")
        elif key == "keep_output":
            parts.append(_loop_line("keep_output", value))
        elif key == "use_cache":
            parts.append(_loop_line("use_cache", value))
        elif key in _TRAINER_KEYS:
            trainer[key] = value
        # other keys (gpus, strategy, offload, model: a plan's cannot-fit alternatives) have no one setting
    if style == "axolotl":
        names = {"per_device_train_batch_size": "micro_batch_size", "optim": "optimizer", "max_length": "sequence_len"}
        parts += [f"{names.get(k, k)}: {_yaml(v)}" for k, v in trainer.items()]
        lora_names = {"r": "lora_r", "target_modules": "lora_target_modules"}
        parts += [f"{lora_names[k]}: {_yaml(v)}" for k, v in lora.items()]
    elif style == "loop":
        parts += [_loop_line(k, v) for k, v in trainer.items()]
        if lora:
            parts.append("LoraConfig(" + ", ".join(f"{k}={_py(v)}" for k, v in lora.items()) + ")")
    else:
        if "max_length" in trainer and style == "hf":
            # HF Trainer has no length field: the tokenizer's truncation decides
            parts.append(f"tokenizer(..., truncation=True, max_length={trainer.pop('max_length')})")
        if trainer:
            parts.append(f"{_CONFIG.get(style, 'TrainingArguments')}("
                         + ", ".join(f"{k}={_py(v)}" for k, v in trainer.items()) + ")")
        if lora:
            parts.append("LoraConfig(" + ", ".join(f"{k}={_py(v)}" for k, v in lora.items()) + ")")
    return "; ".join(parts)


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
