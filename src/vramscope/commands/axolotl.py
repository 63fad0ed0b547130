"""axolotl's ``config.yml`` (``axolotl train config.yml``, ``accelerate launch -m axolotl.cli.train config.yml``).

Key names and defaults are axolotl's pydantic schema (``utils/schemas/``): ``micro_batch_size`` 1,
``gradient_accumulation_steps`` 1, ``sequence_len`` 512, ``gradient_checkpointing`` false, ``optimizer``
``adamw_torch_fused``, ``lora_dropout`` 0.0, ``bf16`` ``auto``. A QLoRA model is loaded with NF4 and double
quantization fixed in its loader, then passed through peft's ``prepare_model_for_kbit_training`` before the HF
``Trainer`` subclass runs it: the ``hf`` framework. ``--key value`` after the config file override it, as
axolotl's CLI does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramscope.commands.argv import Reader, to_bool
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_json_or_text
from vramscope.commands.launchers import LaunchState
from vramscope.commands.programs import ModelTypeOf, Reading, attention, default_targets, optimizer

# Keys that do not change a step's memory.
IGNORED = frozenset("""
datasets test_datasets dataset_prepared_path val_set_size output_dir wandb_project wandb_entity wandb_watch wandb_name
wandb_log_model wandb_mode num_epochs learning_rate lr_scheduler warmup_steps warmup_ratio evals_per_epoch eval_steps
saves_per_epoch save_steps logging_steps seed special_tokens tokenizer_type model_type strict chat_template
train_on_inputs group_by_length tf32 early_stopping_patience resume_from_checkpoint local_rank weight_decay debug
pad_to_sequence_len eval_sample_packing hub_model_id is_llama_derived_model is_mistral_derived_model
is_qwen_derived_model trust_remote_code tokenizer_config base_model_config max_grad_norm lora_fan_in_fan_out
save_total_limit eval_table_size eval_max_new_tokens auto_resume_from_checkpoints shuffle_merged_datasets
dataset_processes plugins liger_rope liger_rms_norm liger_glu_activation liger_layer_norm
liger_fused_linear_cross_entropy lora_modules_to_save loss_watchdog_threshold loss_watchdog_patience
save_safetensors save_strategy eval_strategy max_steps use_tensorboard push_dataset_to_hub hf_use_auth_token
dataloader_num_workers dataloader_pin_memory dataloader_prefetch_factor gptq peft_use_dora peft_use_rslora
""".split())  # noqa: SIM905 (a word list reads best as words)


def config_path(positionals: list[str], cwd: Path) -> Path:
    for word in positionals:
        if word.endswith((".yml", ".yaml")):
            p = Path(word).expanduser()
            return p if p.is_absolute() else cwd / p
    raise CommandReadError(f"axolotl train needs its config file (axolotl train config.yml); {HOW_INSTEAD}")


def read_axolotl(reader: Reader, state: LaunchState, model_type_of_name: ModelTypeOf, cfg: Mapping[str, Any],
                 cwd: Path) -> Reading:
    model = reader.text("base_model")
    if model is None:
        raise CommandReadError(f"the axolotl config has no base_model; add it, or {HOW_INSTEAD}")
    out = Reading("axolotl", "hf", model, {}, 1, 512, 1, None, "sequence_len")
    out.notes.append("axolotl prepares the model with peft's prepare_model_for_kbit_training and trains it with "
                     "an HF Trainer: planned as the hf framework")
    adapter = reader.text("adapter")
    if adapter is None or adapter.lower() in ("none", "null", ""):
        raise CommandReadError(f"the axolotl config has no adapter (a full fine-tune); vramscope plans LoRA and "
                               f"QLoRA runs: set adapter: qlora or lora, or {HOW_INSTEAD}")
    if adapter not in ("lora", "qlora"):
        raise CommandReadError(f"axolotl adapter {adapter!r} is not planned (lora and qlora are); {HOW_INSTEAD}")
    four, eight = reader.boolean("load_in_4bit"), reader.boolean("load_in_8bit")
    out.spec["bits"] = 4 if four else 8 if eight else 16
    if adapter == "qlora" and not four:
        out.notes.append("adapter: qlora without load_in_4bit: axolotl asks for load_in_4bit; planned as 16-bit")
    out.spec["double_quant"] = True  # fixed in axolotl's loader, with nf4
    out.spec["quant_type"] = "nf4"
    b = reader.integer("micro_batch_size")
    out.batch_size = 1 if b is None else b
    if b is None:
        out.defaults["micro_batch_size"] = "1"
    g = reader.integer("gradient_accumulation_steps")
    out.grad_accum = 1 if g is None else g
    s = reader.integer("sequence_len")
    out.seq_len = 512 if s is None else s
    if s is None:
        out.defaults["sequence_len"] = "512"
    gc = reader.raw("gradient_checkpointing")
    if gc is None:
        out.spec["gradient_checkpointing"] = False
        out.defaults["gradient_checkpointing"] = "false"
    elif gc.lower() in ("offload", "offload_disk"):
        out.spec["gradient_checkpointing"] = True
        out.notes.append(f"gradient_checkpointing: {gc} keeps the checkpoints off the GPU; planned as on-GPU "
                         "checkpointing, which errs high")
    else:
        out.spec["gradient_checkpointing"] = bool(to_bool(gc))
    opt = reader.text("optimizer")
    out.spec["optim"] = optimizer(opt or "adamw_torch_fused", out.notes)
    if opt is None:
        out.defaults["optimizer"] = "adamw_torch_fused"
    r = reader.integer("lora_r")
    a = reader.number("lora_alpha")
    out.spec["lora_r"] = 8 if r is None else r  # peft's LoraConfig default when the config leaves it out
    out.spec["lora_alpha"] = 8 if a is None else round(a)
    if r is None:
        out.defaults["lora_r"] = "8 (peft's default)"
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.0 if d is None else d
    linear = reader.boolean("lora_target_linear")
    modules = reader.words("lora_target_modules")
    if linear:
        out.spec["lora_targets"] = None
    elif modules:
        out.spec["lora_targets"] = tuple(modules)
    else:
        out.spec["lora_targets"] = default_targets(model_type_of_name(model), out.notes)
    half = reader.boolean("fp16") or reader.boolean("float16")
    reader.raw("bf16")
    reader.boolean("bfloat16")
    out.spec["compute_dtype"] = "fp16" if half else "bf16"
    attn = reader.text("attn_implementation")
    if reader.boolean("flash_attention"):
        attn = "flash_attention_2"
    elif reader.boolean("sdp_attention"):
        attn = "sdpa"
    elif reader.boolean("eager_attention"):
        attn = "eager"
    elif reader.boolean("xformers_attention"):
        out.notes.append("xformers attention planned as sdpa (memory-efficient, linear in tokens)")
        attn = "sdpa"
    out.spec["attn"] = attention(attn, out.notes)
    if reader.boolean("sample_packing"):
        out.notes.append("sample_packing: rows are packed to sequence_len tokens, so the plan's length is the real one")
    ds = reader.text("deepspeed")
    if ds is not None:
        path = Path(ds).expanduser()
        state.deepspeed(load_json_or_text(ds if ds.lstrip().startswith("{") or path.is_absolute()
                                          else str(cwd / path), "axolotl deepspeed config"), "deepspeed")
        state.config_file = ds
    fsdp_config = cfg.get("fsdp_config")
    fsdp = reader.words("fsdp")
    reader.ignore(["fsdp_config", "fsdp_version"])
    if isinstance(fsdp_config, Mapping) or fsdp:
        state.strategy = "fsdp"
        offload = fsdp_config.get("offload_params", fsdp_config.get("fsdp_offload_params")) \
            if isinstance(fsdp_config, Mapping) else None
        if to_bool(str(offload)) or (fsdp and any("offload" in f for f in fsdp)):
            state.offload = True
    reader.ignore(IGNORED)
    return out
