"""Unsloth: its ``unsloth-cli.py`` flags, and the arguments of ``FastLanguageModel.from_pretrained(...)`` /
``get_peft_model(...)`` in a script or a notebook saved as one (read statically, :mod:`.scripts`).

Defaults are Unsloth's (unslothai/unsloth): ``from_pretrained`` ``max_seq_length`` 2048, ``load_in_4bit`` True
in a script (the CLI's ``--load_in_4bit`` is a switch, off unless given), ``dtype`` None (bf16 where the GPU has
it); ``get_peft_model`` ``r`` 16, ``lora_alpha`` 16, ``lora_dropout`` 0, the seven projections, and
``use_gradient_checkpointing="unsloth"``: checkpointing ON, with the checkpoints offloaded to the host. The
CLI's batch 2, accumulation 4 and ``adamw_8bit``. Training is TRL's trainers under Unsloth's patches: planned
with the ``unsloth`` framework (``trl``'s dtypes and head, the checkpoints on the host) when the checkpoints are
offloaded, else ``trl``; Unsloth's own kernels use less memory than TRL's (errs high).
"""

from __future__ import annotations

from vramscope.commands.argv import options_from_mapping
from vramscope.commands.common import (
    model_name_facts,
    read_dataset,
    read_eval,
    read_trainer_lengths,
    set_dora,
    set_modules_to_save,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import attention, distributed, dtype_word, training
from vramscope.commands.reading import Context, Reading

SEVEN = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

IGNORED = frozenset("""
bias random_state use_rslora loftq_config save_model save_path quantization push_model hub_path hub_token
save_gguf save_method token finetune_vision_layers finetune_language_layers finetune_attention_modules
finetune_mlp_modules
""".split())  # noqa: SIM905 (a word list reads best as words)


def read_unsloth(ctx: Context) -> Reading:
    reader, state, facts = ctx.reader, ctx.state, ctx.script
    cli = ctx.target.name.replace("\\", "/").endswith("unsloth-cli.py")
    # A script's calls as options below the command line: get_peft_model, from_pretrained, then its trainer config.
    source = ctx.target.name
    peft = {k: v for k, v in facts.unsloth_peft.items() if k != "model"}
    reader.add_defaults(options_from_mapping(peft, f"{source} get_peft_model"))
    reader.add_defaults(options_from_mapping(facts.unsloth_load, f"{source} from_pretrained"))
    reader.add_defaults(options_from_mapping(facts.config_kwargs, f"{source} code"))
    model = reader.text("model_name", "model_name_or_path", "model")
    if model is None:
        raise CommandReadError(f"the Unsloth command or script names no model (model_name=...); {HOW_INSTEAD}")
    out = Reading("unsloth", model, {}, 2 if cli else 8, None, 4 if cli else 1, None, "--max_seq_length")
    out.trainer["kind"] = ctx.kind or facts.trainer_kind or "sft"
    if reader.boolean("full_finetuning"):
        raise CommandReadError(f"full_finetuning=True trains every parameter; vramscope plans LoRA and QLoRA runs; "
                               f"{HOW_INSTEAD}")
    use_bf16, fp16 = training(reader, out, batch=2 if cli else 8, accum=4 if cli else 1, checkpointing=True,
                              optim="adamw_8bit" if cli else "adamw_torch_fused", bf16=True, max_steps=None)
    four, eight = reader.boolean("load_in_4bit"), reader.boolean("load_in_8bit")
    if four is None and not cli:
        four = True
        out.defaults["load_in_4bit"] = "true (from_pretrained's default)"
    out.spec["bits"] = 4 if four else 8 if eight else 16
    if four or eight:
        out.memory["quant_method"] = "bnb"
    out.spec["double_quant"] = True  # Unsloth's bnb configs use double quantization
    out.spec["quant_type"] = "nf4"
    dtype = dtype_word(reader.text("dtype"))
    out.spec["compute_dtype"] = "fp16" if dtype == "fp16" or (fp16 and not use_bf16) else "bf16"
    r = reader.integer("r", "lora_r")
    out.spec["lora_r"] = 16 if r is None else r
    if r is None:
        out.defaults["r"] = "16"
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 16 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.0 if d is None else d
    targets = reader.words("target_modules")
    out.spec["lora_targets"] = SEVEN if cli or not targets else (
        None if targets in (["all-linear"], ["all_linear"]) else tuple(targets))
    if targets is None:
        out.defaults["target_modules"] = ",".join(SEVEN)
    gc = reader.raw("use_gradient_checkpointing")
    out.defaults.pop("gradient_checkpointing", None)  # get_peft_model's, not TrainingArguments', decides
    if gc is None or gc.lower() == "unsloth":
        out.spec["gradient_checkpointing"] = True
        out.memory["checkpoint_offload"] = True
        out.framework = "unsloth"  # TRL's trainer, the checkpoints on the host
        if gc is None:
            out.defaults["use_gradient_checkpointing"] = "unsloth"
        out.notes.append("use_gradient_checkpointing='unsloth': checkpointing on, the checkpoints offloaded to "
                         "pinned host memory (planned on the host from 512 tokens on; not measured on a GPU)")
    else:
        out.spec["gradient_checkpointing"] = gc.lower() in ("true", "1", "yes")
    if reader.boolean("use_dora"):
        set_dora(out)
    saved = reader.words("modules_to_save")
    if saved and saved not in (["none"], ["None"]):
        set_modules_to_save(out, saved)
    out.spec["attn"] = attention(None, out.notes)
    length = reader.integer("max_seq_length")
    out.seq_len = 2048 if length is None else length
    if length is None:
        out.defaults["max_seq_length"] = "2048"
    row = reader.integer("max_length")
    if out.trainer["kind"] in ("dpo", "orpo", "kto", "reward"):
        # The pair trainers cut rows at their config's max_length (TRL's 1024 by default), not the model's limit.
        out.seq_len = 1024 if row is None else row
        out.seq_flag = "max_length"
        if row is None:
            out.defaults["max_length"] = f"1024 ({out.trainer['kind'].upper()}Config)"
    elif row is not None:
        out.seq_len = row
    read_trainer_lengths(reader, out)
    if out.trainer["kind"] == "grpo":
        t = out.trainer
        t.setdefault("num_generations", 8)
        completion = t.setdefault("max_completion_length", 512 if "max_prompt_length" not in t
                                  else max(1, out.seq_len - int(t["max_prompt_length"])))
        out.seq_len = int(t.get("max_prompt_length") or 512) + int(completion)
    if reader.boolean("fast_inference"):
        t = out.trainer
        t["use_vllm"], t["vllm_mode"] = True, "colocate"
        share = reader.number("gpu_memory_utilization")
        if share is not None:
            t["vllm_gpu_memory_utilization"] = share
        out.unsupported.append(f"fast_inference: a vLLM engine in the same process holds "
                               f"{share if share is not None else 0.5:.0%} of the GPU, which the plan does not add")
        if t["kind"] == "grpo":  # without vLLM the planner's generation phase models TRL's generate()
            out.unsupported.append(f"GRPO: {t['num_generations']} completions per prompt are generated by vLLM; "
                                   "its engine is not planned, and the generation phase shown is TRL's own "
                                   "generate(), which vLLM replaces")
    reader.silent("max_lora_rank")
    reader.silent("gpu_memory_utilization")
    out.notes.append("Unsloth's fused kernels use less memory than TRL's: planned as TRL, which errs high")
    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder)
    distributed(reader, state, cfg=ctx.cfg)
    reader.ignore(IGNORED)
    model_name_facts(out)
    return out
