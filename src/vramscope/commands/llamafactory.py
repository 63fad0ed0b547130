"""LLaMA-Factory: ``llamafactory-cli train x.yaml [key=value ...]``, ``FORCE_TORCHRUN=1 NPROC_PER_NODE=2
llamafactory-cli train x.yaml``, ``accelerate launch src/train.py x.yaml``.

Keys and defaults are LLaMA-Factory's ``hparams/`` dataclasses (hiyouga/LLaMA-Factory): ``cutoff_len`` 2048,
``lora_rank`` 8, ``lora_alpha`` None (twice the rank), ``lora_dropout`` 0, ``lora_target`` ``all`` (every
linear layer), ``quantization_bit`` None with ``quantization_method`` bnb, ``quantization_type`` nf4 and
``double_quantization`` true, ``disable_gradient_checkpointing`` false (checkpointing on), ``packing`` on only
for ``stage: pt``; the rest are ``Seq2SeqTrainingArguments`` (per-device batch 8, accumulation 1,
adamw_torch). Its trainers subclass the HF ``Trainer``: the ``hf`` framework.
"""

from __future__ import annotations

from vramscope.commands.common import (
    add_dataset_entries,
    model_name_facts,
    read_eval,
    read_memory_extras,
    read_trainer_lengths,
    set_dora,
    set_liger,
    set_quant_method,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import attention, distributed, dtype_word, training
from vramscope.commands.reading import Context, Reading

STAGES = {"sft": "sft", "dpo": "dpo", "kto": "kto", "rm": "reward", "pt": "pretrain", "ppo": "ppo"}

IGNORED = frozenset("""
do_train do_predict template max_samples overwrite_cache preprocessing_num_workers plot_loss trust_remote_code
tokenized_path mix_strategy interleave_probs streaming buffer_size val_size eval_dataset eval_steps
pref_beta pref_ftx simpo_gamma kto_chosen_weight kto_rejected_weight loraplus_lr_ratio loraplus_lr_embedding
pissa_init pissa_iter pissa_convert create_new_adapter use_rslora adapter_name_or_path export_dir export_size
export_device export_quantization_bit infer_backend media_dir image_max_pixels image_min_pixels video_max_pixels
video_fps freeze_vision_tower freeze_multi_modal_projector train_mm_proj_only ignore_pad_token_for_loss
new_special_tokens resize_vocab split_special_tokens default_system enable_thinking tool_format
""".split())  # noqa: SIM905 (a word list reads best as words)


def read_llamafactory(ctx: Context) -> Reading:
    reader, state = ctx.reader, ctx.state
    model = reader.text("model_name_or_path")
    if model is None:
        raise CommandReadError(f"the LLaMA-Factory config has no model_name_or_path; add it, or {HOW_INSTEAD}")
    out = Reading("llamafactory", model, {}, 8, 2048, 1, None, "cutoff_len",
                  batch_flag="per_device_train_batch_size")
    finetuning = (reader.text("finetuning_type") or "lora").lower()
    if finetuning != "lora":
        raise CommandReadError(f"finetuning_type: {finetuning} trains every parameter (or whole layers); vramscope "
                               f"plans LoRA and QLoRA runs: use finetuning_type: lora, or {HOW_INSTEAD}")
    if not reader.has("finetuning_type"):
        out.defaults["finetuning_type"] = "lora"
    stage = (reader.text("stage") or "sft").lower()
    kind = STAGES.get(stage)
    if kind is None:
        raise CommandReadError(f"LLaMA-Factory stage: {stage} is not planned (sft, dpo, kto, rm, pt, ppo); "
                               f"{HOW_INSTEAD}")
    loss = (reader.text("pref_loss") or "sigmoid").lower()
    out.trainer["kind"] = "orpo" if kind == "dpo" and loss in ("orpo", "simpo") else kind
    training(reader, out, batch=8, accum=1, checkpointing=True, optim="adamw_torch", bf16=False, max_steps=None)
    if reader.boolean("disable_gradient_checkpointing"):
        out.spec["gradient_checkpointing"] = False
    elif "gradient_checkpointing" in out.defaults:
        out.defaults["gradient_checkpointing"] = "true (disable_gradient_checkpointing: false)"
    bits = reader.integer("quantization_bit")
    method = (reader.text("quantization_method") or "bnb").lower()
    if bits is not None:
        if bits not in (2, 3, 4, 8):
            raise CommandReadError(f"quantization_bit: {bits} is not planned (4 and 8 are)")
        out.spec["bits"] = 4 if bits < 8 else 8
        set_quant_method(out, method)
        if bits < 4:
            out.unsupported.append(f"quantization_bit: {bits} is planned as 4-bit, which is high")
    else:
        out.spec["bits"] = 16
    out.spec["quant_type"] = reader.text("quantization_type") or "nf4"
    dq = reader.boolean("double_quantization")
    out.spec["double_quant"] = True if dq is None else dq
    if out.spec["bits"] == 4 and method == "bnb":
        out.memory["quant_storage"] = "compute dtype"  # quantization.py: bnb_4bit_quant_storage=compute_dtype
    fp16 = bool(reader.boolean("fp16"))
    out.spec["compute_dtype"] = "fp16" if fp16 else "bf16"
    dtype = dtype_word(reader.text("infer_dtype"))
    if dtype == "fp32":
        out.spec["compute_dtype"] = "fp32"
    rank = reader.integer("lora_rank")
    out.spec["lora_r"] = 8 if rank is None else rank
    if rank is None:
        out.defaults["lora_rank"] = "8"
    alpha = reader.number("lora_alpha")
    out.spec["lora_alpha"] = out.spec["lora_r"] * 2 if alpha is None else round(alpha)
    if alpha is None:
        out.defaults["lora_alpha"] = f"{out.spec['lora_alpha']} (twice lora_rank)"
    dropout = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.0 if dropout is None else dropout
    targets = reader.words("lora_target")
    out.spec["lora_targets"] = None if not targets or targets == ["all"] else tuple(targets)
    if targets is None:
        out.defaults["lora_target"] = "all"
    read_memory_extras(reader, out)
    if reader.boolean("use_dora") and not out.memory.get("dora"):
        set_dora(out)
    if reader.boolean("enable_liger_kernel") and not out.memory.get("liger"):
        set_liger(out)
    if reader.boolean("use_unsloth"):
        out.unsupported.append("use_unsloth: Unsloth's kernels use less memory than planned (errs high)")
    flash = (reader.text("flash_attn") or "auto").lower()
    out.spec["attn"] = attention({"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}.get(flash),
                                 out.notes)
    length = reader.integer("cutoff_len")
    if length is None:
        out.defaults["cutoff_len"] = "2048"
    else:
        out.seq_len = length
    packing = reader.boolean("packing")
    if packing or (packing is None and stage == "pt") or reader.boolean("neat_packing"):
        out.memory["packing"] = True
    read_trainer_lengths(reader, out)
    read_eval(reader, out)
    add_dataset_entries(out, _dataset_list(reader.silent("dataset")), ctx.folder)
    folder = reader.silent("dataset_dir")
    out.dataset["dataset_dir"] = folder or "data"
    if folder is None:
        out.defaults["dataset_dir"] = "data"
    distributed(reader, state, cfg=ctx.cfg)
    reader.ignore(IGNORED)
    model_name_facts(out)
    return out


def _dataset_list(value: str | None) -> list[str]:
    return [] if value is None else [w.strip() for w in value.replace(" ", ",").split(",") if w.strip()]
