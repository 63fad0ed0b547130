"""llama-cookbook's finetuning (``python -m llama_cookbook.finetuning``, ``torchrun ... finetuning.py``): a fire CLI
over its ``train_config``, ``lora_config``, ``quantization_config`` and ``fsdp_config`` dataclasses.

Defaults are meta-llama/llama-cookbook's ``configs/``: ``batch_size_training`` 4, ``context_length`` 4096 with
``batching_strategy`` packing, ``gradient_accumulation_steps`` 1, ``quantization`` None (``4bit`` or ``8bit``),
``use_peft`` False, ``peft_method`` lora with ``r`` 8, ``lora_alpha`` 32, ``q_proj,v_proj``, dropout 0.05; 4-bit
``quant_type`` fp4 without double quantization, bf16 storage; FSDP (``--enable_fsdp``) checkpoints activations
by default, a single process does not. Its own training loop: the ``loop`` framework.
"""

from __future__ import annotations

from vramscope.commands.common import read_dataset, set_quant_method
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import optimizer
from vramscope.commands.reading import Context, Reading

IGNORED = frozenset("""
output_dir use_wandb save_model dist_checkpoint_root_folder dist_checkpoint_folder low_cpu_fsdp num_epochs lr
weight_decay gamma seed save_metrics run_validation val_batch_size num_workers_dataloader one_gpu
use_fast_kernels use_profiler profiler_dir flop_counter flop_counter_start max_train_step max_eval_step
from_peft_checkpoint freeze_layers num_freeze_layers tokenizer_name rdzv_id rdzv_backend rdzv_endpoint
""".split())  # noqa: SIM905 (a word list reads best as words)


def read_cookbook(ctx: Context) -> Reading:
    reader, state = ctx.reader, ctx.state
    model = reader.text("model_name")  # None: set elsewhere (a slurm script); plan asks for --model
    out = Reading("cookbook", model, {}, 4, 4096, 1, None, "--context_length",
                  batch_flag="--batch_size_training")
    if not reader.boolean("use_peft"):
        raise CommandReadError(f"llama-cookbook without --use_peft trains every parameter; vramscope plans LoRA and "
                               f"QLoRA runs: add --use_peft, or {HOW_INSTEAD}")
    method = (reader.text("peft_method") or "lora").lower()
    if method != "lora":
        raise CommandReadError(f"--peft_method {method} is not planned (lora is); {HOW_INSTEAD}")
    batch = reader.integer("batch_size_training")
    out.batch_size = 4 if batch is None else batch
    if batch is None:
        out.defaults["batch_size_training"] = "4"
    accum = reader.integer("gradient_accumulation_steps")
    out.grad_accum = 1 if accum is None else accum
    length = reader.integer("context_length")
    out.seq_len = 4096 if length is None else length
    if length is None:
        out.defaults["context_length"] = "4096 (batching_strategy packing)"
    out.memory["packing"] = (reader.text("batching_strategy") or "packing") == "packing"
    quant = reader.text("quantization")
    if quant is None or quant.lower() in ("none", "false"):
        out.spec["bits"] = 16
    else:
        q = quant.lower()
        out.spec["bits"] = 4 if "4" in q else 8 if "8" in q else 16
        if q not in ("4bit", "8bit"):
            out.assumed.append(f"--quantization {quant}: llama-cookbook takes 4bit or 8bit; planned as "
                               f"{out.spec['bits']}-bit")
        set_quant_method(out, "bnb")
    out.spec["quant_type"] = reader.text("quantization_config.quant_type") or "fp4"
    dq = reader.boolean("quantization_config.use_double_quant")
    out.spec["double_quant"] = bool(dq)
    if out.spec["bits"] == 4:
        out.memory["quant_storage"] = "bf16"
    fsdp = bool(reader.boolean("enable_fsdp"))
    if fsdp:
        state.strategy = "fsdp"
        state.fsdp_version = 1
        out.defaults["fsdp_version"] = "1 (finetuning.py wraps the model in FullyShardedDataParallel)"
        if reader.boolean("fsdp_config.fsdp_cpu_offload"):
            state.offload = True
    checkpointing = reader.boolean("fsdp_config.fsdp_activation_checkpointing")
    out.spec["gradient_checkpointing"] = fsdp and (checkpointing is None or checkpointing)
    out.spec["compute_dtype"] = "fp16" if reader.boolean("use_fp16") else "bf16"
    reader.boolean("fsdp_config.pure_bf16")
    reader.boolean("mixed_precision")
    r = reader.integer("lora_config.r")
    out.spec["lora_r"] = 8 if r is None else r
    if r is None:
        out.defaults["lora_config.r"] = "8"
    a = reader.number("lora_config.lora_alpha")
    out.spec["lora_alpha"] = 32 if a is None else round(a)
    d = reader.number("lora_config.lora_dropout")
    out.spec["lora_dropout"] = 0.05 if d is None else d
    targets = reader.words("lora_config.target_modules")
    out.spec["lora_targets"] = ("q_proj", "v_proj") if not targets else tuple(targets)
    out.spec["optim"] = optimizer("adamw_torch", out.notes)
    out.spec["attn"] = "sdpa"
    read_dataset(reader, out, ctx.folder)
    reader.ignore(IGNORED)
    return out
