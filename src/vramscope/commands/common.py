"""Settings every TrainingArguments-shaped program spells alike: evaluation, the dataset, the trainer's lengths,
4-bit in its many spellings, and the settings that change memory beyond the recipe (DoRA, ``modules_to_save``,
Liger, the 4-bit storage dtype, a GPTQ/AWQ base).

Each function fills a :class:`~.programs.Reading` from a :class:`~.argv.Reader`; the program readers call the
ones that apply to them. Evaluation and dataset values are taken silently (they do not shape today's plan) but
are recorded in the typed result for the planner's eval phase and the dataset reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramscope.commands.argv import Reader, to_bool
from vramscope.commands.reading import Reading

# Words for a quantized base that is not bitsandbytes at load time (the model arrives quantized).
PREQUANTIZED = ("gptq", "awq", "hqq", "aqlm", "eetq", "fp8", "mxfp4", "bitnet", "torchao", "quanto")


def read_eval(reader: Reader, out: Reading) -> None:
    """per_device_eval_batch_size, eval_strategy / evaluation_strategy, do_eval, prediction_loss_only,
    eval_accumulation_steps."""
    batch = reader.silent("per_device_eval_batch_size", "per_gpu_eval_batch_size")
    if batch is not None and batch.isdigit():
        out.eval["per_device_eval_batch_size"] = int(batch)
    strategy = reader.silent("eval_strategy", "evaluation_strategy")
    if strategy is not None:
        out.eval["eval_strategy"] = strategy.lower()
    for name in ("do_eval", "prediction_loss_only"):
        word = reader.silent(name)
        if word is not None:
            out.eval[name] = bool(to_bool(word))
    if reader.has("no_do_eval"):
        reader.silent("no_do_eval")
        out.eval["do_eval"] = False
    steps = reader.silent("eval_accumulation_steps")
    if steps is not None and steps.isdigit():
        out.eval["eval_accumulation_steps"] = int(steps)
    word = str(out.eval.get("eval_strategy", "no"))
    if out.eval.get("do_eval") or word not in ("no", "none"):
        # The run evaluates: these flags shape its eval phase, so they are listed with what was read.
        for names in (("eval_strategy", "evaluation_strategy"), ("do_eval",), ("per_device_eval_batch_size",
                      "per_gpu_eval_batch_size"), ("prediction_loss_only",), ("eval_accumulation_steps",)):
            reader.list_as_read(*names)


def read_dataset(reader: Reader, out: Reading, cwd: Path, *names: str) -> None:
    """The dataset the command names: ``dataset_name`` (and ``names``), data files, the text field."""
    found = [w for n in ("dataset_name", "dataset", "datasets", "data_path", *names)
             for w in reader.silent_words(n) if w.lower() not in ("none", "null")]
    files = [w for n in ("data_files", "train_file", "dataset_path") for w in reader.silent_words(n)]
    _add_dataset(out, found, files, cwd)
    field = reader.silent("dataset_text_field")
    if field is not None:
        out.dataset["text_field"] = field
    folder = reader.silent("dataset_dir")
    if folder is not None:
        out.dataset["dataset_dir"] = folder
    split = reader.silent("dataset_train_split")
    if split is not None:
        out.dataset["split"] = split
    if reader.boolean("group_by_length"):  # batches of like lengths: the dataset's longest batch is read so
        out.memory["group_by_length"] = True


def _add_dataset(out: Reading, names: list[str], files: list[str], cwd: Path) -> None:
    for word in names:
        # LLaMA-Factory and ms-swift write several in one value: "alpaca_en,identity", "name#500".
        for name in (w.strip() for w in word.split(",")):
            if name:
                _append(out, "names", name)
                if _local(name.split("#")[0], cwd):
                    _append(out, "paths", name)
    for file in files:
        _append(out, "data_files", file)
        if _local(file, cwd):
            _append(out, "paths", file)


def add_dataset_entries(out: Reading, entries: Any, cwd: Path) -> None:
    """A config file's list of datasets (axolotl's ``datasets: [{path: ..., data_files: ...}]``, TRL's
    ``datasets: [{path: ...}]``)."""
    if not isinstance(entries, list):
        return
    for entry in entries:
        if isinstance(entry, dict):
            path = entry.get("path") or entry.get("id") or entry.get("name")
            if isinstance(path, str):
                _add_dataset(out, [path], [], cwd)
            data_files = entry.get("data_files")
            if isinstance(data_files, str):
                _add_dataset(out, [], [data_files], cwd)
            elif isinstance(data_files, list):
                _add_dataset(out, [], [str(f) for f in data_files], cwd)
        elif isinstance(entry, str):
            _add_dataset(out, [entry], [], cwd)


def _append(out: Reading, key: str, value: str) -> None:
    items = out.dataset.setdefault(key, [])
    if value not in items:
        items.append(value)


def _local(name: str, cwd: Path) -> bool:
    if not name or "://" in name:
        return False
    p = Path(name).expanduser()
    try:
        return (p if p.is_absolute() else cwd / p).exists()
    except OSError:
        return False


def read_memory_extras(reader: Reader, out: Reading) -> None:
    """DoRA, modules_to_save, Liger, the 4-bit storage dtype: read, and named as not modelled."""
    if reader.boolean("use_dora", "peft_use_dora", "lora_use_dora"):
        set_dora(out)
    modules = reader.words("lora_modules_to_save", "modules_to_save", "additional_target")
    if modules and [m.lower() for m in modules] not in (["none"], ["null"], []):
        set_modules_to_save(out, modules)
    if reader.boolean("use_liger_kernel", "use_liger", "enable_liger_kernel", "liger_fused_linear_cross_entropy"):
        set_liger(out)
    storage = reader.text("bnb_4bit_quant_storage", "bnb_4bit_quant_storage_dtype", "quant_storage")
    if storage is not None:
        out.memory["quant_storage"] = _dtype(storage)


def set_dora(out: Reading) -> None:
    out.memory["dora"] = True
    out.unsupported.append("DoRA: the weight-norm pass over every adapted layer is not modelled (it adds memory)")


def set_modules_to_save(out: Reading, modules: list[str]) -> None:
    out.memory["modules_to_save"] = list(modules)
    out.unsupported.append(f"modules_to_save {','.join(modules)}: trained in full beside LoRA (weights, gradients "
                           "and optimizer states at full size), which the plan does not count")


def set_liger(out: Reading) -> None:
    out.memory["liger"] = True
    out.unsupported.append("Liger kernels: the fused cross-entropy never holds the logits; the plan counts them "
                           "(errs high)")


def set_quant_method(out: Reading, method: str) -> None:
    """A base quantized before loading (GPTQ, AWQ, HQQ ...): planned as 4-bit weights, said so."""
    out.memory["quant_method"] = method
    if method != "bnb":
        article = "an" if method[0] in "aehio" else "a"
        out.unsupported.append(f"{article} {method.upper()} base: planned as 4-bit weights with bitsandbytes' layout, "
                               "close but not exact")


def _dtype(word: str) -> str:
    w = word.lower().replace("torch.", "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16"}.get(w, w)


def read_trainer_lengths(reader: Reader, out: Reading) -> None:
    """The trainer's own lengths and generation settings (DPO/KTO/GRPO), where the command gives them."""
    t = out.trainer
    for name in ("max_prompt_length", "max_completion_length", "num_generations", "generation_batch_size"):
        value = reader.integer(name)
        if value is not None:
            t[name] = value
    pre = reader.boolean("precompute_ref_log_probs")
    if pre is not None:
        t["precompute_ref_log_probs"] = pre
    vllm = reader.boolean("use_vllm")
    if vllm is not None:
        t["use_vllm"] = vllm
    mode = reader.text("vllm_mode")
    if mode is not None:
        t["vllm_mode"] = mode
    share = reader.number("vllm_gpu_memory_utilization")
    if share is not None:
        t["vllm_gpu_memory_utilization"] = share
    beta = reader.number("beta")
    if beta is not None:
        t["beta"] = beta


def four_bit_spelling(reader: Reader) -> tuple[int | None, str | None]:
    """``(bits, method)`` from any of the ways programs spell quantization; ``(None, None)`` when none says.

    ``--load_in_4bit`` / ``--use_4bit_quantization True`` (PEFT examples) / ``--q_lora True`` (FastChat) /
    ``--quant_bits 4`` / ``--quant_method bnb`` (ms-swift) / ``quantization_bit: 4`` (LLaMA-Factory) /
    ``--quantization int4|4bit|8bit`` (llama-cookbook) / ``--bits 4`` (qlora.py and copies). ``(16, None)`` when
    the 4-bit switch is read and off.
    """
    four = reader.boolean("load_in_4bit", "use_4bit_quantization", "use_4bit", "q_lora", "qlora")
    if four:
        return 4, "bnb"
    eight = reader.boolean("load_in_8bit", "use_8bit_quantization", "use_8bit")
    if eight:
        return 8, "bnb"
    bits = reader.integer("quant_bits", "quantization_bit", "bits")
    method = reader.text("quant_method", "quantization_method")
    word = reader.text("quantization")
    if word is not None:
        w = word.lower()
        if w in ("false", "none", "no", ""):
            return None, None
        bits = 4 if "4" in w else 8 if "8" in w else bits
        method = method or "bnb"
    method = method.lower() if method else None
    if method is not None and method in PREQUANTIZED:
        return (bits or 4), method
    if bits is not None:
        return bits, (method or "bnb")
    if method == "bnb":
        return 4, "bnb"  # ms-swift's --quant_method bnb without --quant_bits: 4-bit is what people mean
    if four is False:
        return 16, None  # the 4-bit switch is said to be off (--use_4bit_quantization False, or its default)
    return None, method


_PREQUANTIZED_NAMES = (("gptq", "gptq"), ("awq", "awq"), ("bnb-4bit", "bnb"), ("bnb_4bit", "bnb"), ("-int4", "gptq"),
                       ("hqq", "hqq"), ("aqlm", "aqlm"))


def model_name_facts(out: Reading) -> None:
    """What a hub name says by itself: a pre-quantized checkpoint (``...-GPTQ-Int4``, ``...-AWQ``, Unsloth's
    ``...-bnb-4bit``) loads in 4-bit whatever the flags; a ``-VL-`` model has a vision tower."""
    name = (out.model or "").lower()
    if out.spec.get("bits", 16) == 16:
        for marker, method in _PREQUANTIZED_NAMES:
            if marker in name:
                out.spec["bits"] = 4
                out.defaults["bits"] = f"4 (the model {out.model} is a {method.upper()} checkpoint)"
                set_quant_method(out, method)
                break
    if "-vl-" in name or name.endswith("-vl") or "vision" in name or "qwen3-vl" in name or "qwen2.5-vl" in name:
        out.memory["vision"] = True
        out.unsupported.append("a vision-language model: the vision tower and image tokens are not counted")


# What the planner's phases (planner/phases.py: SFT, DPO, KTO, reward, GRPO without vLLM) do not model of a trainer.
_TRAINER_GAPS = {
    "orpo": "ORPO: planned as DPO with the reference precomputed (chosen and rejected in one forward of twice the "
            "rows, no reference model), without ORPO's full [2b, s, V] logits, which is low",
    "ppo": "PPO: the policy, value and reference models and generation are not modelled",
}


def trainer_gaps(out: Reading) -> None:
    """Say what the planner does not model about the trainer, once, whichever reader found it."""
    kind = str(out.trainer.get("kind", "sft"))
    gap = _TRAINER_GAPS.get(kind)
    if gap is not None and not any(u.upper().startswith(gap.split(":")[0].upper()) for u in out.unsupported):
        out.unsupported.append(gap)
