"""Answer.AI's fsdp_qlora ``train.py``: fastcore ``call_parse`` flags of its own, FSDP always.

Defaults are its ``main()``'s (AnswerDotAI/fsdp_qlora): ``world_size`` -1 (every visible GPU, processes it spawns
itself), ``train_type`` qlora, ``batch_size`` 1, ``context_length`` 512, ``gradient_accumulation_steps`` 1,
``use_gradient_checkpointing`` true, ``use_cpu_offload`` true (FSDP parameter offload), ``precision`` bf16,
``lora_rank`` 64, ``lora_alpha`` 16, ``lora_dropout`` 0.1, ``lora_target_modules`` all (k, q, v, up, down, gate:
no o_proj), ``optimizer`` adamw. Its own loop keeps the model output until the next step: the ``loop``
framework.
"""

from __future__ import annotations

from vramscope.commands.argv import to_bool
from vramscope.commands.common import read_dataset, set_dora, set_quant_method
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import optimizer
from vramscope.commands.reading import Context, Reading

ALL_TARGETS = ("k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj")
TRAIN_TYPES = {"qlora": (4, "bnb"), "custom_qlora": (4, "bnb"), "bnb_dora": (4, "bnb"), "bnb_llama_pro": (4, "bnb"),
               "hqq_lora": (4, "hqq"), "hqq_dora": (4, "hqq"), "hqq_llama_pro": (4, "hqq"), "lora": (16, None),
               "custom_lora": (16, None)}

IGNORED = frozenset("""
master_port seed log_to verbose save_model output_dir project_name entity n_bits num_epochs lr lr_scheduler
apply_gradient_clipping grad_norm wd profile_memory low_memory reentrant_checkpointing use_activation_checkpointing
dataset_samples sharding_strategy loading_workers name profiling_output overwrite_profiling_output
""".split())  # noqa: SIM905 (a word list reads best as words)


def _flag(ctx: Context, name: str, default: bool) -> bool:
    word = ctx.reader.raw(name)
    if word is None:
        return default
    value = to_bool(word)
    return default if value is None else value


def read_fsdp_qlora(ctx: Context) -> Reading:
    reader, state = ctx.reader, ctx.state
    model = reader.text("model_name")
    out = Reading("fsdp_qlora", model or "meta-llama/Llama-2-7b-hf", {}, 1, 512, 1, None, "--context_length",
                  batch_flag="--batch_size")
    if model is None:
        out.defaults["model_name"] = "meta-llama/Llama-2-7b-hf"
    train_type = (reader.text("train_type") or "qlora").lower()
    if train_type == "full":
        raise CommandReadError(f"--train_type full trains every parameter; vramscope plans LoRA and QLoRA runs; "
                               f"{HOW_INSTEAD}")
    if train_type not in TRAIN_TYPES:
        raise CommandReadError(f"--train_type {train_type} is not planned ({', '.join(TRAIN_TYPES)} are); "
                               f"{HOW_INSTEAD}")
    bits, method = TRAIN_TYPES[train_type]
    out.spec["bits"] = bits
    if method is not None:
        set_quant_method(out, method)
        out.memory["quant_storage"] = "bf16"  # train.py loads 4-bit weights with bf16 storage for FSDP
    if "dora" in train_type:
        set_dora(out)
    if "llama_pro" in train_type:
        out.unsupported.append(f"--train_type {train_type}: the added Llama-Pro blocks are not modelled")
    out.spec["double_quant"] = False
    out.spec["quant_type"] = "nf4"
    batch = reader.integer("batch_size")
    out.batch_size = 1 if batch is None else batch
    accum = reader.integer("gradient_accumulation_steps")
    out.grad_accum = 1 if accum is None else accum
    length = reader.integer("context_length")
    out.seq_len = 512 if length is None else length
    if length is None:
        out.defaults["context_length"] = "512"
    out.spec["gradient_checkpointing"] = _flag(ctx, "use_gradient_checkpointing", True)
    precision = (reader.text("precision") or "bf16").lower()
    out.spec["compute_dtype"] = "fp32" if precision == "fp32" else "fp16" if precision.startswith("fp16") else "bf16"
    r = reader.integer("lora_rank")
    out.spec["lora_r"] = 64 if r is None else r
    if r is None:
        out.defaults["lora_rank"] = "64"
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 16 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.1 if d is None else d
    targets = reader.words("lora_target_modules")
    out.spec["lora_targets"] = ALL_TARGETS if not targets or targets == ["all"] else tuple(targets)
    out.spec["optim"] = optimizer(reader.text("optimizer") or "adamw", out.notes)
    out.spec["attn"] = "sdpa"
    steps = reader.integer("max_steps")
    out.max_steps = steps if steps is not None and steps > 0 else None
    state.launcher = "python (fsdp_qlora spawns its processes)"
    state.strategy = "fsdp"
    state.fsdp_version = 1
    out.defaults["fsdp_version"] = "1 (train.py wraps the model in FullyShardedDataParallel)"
    world = reader.integer("world_size")
    state.per_node = world if world is not None and world > 0 else None
    state.offload = _flag(ctx, "use_cpu_offload", True)
    read_dataset(reader, out, ctx.folder)
    reader.ignore(IGNORED)
    return out
