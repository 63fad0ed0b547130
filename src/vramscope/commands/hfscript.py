"""A user's own script behind ``HfArgumentParser`` / ``TrainingArguments``, read from its flags and its source.

The flags say what the command changes; the script's source (read statically, :mod:`.scripts`) says the rest:
its dataclass defaults, whether it builds TRL's ``SFTTrainer`` / ``DPOTrainer`` (then TRL's framework and
defaults apply, not the HF Trainer's) and how it loads the model (a ``BitsAndBytesConfig`` and ``LoraConfig``
written in it). What neither says is a guess, and a guess of the bits, the rank or the trainer is named in
``assumed``; when it could flip the verdict the other reading is kept as an :class:`~.types.Alternative`.
"""

from __future__ import annotations

from typing import Any

from vramscope.commands.argv import Reader, options_from_mapping
from vramscope.commands.common import (
    four_bit_spelling,
    read_dataset,
    read_eval,
    read_memory_extras,
    read_trainer_lengths,
    set_dora,
    set_modules_to_save,
    set_quant_method,
)
from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.commands.programs import (
    MODEL_FLAGS,
    SEQ_FLAGS,
    attention,
    distributed,
    dtype_word,
    targets_of,
    training,
)
from vramscope.commands.reading import Context, Reading
from vramscope.commands.scripts import ScriptFacts
from vramscope.commands.types import Alternative


def script_defaults(ctx: Context) -> None:
    """The script's own defaults under the command line: dataclass fields, then its config calls' kwargs."""
    facts, name = ctx.script, ctx.target.name
    if facts.config_kwargs:
        ctx.reader.add_defaults(options_from_mapping(facts.config_kwargs, f"{name} code"))
    if facts.dataclass_defaults:
        ctx.reader.add_defaults(options_from_mapping(facts.dataclass_defaults, f"{name} default"))


def read_hf(ctx: Context) -> Reading:
    """A script built on ``HfArgumentParser`` / ``TrainingArguments``: TrainingArguments' defaults for the rest."""
    reader, state, facts = ctx.reader, ctx.state, ctx.script
    script_defaults(ctx)
    trl = facts.builds_trl
    kind = ctx.kind or facts.trainer_kind or "sft"
    out = Reading("hf", reader.text(*MODEL_FLAGS), {}, 8, None, 1, None, None)
    if trl:
        out.framework = "trl"  # the script builds TRL's trainer: its dtypes and fused head
    out.trainer["kind"] = kind
    sft_config = trl and "SFTConfig" in facts.parser_classes
    use_bf16, fp16 = training(reader, out, batch=8, accum=1, checkpointing=sft_config, optim="adamw_torch_fused",
                              bf16=sft_config, max_steps=None)
    if reader.boolean("use_peft", "use_peft_lora") is False or reader.boolean("full_finetune"):
        raise CommandReadError(f"the command trains every parameter; vramscope plans LoRA and QLoRA runs; "
                               f"{HOW_INSTEAD}")
    if not facts.parses:
        out.assumed.append("trainer: the script could not be read; planned as an HF Trainer script")
        out.alternatives.append(Alternative("if the script builds TRL's SFTTrainer", {"framework": "trl"}))
    _bits(reader, out, facts)
    dtype = dtype_word(reader.text("dtype", "torch_dtype", "bnb_4bit_compute_dtype")
                       or _text(facts.bnb.get("bnb_4bit_compute_dtype")))
    out.spec["compute_dtype"] = "fp16" if dtype == "fp16" or (fp16 and not use_bf16) else "bf16"
    if dtype in (None, "fp32") and not use_bf16 and not fp16:
        out.notes.append("no --bf16/--fp16: the script may compute in fp32; planned as bf16, which may be low")
    _lora(reader, out, facts)
    attn = reader.text("attn_implementation", "attn")
    if attn is None and reader.boolean("use_flash_attn", "flash_attn", "use_flash_attention_2"):
        attn = "flash_attention_2"
    if attn is None and isinstance(facts.from_pretrained.get("attn_implementation"), str):
        attn = facts.from_pretrained["attn_implementation"]
    out.spec["attn"] = attention(attn, out.notes)
    for flag in SEQ_FLAGS:
        if reader.has(flag):
            value = reader.integer(flag)
            out.seq_len = value if value is not None and value > 0 else None
            out.seq_flag = f"--{flag}"
            break
    else:
        if sft_config:
            out.seq_len = 1024
            out.defaults["max_length"] = "1024 (SFTConfig)"
            out.seq_flag = "--max_length"
    if reader.boolean("packing"):
        out.memory["packing"] = True
    read_trainer_lengths(reader, out)
    read_eval(reader, out)
    read_dataset(reader, out, ctx.folder)
    distributed(reader, state, cfg=ctx.cfg)
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_SWITCHES = frozenset({"load_in_4bit", "use_4bit_quantization", "use_4bit", "q_lora", "qlora", "load_in_8bit",
                       "use_8bit_quantization", "use_8bit"})


def _bits(reader: Reader, out: Reading, facts: ScriptFacts) -> None:
    bits, method = four_bit_spelling(reader)
    source = None
    literal = facts.bnb.get("load_in_4bit") is True or facts.bnb.get("load_in_8bit") is True
    # A literal load_in_4bit=True in the script's code beats a switch's default, unless that switch is what the
    # literal's `if` tests (examples/hf_trainer_lora.py: `if model_args.load_in_4bit and cuda:`), off here.
    own_switch = bool(_SWITCHES & facts.bnb_gates)
    if bits is None or (bits == 16 and literal and not own_switch):
        bits = None
        for where in (facts.bnb, facts.from_pretrained):
            if where.get("load_in_4bit") is True:
                bits, source = 4, "the script's BitsAndBytesConfig"
            elif where.get("load_in_8bit") is True:
                bits, source = 8, "the script's BitsAndBytesConfig"
        if bits is not None:
            method = "bnb"
            out.defaults["bits"] = f"{bits} ({source})"
    if bits is None:
        # 16-bit for sure only when the script loads the model itself, in sight, with no quantization at all.
        quantizing = {"quantization_config", "load_in_4bit", "load_in_8bit", "**kwargs"} & facts.loader_keys
        says_nothing = facts.loads_model and not facts.bnb_called and not quantizing
        bits = 16
        if says_nothing:
            out.defaults["bits"] = "16 (the script builds no BitsAndBytesConfig)"
        else:
            out.assumed.append("16-bit base: the command does not say how the script loads the model (pass "
                               "--bits 4 before '--' if it loads in 4-bit)")
            out.alternatives.append(Alternative("if the script loads the model in 4-bit", {"bits": 4}))
    if bits not in (4, 8, 16, 32):
        raise CommandReadError(f"{bits}-bit quantization is not planned (4, 8 and 16 are)")
    out.spec["bits"] = min(bits, 16)
    if method is not None and bits < 16:
        set_quant_method(out, method)
    out.spec["quant_type"] = reader.text("bnb_4bit_quant_type", "quant_type") or _text(
        facts.bnb.get("bnb_4bit_quant_type")) or "nf4"
    dq = reader.boolean("double_quant", "use_nested_quant", "use_bnb_nested_quant", "bnb_4bit_use_double_quant")
    if dq is None and isinstance(facts.bnb.get("bnb_4bit_use_double_quant"), bool):
        dq = facts.bnb["bnb_4bit_use_double_quant"]
    out.spec["double_quant"] = True if dq is None else dq
    storage = _text(facts.bnb.get("bnb_4bit_quant_storage"))
    if storage is not None:
        out.memory["quant_storage"] = dtype_word(storage)


def _lora(reader: Reader, out: Reading, facts: ScriptFacts) -> None:
    lora = facts.lora
    flags = reader.has("lora_r", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules", "target_modules")
    r = reader.integer("lora_r", "lora_rank")
    if r is None and isinstance(lora.get("r"), int):
        r = lora["r"]
        out.defaults["lora_r"] = f"{r} (the script's LoraConfig)"
    out.spec["lora_r"] = 64 if r is None else r
    if r is None:
        out.assumed.append("LoRA rank: the command and the script do not say; planned as r=64 on every linear "
                           "layer (the QLoRA reference)")
    a = reader.number("lora_alpha")
    if a is None and isinstance(lora.get("lora_alpha"), (int, float)):
        a = lora["lora_alpha"]
    out.spec["lora_alpha"] = 16 if a is None else round(a)
    d = reader.number("lora_dropout")
    if d is None and isinstance(lora.get("lora_dropout"), (int, float)):
        d = lora["lora_dropout"]
    out.spec["lora_dropout"] = 0.05 if d is None else d
    words = reader.words("lora_target_modules", "target_modules")
    if words is None and lora.get("target_modules") is not None:
        value = lora["target_modules"]
        words = [value] if isinstance(value, str) else [str(v) for v in value]
    out.spec["lora_targets"] = targets_of(words)
    if not flags and not lora:
        out.notes.append("no LoRA flags: planned with the QLoRA reference's LoRA (r=64 on every linear layer)")
    read_memory_extras(reader, out)
    if lora.get("use_dora") is True and not out.memory.get("dora"):
        set_dora(out)
    saved = lora.get("modules_to_save")
    if isinstance(saved, list) and saved and not out.memory.get("modules_to_save"):
        set_modules_to_save(out, [str(m) for m in saved])
