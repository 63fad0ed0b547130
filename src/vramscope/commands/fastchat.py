"""FastChat's ``fastchat/train/train_lora.py`` (usually behind ``deepspeed``): TrainingArguments with its own
LoRA and data dataclasses.

Defaults are lm-sys/FastChat's: ``model_max_length`` 512, ``lora_r`` 8, ``lora_alpha`` 16, ``lora_dropout`` 0.05,
``lora_target_modules`` q_proj,v_proj, ``q_lora`` False (True: NF4 with double quantization and
``prepare_model_for_kbit_training``), ``flash_attn`` False, ``optim`` adamw_torch, gradient checkpointing off
unless ``--gradient_checkpointing``. An HF Trainer: the ``hf`` framework.
"""

from __future__ import annotations

from vramscope.commands.common import read_dataset, read_eval, read_memory_extras, set_quant_method
from vramscope.commands.programs import attention, distributed, dtype_word, targets_of, training
from vramscope.commands.reading import Context, Reading


def read_fastchat(ctx: Context) -> Reading:
    reader, state = ctx.reader, ctx.state
    model = reader.text("model_name_or_path")
    out = Reading("fastchat", model or "facebook/opt-125m", {}, 8, 512, 1, None, "--model_max_length")
    use_bf16, fp16 = training(reader, out, batch=8, accum=1, checkpointing=False, optim="adamw_torch", bf16=False,
                              max_steps=None)
    if reader.boolean("q_lora"):
        out.spec["bits"], out.spec["double_quant"], out.spec["quant_type"] = 4, True, "nf4"
        set_quant_method(out, "bnb")
    else:
        out.spec["bits"] = 16
        out.defaults["q_lora"] = "false"
    out.spec["compute_dtype"] = "fp16" if fp16 and not use_bf16 else "bf16" if use_bf16 else "fp32"
    if not use_bf16 and not fp16:
        out.notes.append("train_lora.py without --bf16 or --fp16 computes in fp32: planned in fp32")
    dtype = dtype_word(reader.text("torch_dtype"))
    if dtype in ("bf16", "fp16"):
        out.spec["compute_dtype"] = dtype
    r = reader.integer("lora_r")
    out.spec["lora_r"] = 8 if r is None else r
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 16 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.05 if d is None else d
    targets = reader.words("lora_target_modules")
    out.spec["lora_targets"] = ("q_proj", "v_proj") if targets is None else targets_of(targets)
    if targets is None:
        out.defaults["lora_target_modules"] = "q_proj,v_proj"
    read_memory_extras(reader, out)
    out.spec["attn"] = attention("flash_attention_2" if reader.boolean("flash_attn") else None, out.notes)
    length = reader.integer("model_max_length")
    if length is None:
        out.defaults["model_max_length"] = "512"
    else:
        out.seq_len = length
    reader.silent("lazy_preprocess")
    reader.silent("lora_bias")
    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder, "eval_data_path")
    distributed(reader, state, cfg=ctx.cfg)
    return out
