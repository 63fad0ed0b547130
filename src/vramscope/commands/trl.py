"""TRL's scripts for every trainer: ``trl sft|dpo|grpo|kto|reward``, ``python -m trl.scripts.<kind>``,
``trl/scripts/<kind>.py`` and ``examples/scripts/<kind>*.py`` given by path, the alignment-handbook's
``scripts/<kind>.py recipe.yaml``, and any script that builds one of TRL's trainers behind ``TrlParser``.

Defaults are TRL 1.16's (``trl/trainer/*_config.py``, ``ModelConfig``): ``max_length`` 1024 for SFT, DPO, KTO,
reward and ORPO; GRPO's ``num_generations`` 8 and ``max_completion_length`` 512 (its prompts are not cut:
there is no ``max_prompt_length`` in 1.16, so the prompt's share is a guess the plan states); every trainer
checkpoints by default and ``ModelConfig.dtype`` is float32 unless ``--dtype`` says.
"""

from __future__ import annotations

from vramscope.commands.argv import options_from_mapping
from vramscope.commands.common import (
    add_dataset_entries,
    read_dataset,
    read_eval,
    read_memory_extras,
    read_trainer_lengths,
    set_quant_method,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import (
    attention,
    default_targets,
    distributed,
    dtype_word,
    reader_int,
    targets_of,
    training,
)
from vramscope.commands.reading import Context, Reading
from vramscope.commands.types import Alternative

TRL_KINDS = ("sft", "dpo", "grpo", "kto", "reward", "orpo", "rloo")
MAX_LENGTH = {"sft": 1024, "dpo": 1024, "kto": 1024, "reward": 1024, "orpo": 1024}
GRPO_COMPLETION, GRPO_GENERATIONS = 512, 8
GRPO_PROMPT_GUESS = 512  # TRL 1.16 does not cut prompts; a typical prompt budget, said as assumed


def kind_of_name(name: str) -> str | None:
    """The trainer a script's or subcommand's name says: ``dpo.py`` -> dpo, ``grpo_vlm.py`` -> grpo."""
    stem = name.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py").lower()
    for kind in ("grpo", "rloo", "dpo", "kto", "orpo", "reward", "sft", "ppo"):
        if stem == kind or stem.startswith((f"{kind}_", f"{kind}-", f"run_{kind}")) or stem.endswith(f"_{kind}"):
            return "grpo" if kind == "rloo" else kind
    return None


def read_trl(ctx: Context) -> Reading:
    """A TRL trainer's script with TRL 1.16's defaults for that trainer."""
    reader, state = ctx.reader, ctx.state
    kind = ctx.kind or ctx.script.trainer_kind or "sft"
    if ctx.script.config_kwargs:  # a script that writes SFTConfig(...) itself: its values, the flags winning
        reader.add_defaults(options_from_mapping(ctx.script.config_kwargs, f"{ctx.target.name} code"))
    out = Reading("trl", reader.text("model_name_or_path", "model_name"), {}, 8, None, 1, None,
                  "--max_length")
    out.trainer["kind"] = kind
    use_bf16, fp16 = training(reader, out, batch=8, accum=1, checkpointing=True, optim="adamw_torch_fused",
                              bf16=True, max_steps=None)
    use_peft = reader.boolean("use_peft")
    if use_peft is None and not _trls_own(ctx) and reader.has("lora_r", "lora_alpha", "lora_target_modules"):
        # A TRL-shaped script of someone else's (a blog's grpo.py) given LoRA flags: its own code applies them.
        use_peft = True
        out.assumed.append("LoRA: the script is not TRL's own and gets --lora_r without --use_peft; planned "
                           "with LoRA as its flags say")
    if not use_peft:
        raise CommandReadError(f"the command trains every parameter (TRL {kind} without --use_peft); vramscope "
                               f"plans LoRA and QLoRA runs: add --use_peft, or {HOW_INSTEAD}")
    four, eight = reader.boolean("load_in_4bit"), reader.boolean("load_in_8bit")
    out.spec["bits"] = 4 if four else 8 if eight else 16
    if four or eight:
        set_quant_method(out, "bnb")
    out.spec["quant_type"] = reader.text("bnb_4bit_quant_type") or "nf4"
    nested = reader.boolean("use_bnb_nested_quant")
    out.spec["double_quant"] = bool(nested)
    if four and nested is None:
        out.defaults["use_bnb_nested_quant"] = "false"
    dtype = dtype_word(reader.text("dtype", "torch_dtype"))
    if dtype is None:
        out.defaults["dtype"] = "float32"
        dtype = "fp32"
    if dtype == "auto":
        out.notes.append("TRL loads the model in its checkpoint's dtype (--dtype auto); the plan assumes bf16, which "
                         "is low for a float32 checkpoint: pass --dtype bfloat16 to the command to match")
    # TRL's scripts hand --dtype to bitsandbytes as the compute dtype too: the float32 default keeps the
    # embeddings, norms and lm_head in fp32 and computes in fp32 (the planner's trl framework models that).
    if dtype == "fp32":
        out.spec["compute_dtype"] = "fp32"
    else:
        out.spec["compute_dtype"] = "fp16" if dtype == "fp16" or (dtype == "auto" and fp16 and not use_bf16) else "bf16"
    r = reader.integer("lora_r")
    out.spec["lora_r"] = 16 if r is None else r
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 32 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.05 if d is None else d
    if r is None:
        out.defaults.update(lora_r="16", lora_alpha="32" if a is None else str(out.spec["lora_alpha"]))
    targets = reader.words("lora_target_modules")
    if targets is None:
        out.spec["lora_targets"] = default_targets(ctx.model_type_of(out.model), out.notes)
        out.defaults["lora_target_modules"] = "peft's default: " + ",".join(out.spec["lora_targets"] or ("all-linear",))
    else:
        out.spec["lora_targets"] = targets_of(targets)
    read_memory_extras(reader, out)
    out.spec["attn"] = attention(reader.text("attn_implementation"), out.notes)
    read_trainer_lengths(reader, out)
    _lengths(ctx, out, kind)
    if reader.boolean("packing"):
        out.memory["packing"] = True
        out.notes.append("packing: every row is filled to max_length tokens, so the plan's length is the real one")
    multiple = reader.integer("pad_to_multiple_of")
    if multiple:
        out.memory["pad_to_multiple_of"] = multiple
    if reader.boolean("padding_free"):
        out.memory["padding_free"] = True
        out.notes.append("padding_free: a batch is one row of its real tokens (at most batch x max_length)")
    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder)
    _recipe_datasets(ctx, out)
    distributed(reader, state, cfg=ctx.cfg)
    return out


def _recipe_datasets(ctx: Context, out: Reading) -> None:
    """The alignment-handbook's ``dataset_mixer: {name: fraction}`` and ``dataset_mixture: {datasets: [...]}``."""
    mixer = ctx.cfg.get("dataset_mixer")
    if isinstance(mixer, dict):
        add_dataset_entries(out, [str(k) for k in mixer], ctx.folder)
    mixture = ctx.cfg.get("dataset_mixture")
    if isinstance(mixture, dict):
        add_dataset_entries(out, mixture.get("datasets"), ctx.folder)
    for key in ("dataset_mixer", "dataset_mixture", "dataset_splits"):
        ctx.reader.silent(key)


def _lengths(ctx: Context, out: Reading, kind: str) -> None:
    reader = ctx.reader
    if kind == "grpo":
        t = out.trainer
        if "num_generations" not in t:
            t["num_generations"] = GRPO_GENERATIONS
            out.defaults["num_generations"] = str(GRPO_GENERATIONS)
        if "max_completion_length" not in t:
            t["max_completion_length"] = GRPO_COMPLETION
            out.defaults["max_completion_length"] = str(GRPO_COMPLETION)
        prompt = t.get("max_prompt_length")
        if prompt is None:
            prompt = GRPO_PROMPT_GUESS
            out.assumed.append(f"GRPO prompt length: TRL does not cut prompts; planned as {prompt} tokens "
                               f"+ {t['max_completion_length']} completion")
            longer = 4 * GRPO_PROMPT_GUESS
            out.alternatives.append(Alternative(f"if prompts run to {longer} tokens",
                                                seq_len=longer + int(t["max_completion_length"])))
        out.seq_len = int(prompt) + int(t["max_completion_length"])
        out.seq_flag = "--max_completion_length"
        if t.get("use_vllm"):
            mode = t.get("vllm_mode") or "colocate"
            t["vllm_mode"] = mode
            if mode == "colocate":
                share = t.get("vllm_gpu_memory_utilization") or 0.3
                out.unsupported.append(f"vLLM colocated: its engine holds {share:.0%} of the GPU beside training, "
                                       "which the plan does not add")
        if t.get("use_vllm"):  # without vLLM the planner's generation phase models TRL's own generate()
            out.unsupported.append(f"GRPO: {t['num_generations']} completions per prompt are generated by vLLM; "
                                   "its engine is not planned, and the generation phase shown is TRL's own "
                                   "generate(), which vLLM replaces")
        return
    length = reader.text("max_length", "max_seq_length")
    default = MAX_LENGTH.get(kind, 1024)
    if length is None:
        out.seq_len = default
        out.defaults["max_length"] = str(default)
    elif length.lower() in ("none", "null"):
        out.seq_len = None
        out.notes.append("--max_length None: TRL does not truncate, so the longest example sets the length")
    else:
        out.seq_len = reader_int(length, "--max_length")
    # DPO, KTO and reward are planned by the planner's phases (commands/phases.py); ORPO's gap is said once by
    # common.trainer_gaps, and a plan over several GPUs says that it plans the SFT step alone (cli/plan.py).


def _trls_own(ctx: Context) -> bool:
    """TRL's own scripts require --use_peft for LoRA (their ModelConfig); a copy elsewhere may not."""
    name = ctx.target.name.replace("\\", "/")
    return ctx.target.kind in ("trl", "module") or "trl/scripts/" in name or name.startswith("trl/")
