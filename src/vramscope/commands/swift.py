"""ms-swift: ``swift sft|rlhf|pt --model X --tuner_type lora ...`` (``NPROC_PER_NODE=N`` makes it torchrun),
and ``accelerate launch / torchrun swift/cli/sft.py ...``.

Flags and defaults are ms-swift's ``swift/arguments`` (modelscope/ms-swift): ``--model`` is the model
(``--model_name`` is only the name the trained model calls itself), ``--tuner_type`` (``--train_type`` in
older releases) ``lora``; ``lora_rank`` 8, ``lora_alpha`` 32, ``lora_dropout`` 0.05, ``target_modules``
all-linear; ``--quant_bits`` / ``--quant_method`` (bnb, gptq, awq, hqq, eetq) with bnb's nf4 and double
quantization; per-device batch 1, gradient checkpointing on, accumulation ``ceil(16 / (batch x processes))``
when unset; ``max_length`` None means the model's own limit. GRPO (``swift rlhf --rlhf_type grpo``):
8 generations of at most 512 tokens.
"""

from __future__ import annotations

import math

from vramscope.commands.common import (
    four_bit_spelling,
    model_name_facts,
    read_dataset,
    read_eval,
    read_memory_extras,
    read_trainer_lengths,
    set_quant_method,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import attention, distributed, dtype_word, targets_of, training
from vramscope.commands.reading import Context, Reading

SWIFT_SUBCOMMANDS = {"sft": "sft", "pt": "pretrain", "rlhf": None}
RLHF = {"dpo": "dpo", "kto": "kto", "orpo": "orpo", "simpo": "orpo", "cpo": "orpo", "grpo": "grpo", "rm": "reward",
        "ppo": "ppo", "gkd": "sft"}
MAX_LENGTH_GUESS = 2048

IGNORED = frozenset("""
model_name model_author system split_dataset_ratio load_from_cache_file external_plugins reward_funcs columns
enable_thinking log_completions sleep_level offload_model offload_optimizer vllm_max_model_len
vllm_tensor_parallel_size num_iterations async_generate temperature dataset_num_proc streaming freeze_vit
freeze_aligner freeze_llm lazy_tokenize max_pixels strict vllm_enable_lora
""".split())  # noqa: SIM905 (a word list reads best as words)


def read_swift(ctx: Context) -> Reading:
    reader, state = ctx.reader, ctx.state
    model = reader.text("model", "model_id_or_path")
    if model is None:
        raise CommandReadError(f"the swift command names no --model; add it, or {HOW_INSTEAD}")
    out = Reading("swift", model, {}, 1, None, 1, None, "--max_length")
    kind = ctx.kind
    rlhf = reader.text("rlhf_type")
    if ctx.target.name == "rlhf" or rlhf is not None:
        kind = RLHF.get((rlhf or "dpo").lower())
        if kind is None:
            raise CommandReadError(f"swift rlhf --rlhf_type {rlhf} is not planned; {HOW_INSTEAD}")
        if rlhf is None:
            out.defaults["rlhf_type"] = "dpo"
    out.trainer["kind"] = kind or "sft"
    tuner = (reader.text("tuner_type", "train_type", "sft_type") or "lora").lower()
    if tuner not in ("lora", "qlora", "dora", "longlora", "adalora"):
        raise CommandReadError(f"swift --tuner_type {tuner}: vramscope plans LoRA and QLoRA runs; {HOW_INSTEAD}")
    if tuner == "dora":
        out.memory["dora"] = True
    use_bf16, fp16 = training(reader, out, batch=1, accum=0, checkpointing=True, optim="adamw_torch", bf16=True,
                              max_steps=None)
    bits, method = four_bit_spelling(reader)
    if bits is not None and bits < 16:
        out.spec["bits"] = 4 if bits < 8 else 8
        set_quant_method(out, method or "bnb")
        if not reader.has("quant_bits"):
            out.assumed.append("quant_bits: --quant_method bnb without --quant_bits; planned as 4-bit")
    else:
        out.spec["bits"] = 16
    out.spec["quant_type"] = reader.text("bnb_4bit_quant_type") or "nf4"
    dq = reader.boolean("bnb_4bit_use_double_quant")
    out.spec["double_quant"] = True if dq is None else dq
    model_dtype = dtype_word(reader.text("torch_dtype", "dtype"))
    dtype = dtype_word(reader.text("bnb_4bit_compute_dtype")) or model_dtype
    out.spec["compute_dtype"] = "fp16" if dtype == "fp16" or (fp16 and not use_bf16) else "bf16"
    if dtype == "fp32":
        out.spec["compute_dtype"] = "fp32"
    r = reader.integer("lora_rank", "lora_r")
    out.spec["lora_r"] = 8 if r is None else r
    if r is None:
        out.defaults["lora_rank"] = "8"
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 32 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.05 if d is None else d
    out.spec["lora_targets"] = targets_of(reader.words("target_modules", "lora_target_modules"))
    read_memory_extras(reader, out)
    if out.memory.get("dora") and not any("DoRA" in u for u in out.unsupported):
        out.unsupported.append("DoRA: the weight-norm pass over every adapted layer is not modelled")
    attn = reader.text("attn_impl", "attn_implementation")
    out.spec["attn"] = attention({"flash_attn": "flash_attention_2", "flash_attention_2": "flash_attention_2"}.get(
        attn or "", attn), out.notes)
    read_trainer_lengths(reader, out)
    if out.trainer["kind"] == "grpo":
        t = out.trainer
        t.setdefault("num_generations", 8)
        t.setdefault("max_completion_length", 512)
    length = reader.integer("max_length")
    if length is None:
        out.seq_len = MAX_LENGTH_GUESS
        out.assumed.append(f"max_length: swift uses the model's own limit when unset; planned at {MAX_LENGTH_GUESS} "
                           "(pass --seq-len before '--')")
    else:
        out.seq_len = length
    if out.trainer["kind"] == "grpo":
        out.seq_len = (out.seq_len or MAX_LENGTH_GUESS)
        if out.trainer.get("use_vllm"):  # without vLLM the planner's generation phase models TRL's generate()
            out.unsupported.append(f"GRPO: {out.trainer['num_generations']} completions per prompt are generated "
                                   "by vLLM; its engine is not planned, and the generation phase shown is TRL's "
                                   "own generate(), which vLLM replaces")
            if (out.trainer.get("vllm_mode") or "colocate") == "colocate":
                out.unsupported.append("vLLM colocated: its engine's share of the GPU is not in the plan")
    if reader.boolean("packing", "padding_free"):
        out.memory["packing"] = True
    if out.grad_accum == 0:  # swift: ceil(16 / (batch x processes)) when unset
        world = state.total or (state.per_node or 1) * state.nodes
        out.grad_accum = max(1, math.ceil(16 / (out.batch_size * world)))
        out.defaults["gradient_accumulation_steps"] = f"{out.grad_accum} (ceil(16 / (batch x processes)))"
    ds = reader.text("deepspeed")
    shorthand = ds is not None and ds.lower() in ("zero0", "zero1", "zero2", "zero3", "zero2_offload",
                                                  "zero3_offload")
    if ds is not None and shorthand:  # swift's own configs by name
        state.set_zero(int(ds[4]), "--deepspeed")
        state.offload = "offload" in ds
        state.config_file = ds
    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder, "dataset")
    distributed(reader, state, deepspeed=not shorthand, cfg=ctx.cfg)
    reader.ignore(IGNORED)
    model_name_facts(out)
    return out
