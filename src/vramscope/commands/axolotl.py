"""axolotl's ``config.yml`` (``axolotl train config.yml``, ``accelerate launch -m axolotl.cli.train config.yml``).

Key names and defaults are axolotl's pydantic schema (``utils/schemas/``): ``micro_batch_size`` 1,
``gradient_accumulation_steps`` 1, ``sequence_len`` 512, ``gradient_checkpointing`` false, ``optimizer``
``adamw_torch_fused``, ``lora_dropout`` 0.0, ``bf16`` ``auto``. A QLoRA model is loaded with NF4 and double
quantization fixed in its loader, then passed through peft's ``prepare_model_for_kbit_training`` before the HF
``Trainer`` subclass runs it: the ``hf`` framework, which names ``axolotl`` in its ``programs``. ``--key value``
after the config file override it, as axolotl's CLI does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from vramscope.commands.argv import Reader, to_bool
from vramscope.commands.common import (
    add_dataset_entries,
    model_name_facts,
    read_trainer_lengths,
    set_dora,
    set_liger,
    set_modules_to_save,
    set_quant_method,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_json_or_text
from vramscope.commands.fsdp import axolotl_version, fsdp_version_of
from vramscope.commands.launchers import LaunchState
from vramscope.commands.programs import attention, deepspeed_by_name, default_targets, optimizer
from vramscope.commands.reading import Context, Reading
from vramscope.commands.types import Alternative
from vramscope.planner.frameworks.registry import framework_of_program

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
 loss_watchdog_threshold loss_watchdog_patience
save_safetensors save_strategy eval_strategy max_steps use_tensorboard push_dataset_to_hub hf_use_auth_token
dataloader_num_workers dataloader_pin_memory dataloader_prefetch_factor lora_model_dir peft_use_rslora
""".split())  # noqa: SIM905 (a word list reads best as words)


_RL = {"dpo": "dpo", "ipo": "dpo", "simpo": "orpo", "orpo": "orpo", "kto": "kto", "grpo": "grpo"}


def read_axolotl(ctx: Context) -> Reading:
    """An axolotl YAML (and ``--key value`` overrides after it), with axolotl's schema defaults."""
    reader, state, cfg, cwd = ctx.reader, ctx.state, ctx.cfg, ctx.folder
    model_type_of_name = ctx.model_type_of
    model = reader.text("base_model")
    if model is None:
        raise CommandReadError(f"the axolotl config has no base_model; add it, or {HOW_INSTEAD}")
    out = Reading("axolotl", model, {}, 1, 512, 1, None, "sequence_len", batch_flag="micro_batch_size",
                  accum_flag="gradient_accumulation_steps", flags_in_config=True,
                  eval_batch_follows_train=True)  # eval_batch_size follows micro_batch_size
    # the framework the reading plans with is the table's (commands/__init__._assemble): the note names the same
    out.notes.append("axolotl prepares the model with peft's prepare_model_for_kbit_training and trains it with "
                     f"an HF Trainer: planned as the {framework_of_program(out.program).name} framework")
    adapter = reader.text("adapter")
    if adapter is None or adapter.lower() in ("none", "null", ""):
        raise CommandReadError(f"the axolotl config has no adapter (a full fine-tune); vramscope plans LoRA and "
                               f"QLoRA runs: set adapter: qlora or lora, or {HOW_INSTEAD}")
    if adapter not in ("lora", "qlora"):
        raise CommandReadError(f"axolotl adapter {adapter!r} is not planned (lora and qlora are); {HOW_INSTEAD}")
    four, eight = reader.boolean("load_in_4bit"), reader.boolean("load_in_8bit")
    out.spec["bits"] = 4 if four else 8 if eight else 16
    if four or eight:
        out.memory["quant_method"] = "bnb"
    if reader.boolean("gptq"):
        out.spec["bits"] = 4
        set_quant_method(out, "gptq")
    elif adapter == "qlora" and not four:
        out.assumed.append("adapter: qlora without load_in_4bit: axolotl asks for load_in_4bit; planned as 16-bit")
        out.alternatives.append(Alternative("if it loads in 4-bit", {"bits": 4}))
    out.spec["double_quant"] = True  # fixed in axolotl's loader, with nf4
    out.spec["quant_type"] = "nf4"
    if out.spec["bits"] == 4 and out.memory.get("quant_method") == "bnb":
        out.memory["quant_storage"] = "bf16"  # axolotl's loader stores 4-bit weights as bfloat16
    rl = reader.text("rl")
    if rl is not None and rl.lower() not in ("none", "null", "false"):
        kind = _RL.get(rl.lower())
        if kind is None:
            raise CommandReadError(f"axolotl rl: {rl} is not planned (dpo, ipo, orpo, simpo, kto, grpo are); "
                                   f"{HOW_INSTEAD}")
        out.trainer["kind"] = kind
    elif reader.boolean("reward_model"):
        out.trainer["kind"] = "reward"
    read_trainer_lengths(reader, out)
    # DPO, KTO, reward and GRPO are planned by the planner's phases (commands/phases.py); ORPO's gap is said once
    # by common.trainer_gaps.
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
        out.memory["checkpoint_offload"] = True
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
    if reader.boolean("group_by_length"):
        out.memory["group_by_length"] = True
    if reader.boolean("pad_to_sequence_len") and out.seq_len:
        out.memory["pad_to_multiple_of"] = out.seq_len  # every batch padded to sequence_len, however short
    if reader.boolean("sample_packing"):
        out.memory["packing"] = True  # the dataset's longest batch is then full rows of sequence_len
        out.notes.append("sample_packing: rows are packed to sequence_len tokens, so the plan's length is the real one")
    if reader.boolean("activation_offloading"):
        out.memory["checkpoint_offload"] = True
        out.unsupported.append("activation_offloading: activations kept in host memory; planned on the GPU "
                               "(errs high)")
    quant = cfg.get("model_quantization_config")
    if isinstance(quant, str):
        reader.silent("model_quantization_config")
        kwargs = cfg.get("model_quantization_config_kwargs")
        reader.silent("model_quantization_config_kwargs")
        if isinstance(kwargs, Mapping) and to_bool(str(kwargs.get("dequantize", False))):
            out.defaults["bits"] = f"16 ({quant} with dequantize: true loads bf16 weights)"
        elif out.spec["bits"] == 16:
            out.spec["bits"] = 4
            set_quant_method(out, quant.lower().removesuffix("config"))
    if reader.boolean("use_kernels"):
        out.unsupported.append("use_kernels: the hub's kernels (MoE, attention) are not modelled")
    if reader.boolean("peft_use_dora"):
        set_dora(out)
    saved = reader.words("lora_modules_to_save")
    if saved:
        set_modules_to_save(out, saved)
    if reader.boolean("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        set_liger(out)
    _deepspeed(reader, state, cwd)
    eval_batch = reader.silent("eval_batch_size")
    if eval_batch is not None and eval_batch.isdigit():
        out.eval["per_device_eval_batch_size"] = int(eval_batch)
    val = reader.silent("val_set_size")
    if reader.has("test_datasets") or (val is not None and val not in ("0", "0.0", "none")):
        out.eval["eval_strategy"] = reader.silent("eval_strategy") or "steps"
    add_dataset_entries(out, cfg.get("datasets"), cwd)
    reader.silent("datasets")
    fsdp_config = cfg.get("fsdp_config")
    fsdp = reader.words("fsdp")
    top_version = reader.text("fsdp_version")  # the YAML's top level, or a --fsdp_version override after it
    reader.ignore(["fsdp_config"])
    if isinstance(fsdp_config, Mapping) or fsdp:
        state.strategy = "fsdp"
        offload = fsdp_config.get("offload_params", fsdp_config.get("fsdp_offload_params")) \
            if isinstance(fsdp_config, Mapping) else None
        if to_bool(str(offload)) or (fsdp and any("offload" in f for f in fsdp)):
            state.offload = True
        if top_version is not None and top_version.lower() not in ("none", "null"):
            state.set_fsdp_version(fsdp_version_of(top_version, "fsdp_version"), "fsdp_version")
        else:
            version, where = axolotl_version({"fsdp_config": fsdp_config})
            if version is not None:
                state.set_fsdp_version(version, where)
                state.read[f"{where} (axolotl config)"] = str(version)
            else:
                state.fsdp_default = (1, "axolotl pins FSDP1 when the config gives none")
    reader.ignore(IGNORED)
    model_name_facts(out)
    return out


def _deepspeed(reader: Reader, state: LaunchState, cwd: Path) -> None:
    """axolotl's ``deepspeed:`` JSON; a missing local file is a warning with the stage its name says."""
    ds = reader.text("deepspeed")
    if ds is None:
        return
    path = Path(ds).expanduser()
    full = path if path.is_absolute() else cwd / path
    if not ds.lstrip().startswith("{") and not os.path.lexists(full):  # a FIFO or device there is refused
        deepspeed_by_name(state, ds)
        return
    state.deepspeed(load_json_or_text(ds if ds.lstrip().startswith("{") else str(full),
                                      "axolotl deepspeed config"), "deepspeed")
    state.config_file = ds
