"""The recipe a training program's flags describe, with that program's own defaults.

Three readers over one :class:`~.argv.Reader`: TRL's ``sft`` script (TRL 1.16: ``ScriptArguments``,
``SFTConfig`` and ``ModelConfig``), the QLoRA reference ``qlora.py`` (artidoro/qlora's argument
dataclasses) and a generic script built on ``HfArgumentParser`` / ``TrainingArguments``. Each returns a
:class:`Reading`; the defaults it applied are recorded, so the plan can say what it assumed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramscope.commands.argv import Reader
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.files import load_json_or_text
from vramscope.commands.fsdp import trainer_default, trainer_fsdp_config
from vramscope.commands.launchers import LaunchState
from vramscope.commands.reading import Context, Reading

# peft 0.21's default LoRA targets per model_type (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), used
# when TRL's --lora_target_modules is not given. phi3 has none: peft then asks for target_modules.
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    **{t: ("q_proj", "v_proj") for t in (
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
        "gemma3_text", "starcoder2", "stablelm", "olmo", "olmo2", "cohere", "granite", "deepseek_v2",
    )},
    "falcon": ("query_key_value",),
    "gpt_neox": ("query_key_value",),
    "bloom": ("query_key_value",),
    "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gpt2": ("c_attn",),
    "gptj": ("q_proj", "v_proj"),
    "opt": ("q_proj", "v_proj"),
}

# HF optimizer names (transformers OptimizerNames) -> the planner's optimizer families.
_OPTIMIZERS = {
    "adamw_torch": "adamw_torch", "adamw_hf": "adamw_torch", "adamw": "adamw_torch", "adamw_torch_xla": "adamw_torch",
    "adamw_apex_fused": "adamw_torch_fused", "adamw_torch_fused": "adamw_torch_fused",
    "adamw_torch_npu_fused": "adamw_torch_fused", "adam": "adamw_torch",
    "paged_adamw_32bit": "paged_adamw_32bit", "paged_adamw": "paged_adamw_32bit",
    "paged_adam_32bit": "paged_adamw_32bit", "paged_adamw_8bit": "paged_adamw_8bit",
    "paged_adam_8bit": "paged_adamw_8bit",
    "adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit", "adam8bit": "adamw_8bit",
    "bnb_adamw_8bit": "adamw_8bit",
    "sgd": "sgd",
}

# TrainingArguments / TRL / qlora.py fields that do not change a step's memory: read silently.
IGNORED = frozenset("""
output_dir overwrite_output_dir do_train do_eval do_predict eval_strategy evaluation_strategy eval_steps eval_delay
save_strategy save_steps save_total_limit save_only_model save_safetensors logging_steps logging_strategy
logging_dir logging_first_step logging_nan_inf_filter report_to run_name project trackio_space_id seed data_seed
learning_rate lr_scheduler_type lr_scheduler_kwargs warmup_ratio warmup_steps weight_decay adam_beta1 adam_beta2
adam_epsilon max_grad_norm num_train_epochs push_to_hub hub_model_id hub_token hub_strategy hub_private_repo
dataloader_num_workers dataloader_pin_memory dataloader_persistent_workers dataloader_prefetch_factor
dataloader_drop_last remove_unused_columns group_by_length length_column_name load_best_model_at_end
metric_for_best_model greater_is_better resume_from_checkpoint ddp_find_unused_parameters ddp_backend ddp_timeout
tf32 per_device_eval_batch_size eval_accumulation_steps label_names disable_tqdm local_rank log_level
log_level_replica include_num_input_tokens_seen neftune_noise_alpha ignore_data_skip full_determinism
prediction_loss_only eval_on_start batch_eval_metrics use_cpu lr_scheduler_type
restore_callback_states_from_checkpoint dataset_name dataset_config dataset_train_split dataset_test_split
dataset_streaming dataset_text_field dataset_num_proc dataset_kwargs datasets eos_token pad_token chat_template_path
trust_remote_code model_revision use_auth_token cache_dir eval_dataset_size max_train_samples max_eval_samples
dataset dataset_format train_on_source mmlu_split mmlu_dataset do_mmlu_eval max_mmlu_samples mmlu_source_max_len
max_memory_MB max_new_tokens min_new_tokens do_sample num_beams num_beam_groups penalty_alpha use_cache temperature
top_k top_p typical_p diversity_penalty repetition_penalty length_penalty no_repeat_ngram_size predict_with_generate
generation_max_length generation_num_beams sortish_sampler completion_only_loss assistant_only_loss loss_type
truncation_mode packing_strategy eval_packing model_init_kwargs lora_task_type use_rslora
torch_empty_cache_steps average_tokens_across_devices optim_args skip_memory_metrics
ddp_bucket_cap_mb adam8bit chat_template trackio_project_name trackio_run_name log_completions use_auth
""".split())  # noqa: SIM905 (a word list reads best as words)


def optimizer(name: str, notes: list[str]) -> str:
    family = _OPTIMIZERS.get(name.lower())
    if family is None:
        notes.append(f"optimizer {name} is not modelled; planned as adamw_torch (two fp32 states per trainable "
                     "parameter, which errs high for most others)")
        return "adamw_torch"
    return family


def attention(name: str | None, notes: list[str]) -> str:
    if name is None or name in ("sdpa", "eager", "flash_attention_2"):
        return name or "sdpa"
    if name.startswith("flash_attention") or "flash" in name:
        notes.append(f"attention {name} planned as flash_attention_2")
        return "flash_attention_2"
    notes.append(f"attention {name} is not modelled; planned as sdpa")
    return "sdpa"


def default_targets(model_type: str | None, notes: list[str]) -> tuple[str, ...] | None:
    """peft's default LoRA targets for the architecture (TRL and axolotl leave target_modules unset)."""
    if model_type is not None and model_type in PEFT_DEFAULT_TARGETS:
        return PEFT_DEFAULT_TARGETS[model_type]
    if model_type is None:
        notes.append("LoRA targets: peft's default for the architecture, which is unknown here; planned as "
                     "q_proj,v_proj (pass --lora-targets to say)")
        return ("q_proj", "v_proj")
    notes.append(f"peft has no default LoRA targets for {model_type}; planned on every linear layer (errs high)")
    return None


def targets_of(words: list[str] | None) -> tuple[str, ...] | None:
    if not words or words in (["all-linear"], ["all_linear"]):
        return None
    return tuple(words)


def distributed(reader: Reader, state: LaunchState, *, deepspeed: bool = True,
                cfg: Mapping[str, Any] | None = None) -> None:
    """TrainingArguments' --fsdp (with its --fsdp_config) and --deepspeed, which override the launcher's reading.

    ``cfg`` is the program's own config file, where ``fsdp_config`` may be a mapping.
    """
    fsdp = reader.text("fsdp")
    if fsdp is not None and fsdp.strip().lower() not in ("", "false", "none", "no"):
        state.strategy = "fsdp"
        if "offload" in fsdp:
            state.offload = True
        _trainer_fsdp(reader, state, (cfg or {}).get("fsdp_config"))
    ds = reader.text("deepspeed") if deepspeed else None
    if ds is not None:
        inline = ds.lstrip().startswith("{")
        source = ds if inline or Path(ds).is_absolute() else str(state.cwd / ds)
        # Only a path that is not there at all is read by its name; a FIFO or a device there is refused when read.
        if not inline and not os.path.lexists(source):
            deepspeed_by_name(state, ds)
            return
        state.deepspeed(load_json_or_text(source, "--deepspeed config"), "--deepspeed")
        state.config_file = ds if not ds.lstrip().startswith("{") else state.config_file


def _trainer_fsdp(reader: Reader, state: LaunchState, nested: Any) -> None:
    """The Trainer builds its own FSDP plugin from ``--fsdp_config``: its version (or the Trainer's default)
    replaces the launcher's, and its ``cpu_offload`` offloads."""
    settings, missing = trainer_fsdp_config(reader.text("fsdp_config"), nested, state.cwd)
    if missing:
        state.notes.append(missing)
    if str(settings.get("cpu_offload", "")).lower() == "true":
        state.offload = True
    launcher_said = state.fsdp_version
    if settings.get("version") is not None:
        state.set_fsdp_version(settings["version"], "--fsdp_config version")
        state.read["fsdp_version (--fsdp_config)"] = str(state.fsdp_version)
        return
    state.fsdp_version = None
    state.fsdp_default = trainer_default()
    if launcher_said is not None and launcher_said != state.fsdp_default[0]:
        state.notes.append(f"the launcher's fsdp_version {launcher_said} does not apply: --fsdp makes the Trainer "
                           f"build its own FSDP plugin, FSDP{state.fsdp_default[0]} unless --fsdp_config says "
                           "\"version\"")


def deepspeed_by_name(state: LaunchState, name: str) -> None:
    """A DeepSpeed config that is not here (another machine's path, a shell variable): the stage its name says,
    ZeRO-2 when it says none, named in ``assumed`` rather than refused."""
    low = name.lower()
    stage = 3 if "zero3" in low or "z3" in low or "stage3" in low else 1 if "zero1" in low or "z1" in low else 2
    state.set_zero(stage, "--deepspeed")
    state.offload = state.offload or "offload" in low
    state.config_file = name
    state.assumed.append(f"deepspeed: {name} is not here; planned as ZeRO stage {stage}"
                         f"{' with offload' if state.offload else ''}, as its name says")


def training(reader: Reader, out: Reading, *, batch: int, accum: int, checkpointing: bool, optim: str,
              bf16: bool, max_steps: int | None) -> tuple[bool, bool]:
    """TrainingArguments' memory fields into ``out``; returns (bf16, fp16) as the run will use them."""
    b = reader.integer("per_device_train_batch_size", "per_gpu_train_batch_size")
    out.batch_size = b if b is not None else batch
    if b is None:
        out.defaults["per_device_train_batch_size"] = str(batch)
    g = reader.integer("gradient_accumulation_steps")
    out.grad_accum = g if g is not None else accum
    gc = reader.boolean("gradient_checkpointing")
    out.spec["gradient_checkpointing"] = checkpointing if gc is None else gc
    if gc is None:
        out.defaults["gradient_checkpointing"] = str(checkpointing).lower()
    name = reader.text("optim")
    out.spec["optim"] = optimizer(name if name is not None else optim, out.notes)
    if name is None:
        out.defaults["optim"] = optim
    steps = reader.integer("max_steps")
    out.max_steps = steps if steps is not None and steps > 0 else max_steps
    fp16 = bool(reader.boolean("fp16"))
    use_bf16 = reader.boolean("bf16")
    if use_bf16 is None:
        use_bf16 = bf16 and not fp16
    kwargs = reader.text("gradient_checkpointing_kwargs")
    if kwargs is not None and "use_reentrant" in kwargs:
        out.notes.append(f"gradient_checkpointing_kwargs {kwargs} read but not modelled")
    if reader.boolean("torch_compile"):
        out.unsupported.append("torch_compile: compiled kernels change the activations kept; not modelled")
    if reader.boolean("activation_offloading"):
        out.memory["checkpoint_offload"] = True
        out.unsupported.append("activation_offloading: activations kept in host memory; planned on the GPU "
                               "(errs high)")
    if reader.boolean("use_unsloth"):
        out.unsupported.append("use_unsloth: Unsloth's kernels use less memory than planned (errs high)")
    return use_bf16, fp16


def dtype_word(word: str | None) -> str | None:
    if word is None:
        return None
    w = word.lower().replace("torch.", "")
    return {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
            "float32": "fp32", "fp32": "fp32", "float": "fp32", "auto": "auto"}.get(w, w)


def reader_int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CommandReadError(f"{flag} {text!r} is not a whole number") from None
    if value <= 0:
        raise CommandReadError(f"{flag} must be positive, got {value}")
    return value


def read_qlora(ctx: Context) -> Reading:
    """The QLoRA reference ``qlora.py`` (artidoro/qlora), with its dataclasses' defaults."""
    reader, state = ctx.reader, ctx.state
    model = reader.text("model_name_or_path")
    out = Reading("qlora", model or "EleutherAI/pythia-12b", {}, 1, None, 16, None, "--source_max_len",
                  seq_parts=("--source_max_len", "--target_max_len"))  # the input's and the output's cuts
    if model is None:
        out.defaults["model_name_or_path"] = "EleutherAI/pythia-12b"
    use_bf16, fp16 = training(reader, out, batch=1, accum=16, checkpointing=True, optim="paged_adamw_32bit",
                              bf16=False, max_steps=10000)
    if reader.boolean("full_finetune"):
        raise CommandReadError(f"qlora.py --full_finetune trains every parameter; vramscope plans LoRA and QLoRA "
                               f"runs: drop it, or {HOW_INSTEAD}")
    bits = reader.integer("bits")
    if bits is None:
        out.defaults["bits"] = "4"
        bits = 4
    if bits not in (4, 8, 16, 32):
        raise CommandReadError(f"--bits {bits}: qlora.py takes 4, 8, 16 or 32")
    if bits == 32:
        out.unsupported.append("--bits 32 (an fp32 base) is planned as 16-bit, which is low")
    out.spec["bits"] = min(bits, 16)
    if bits in (4, 8):
        out.memory["quant_method"] = "bnb"
    dq = reader.boolean("double_quant")
    out.spec["double_quant"] = True if dq is None else dq
    out.spec["quant_type"] = reader.text("quant_type") or "nf4"
    # qlora.py: compute_dtype = fp16 if --fp16 else bf16 if --bf16 else fp32 (and the non-4-bit weights with it).
    if fp16 and not use_bf16:
        out.spec["compute_dtype"] = "fp16"
    elif use_bf16:
        out.spec["compute_dtype"] = "bf16"
        # get_accelerate_model casts LoRA, embed_tokens and lm_head back to bf16 after kbit preparation
        out.framework = "qlora"
    else:
        out.spec["compute_dtype"] = "fp32"
        out.defaults["compute dtype"] = "fp32 (no --bf16 or --fp16)"
        out.notes.append("qlora.py without --bf16 or --fp16 computes in fp32: planned in fp32")
    r = reader.integer("lora_r")
    out.spec["lora_r"] = 64 if r is None else r
    a = reader.number("lora_alpha")
    out.spec["lora_alpha"] = 16 if a is None else round(a)
    d = reader.number("lora_dropout")
    out.spec["lora_dropout"] = 0.0 if d is None else d
    if d is None:
        out.defaults["lora_dropout"] = "0.0"
    out.spec["lora_targets"] = None  # find_all_linear_names: every linear layer but lm_head
    out.spec["attn"] = "sdpa"
    source = reader.integer("source_max_len")
    target = reader.integer("target_max_len")
    if source is None:
        out.defaults["source_max_len"] = "1024"
    if target is None:
        out.defaults["target_max_len"] = "256"
    out.seq_len = (source if source is not None else 1024) + (target if target is not None else 256)
    reader.silent("lora_modules")  # qlora.py always targets find_all_linear_names' layers
    from vramscope.commands.common import read_dataset, read_eval

    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder)
    # qlora.py's collator cuts the input and the output apart: the dataset is read the same way.
    out.dataset["source_max_len"] = source if source is not None else 1024
    out.dataset["target_max_len"] = target if target is not None else 256
    fmt = reader.silent("dataset_format")
    if fmt is not None:
        out.dataset["qlora_format"] = fmt
    for name in list(out.dataset.get("names", [])):
        if name in QLORA_HUB_DATASETS and not out.dataset.get("paths"):
            # qlora.py's own dataset names load these hub datasets (its load_data), formatted by the name
            out.dataset["names"] = [QLORA_HUB_DATASETS[name], *out.dataset["names"]]
            if fmt is None and name != "longform":
                out.dataset["qlora_format"] = name
            break
    if reader.boolean("do_mmlu_eval"):
        mmlu = reader.integer("mmlu_source_max_len")
        out.unsupported.append(
            f"--do_mmlu_eval: at each evaluation qlora.py's MMLU callback runs its five-shot prompts, cut at "
            f"--mmlu_source_max_len {mmlu or 2048}{'' if mmlu else ' (its default)'}, with their full fp32 logits: "
            "not planned (the eval phase is planned at the training length)")
    if reader.boolean("group_by_length") is None:  # qlora.py's TrainingArguments default it to True
        out.memory["group_by_length"] = True
        out.defaults["group_by_length"] = "true"
    distributed(reader, state, cfg=ctx.cfg)
    return out


# qlora.py's --dataset names and the hub datasets its load_data() loads for them (artidoro/qlora, qlora.py).
QLORA_HUB_DATASETS = {"alpaca": "tatsu-lab/alpaca", "alpaca-clean": "yahma/alpaca-cleaned", "chip2": "laion/OIG",
                      "self-instruct": "yizhongw/self_instruct", "hh-rlhf": "Anthropic/hh-rlhf",
                      "longform": "akoksal/LongForm", "oasst1": "timdettmers/openassistant-guanaco"}

MODEL_FLAGS = ("model_name_or_path", "model", "model_name", "model_id", "base_model", "pretrained_model_name_or_path",
               "model_path", "model_dir")
SEQ_FLAGS = ("max_seq_length", "max_length", "block_size", "model_max_length", "max_seq_len", "seq_len",
             "sequence_len", "cutoff_len", "max_len")


def looks_like_hf(reader: Reader, script_text: str) -> bool:
    """A script whose flags or source say it is an HfArgumentParser / Trainer script."""
    markers = ("per_device_train_batch_size", "gradient_accumulation_steps", "model_name_or_path")
    return reader.has(*markers) or any(m in script_text for m in ("HfArgumentParser", "TrlParser"))


def looks_like_trl_sft(script_text: str) -> bool:
    """A copy of TRL's sft script: its parser over SFTConfig and ModelConfig."""
    return "SFTConfig" in script_text and "ModelConfig" in script_text and "TrlParser" in script_text


def model_type_of(config: Mapping[str, Any] | None) -> str | None:
    if config is None:
        return None
    text = config.get("text_config")
    if isinstance(text, Mapping) and isinstance(text.get("model_type"), str):
        return str(text["model_type"])
    value = config.get("model_type")
    return value if isinstance(value, str) else None
