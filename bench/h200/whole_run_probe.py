"""What each whole-run truth point really ran: a launcher that starts a training program unchanged and records,
from inside it, the checks the issue asks for (issue 28: "check that each truth run measured what you meant").

    python bench/h200/whole_run_probe.py -m trl.scripts.sft -- --model_name_or_path DIR ...
    python bench/h200/whole_run_probe.py --qlora-shims path/to/qlora.py -- --model_name_or_path DIR ...

At ``Trainer.train`` (TRL's trainers inherit it) it writes ``$WR_CHECKS`` (JSON): the module classes of the
model (``Linear4bit`` count, ``Params4bit`` count), parameter dtypes (trainable and frozen), the attention
implementation, gradient checkpointing, the trainer's settings that decide memory (batch sizes, eval settings,
TRL's max_length / num_generations / beta / precompute_ref_log_probs ...), the LoRA config, the token lengths of
the tokenized train and eval datasets (after the trainer's own tokenization and truncation), and the logits'
dtype and shape of the first training and evaluation forward. Around every ``generate`` (GRPO without vLLM) it
records the allocator's peak of that call alone (``torch.cuda.reset_peak_memory_stats`` before, so the
generation's peak is its own); the training program's own code is not touched.

``--qlora-shims`` lets artidoro/qlora's ``qlora.py`` (written for transformers 4.3x) run under transformers 5,
with the least change, at run time, never in its text: (1) ``evaluate`` is missing on the H200 image and cannot
download its ``accuracy`` metric offline: a stand-in module whose ``load("accuracy")`` computes the plain
accuracy qlora.py's MMLU callback asks for; (2) ``from_pretrained`` no longer takes ``load_in_4bit`` /
``load_in_8bit`` / ``use_auth_token`` beside a ``quantization_config`` (TypeError in the model's __init__): they
are dropped (the quantization_config that qlora.py passes says the same); (3) ``Seq2SeqTrainer(tokenizer=...)``
became ``processing_class=``; (4) ``tokenizer._pad_token`` (which qlora.py tests) is gone: read as
``pad_token``; (5) transformers 5's TrainingArguments has its own ``use_cache``, which qlora.py's
GenerationArguments declares again (argparse: conflicting option strings): the second is skipped. Each shim
that fired is listed in the checks file.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

CHECKS: dict[str, Any] = {"shims": [], "generate_calls": [], "forwards": {}}
LENGTH_COLUMNS = ("input_ids", "prompt_input_ids", "chosen_input_ids", "rejected_input_ids", "completion_input_ids")


def _write() -> None:
    path = os.environ.get("WR_CHECKS")
    if not path:
        return
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(CHECKS, indent=1, default=str))
    os.replace(tmp, path)


def _is_ids(column: str) -> bool:
    return column in LENGTH_COLUMNS or column.endswith("_ids") or column == "input_ids"


def _lengths(dataset: Any) -> dict[str, Any]:
    """Token lengths of each tokenized column, with the five longest examples (index, tokens)."""
    out: dict[str, Any] = {}
    if dataset is None:
        return out
    names = getattr(dataset, "column_names", None)
    if names is None:  # a torch Dataset of dicts (whole_run_hf.py's): read its rows
        try:
            rows = [dataset[i] for i in range(len(dataset))]
        except Exception as exc:
            return {"error": repr(exc)[:200]}
        names = list(rows[0]) if rows else []
        columns = {c: [len(r[c]) for r in rows] for c in names if _is_ids(c)}
    else:
        columns = {c: [len(x) for x in dataset[c]] for c in names if _is_ids(c)}
        out["columns"] = list(names)
    for col, lens in columns.items():
        s = sorted(lens)
        top = sorted(((n, i) for i, n in enumerate(lens)), reverse=True)[:5]
        out[col] = {"n": len(s), "min": s[0], "p50": s[len(s) // 2], "p99": s[min(len(s) - 1, int(len(s) * .99))],
                    "max": s[-1], "sum": sum(s), "longest": [{"index": i, "tokens": n} for n, i in top]}
    return out


def _model_checks(model: Any) -> dict[str, Any]:
    classes = Counter(type(m).__name__ for m in model.modules())
    params4 = 0
    dtypes: dict[str, dict[str, int]] = {"trainable": {}, "frozen": {}}
    for p in model.parameters():
        if type(p).__name__ == "Params4bit":
            params4 += 1
        kind = "trainable" if p.requires_grad else "frozen"
        key = str(p.dtype).replace("torch.", "")
        dtypes[kind][key] = dtypes[kind].get(key, 0) + p.numel()
    config = getattr(model, "config", None)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    quant = getattr(getattr(base, "config", None), "quantization_config", None)
    peft: dict[str, Any] = {}
    for name, cfg in (getattr(model, "peft_config", None) or {}).items():
        peft[name] = {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
                      "target_modules": sorted(cfg.target_modules) if cfg.target_modules else None}
    return {
        "model_class": type(model).__name__, "base_class": type(base).__name__,
        "linear4bit_modules": classes.get("Linear4bit", 0), "linear8bit_modules": classes.get("Linear8bitLt", 0),
        "lora_layers": sum(1 for m in model.modules() if len(getattr(m, "lora_A", None) or {}) > 0),
        "params4bit": params4, "param_dtypes": dtypes,
        "attn_implementation": getattr(config, "_attn_implementation", None),
        "gradient_checkpointing": bool(getattr(base, "is_gradient_checkpointing", False)),
        "quantization_config": quant.to_dict() if hasattr(quant, "to_dict") else quant,
        "model_type": getattr(config, "model_type", None), "vocab_size": getattr(config, "vocab_size", None),
        "tie_word_embeddings": getattr(config, "tie_word_embeddings", None), "peft": peft,
        "module_class_counts": {k: v for k, v in classes.most_common(25)},
    }


ARG_FIELDS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
              "max_steps", "num_train_epochs", "eval_strategy", "eval_steps", "prediction_loss_only",
              "eval_accumulation_steps", "save_strategy", "save_steps", "logging_steps", "optim", "bf16", "fp16",
              "gradient_checkpointing", "gradient_checkpointing_kwargs", "group_by_length", "train_sampling_strategy",
              "learning_rate",
              "max_length", "max_prompt_length", "max_completion_length", "packing", "padding_free",
              "num_generations", "generation_batch_size", "steps_per_generation", "beta", "loss_type",
              "precompute_ref_log_probs", "precompute_ref_batch_size", "truncation_mode", "use_vllm",
              "dataset_text_field", "completion_only_loss", "assistant_only_loss", "remove_unused_columns",
              "dataloader_num_workers", "torch_compile", "predict_with_generate")


def _trainer_checks(trainer: Any) -> dict[str, Any]:
    args = trainer.args
    out: dict[str, Any] = {"trainer_class": type(trainer).__name__}
    out["args"] = {f: getattr(args, f) for f in ARG_FIELDS if hasattr(args, f)}
    out["compute_metrics"] = getattr(trainer, "compute_metrics", None) is not None
    out["preprocess_logits_for_metrics"] = getattr(trainer, "preprocess_logits_for_metrics", None) is not None
    out["train_lengths"] = _lengths(getattr(trainer, "train_dataset", None))
    eval_ds = getattr(trainer, "eval_dataset", None)
    out["eval_lengths"] = _lengths(eval_ds) if not isinstance(eval_ds, dict) else {
        k: _lengths(v) for k, v in eval_ds.items()}
    out["ref_model"] = type(getattr(trainer, "ref_model", None)).__name__
    return out


def _watch_forward(model: Any) -> None:
    """The logits' dtype and shape of the first forward in train mode and the first in eval mode."""

    def hook(module: Any, inputs: Any, kwargs: Any, output: Any) -> None:
        mode = "train" if module.training else "eval"
        if mode in CHECKS["forwards"]:
            return
        logits = getattr(output, "logits", None)
        if logits is None and isinstance(output, dict):
            logits = output.get("logits")
        ids = kwargs.get("input_ids", inputs[0] if inputs else None)
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        CHECKS["forwards"][mode] = {"logits_dtype": str(getattr(logits, "dtype", None)),
                                    "logits_shape": list(logits.shape) if logits is not None else None,
                                    "input_shape": list(ids.shape) if hasattr(ids, "shape") else None,
                                    "gradient_checkpointing": bool(getattr(base, "is_gradient_checkpointing", False)),
                                    "use_cache": getattr(getattr(base, "config", None), "use_cache", None)}
        _write()

    try:
        model.register_forward_hook(hook, with_kwargs=True)
    except Exception as exc:  # the probe never stops the run
        CHECKS["forward_hook_error"] = repr(exc)[:200]


def _patch_train() -> None:
    import torch
    from transformers import Trainer

    original = Trainer.train

    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            CHECKS["model"] = _model_checks(self.model)
            CHECKS["trainer"] = _trainer_checks(self)
            CHECKS["allocated_at_train_begin"] = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
            CHECKS["train_begin_unix"] = time.time()
            _watch_forward(self.model)
            _write()
        except Exception as exc:
            CHECKS["checks_error"] = repr(exc)[:300]
            _write()
        result = original(self, *args, **kwargs)
        if torch.cuda.is_available():
            CHECKS["after_train"] = {"allocated": torch.cuda.memory_allocated(),
                                     "max_allocated_since_reset": torch.cuda.max_memory_allocated()}
        _write()
        return result

    Trainer.train = train  # type: ignore[method-assign]


def _patch_generate() -> None:
    import torch
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not torch.cuda.is_available():
            return original(self, *args, **kwargs)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        out = original(self, *args, **kwargs)
        torch.cuda.synchronize()
        ids = kwargs.get("input_ids", args[0] if args else None)
        seqs = getattr(out, "sequences", out)
        CHECKS["generate_calls"].append({
            "allocated_before": before, "peak_allocated": torch.cuda.max_memory_allocated(),
            "allocated_after": torch.cuda.memory_allocated(), "seconds": round(time.perf_counter() - started, 2),
            "input_shape": list(ids.shape) if hasattr(ids, "shape") else None,
            "output_shape": list(seqs.shape) if hasattr(seqs, "shape") else None})
        if len(CHECKS["generate_calls"]) <= 3 or len(CHECKS["generate_calls"]) % 4 == 0:
            _write()
        return out

    GenerationMixin.generate = generate  # type: ignore[method-assign]


class _TolerantNamespace(argparse.Namespace):
    def __delattr__(self, name: str) -> None:
        if name in self.__dict__:
            super().__delattr__(name)


class _Accuracy:
    def compute(self, references: list[int], predictions: list[int]) -> dict[str, float]:
        pairs = list(zip(references, predictions, strict=True))
        return {"accuracy": sum(r == p for r, p in pairs) / len(pairs) if pairs else 0.0}


def _qlora_shims() -> None:
    try:
        import evaluate  # noqa: F401 - the real one, where installed
    except ImportError:
        stub = types.ModuleType("evaluate")

        def load(name: str, *args: Any, **kwargs: Any) -> _Accuracy:
            if name != "accuracy":
                raise ValueError(f"the evaluate stand-in knows only 'accuracy', not {name!r}")
            return _Accuracy()

        stub.load = load  # type: ignore[attr-defined]
        sys.modules["evaluate"] = stub
        CHECKS["shims"].append("evaluate: stand-in module (load('accuracy') = plain accuracy)")
    import transformers

    auto = transformers.AutoModelForCausalLM
    original_fp = auto.from_pretrained.__func__  # type: ignore[attr-defined]

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        dropped = [k for k in ("load_in_4bit", "load_in_8bit", "use_auth_token") if k in kwargs]
        for k in dropped:
            kwargs.pop(k)
        if dropped:
            CHECKS["shims"].append(f"from_pretrained: dropped {dropped} (quantization_config kept)")
        return original_fp(cls, *args, **kwargs)

    auto.from_pretrained = classmethod(from_pretrained)  # type: ignore[assignment]
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    if not hasattr(PreTrainedTokenizerBase, "_pad_token"):
        # qlora.py asks `tokenizer._pad_token is None`; transformers 5 keeps no such attribute (AttributeError)
        PreTrainedTokenizerBase._pad_token = property(lambda self: self.pad_token)  # type: ignore[attr-defined]
        CHECKS["shims"].append("tokenizer._pad_token: read as tokenizer.pad_token")
    parser_cls = transformers.HfArgumentParser
    original_field = parser_cls._parse_dataclass_field

    def parse_field(parser: Any, fld: Any) -> None:
        # transformers 5's TrainingArguments gained `use_cache`, which qlora.py's GenerationArguments also
        # declares: argparse refuses the second --use_cache. The first (TrainingArguments', default False)
        # is kept for both, which is what training used before (GenerationArguments' is for generation only).
        if f"--{fld.name}" in getattr(parser, "_option_string_actions", {}):
            CHECKS["shims"].append(f"HfArgumentParser: second --{fld.name} skipped (the first one kept)")
            return
        original_field(parser, fld)

    parser_cls._parse_dataclass_field = staticmethod(parse_field)  # type: ignore[method-assign,assignment]
    original_known = parser_cls.parse_known_args

    def parse_known_args(self: Any, *args: Any, **kwargs: Any) -> Any:
        # ... and the second dataclass then finds the name already taken off the namespace: it keeps its own
        # default (GenerationArguments.use_cache=True, for generation), as under transformers 4.
        namespace, rest = original_known(self, *args, **kwargs)
        return _TolerantNamespace(**vars(namespace)), rest

    parser_cls.parse_known_args = parse_known_args  # type: ignore[method-assign]
    seq2seq = transformers.Seq2SeqTrainer
    original_init = seq2seq.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if "tokenizer" in kwargs:
            kwargs["processing_class"] = kwargs.pop("tokenizer")
            CHECKS["shims"].append("Seq2SeqTrainer: tokenizer= passed as processing_class=")
        original_init(self, *args, **kwargs)

    seq2seq.__init__ = init  # type: ignore[method-assign]


def install(qlora_shims: bool = False) -> None:
    if qlora_shims:
        _qlora_shims()
    _patch_train()
    _patch_generate()
    atexit.register(_write)


def main() -> None:
    argv = sys.argv[1:]
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", dest="module", default=None)
    ap.add_argument("--qlora-shims", action="store_true")
    ap.add_argument("script", nargs="?", default=None)
    args = ap.parse_args(argv)
    CHECKS["argv"] = rest
    install(args.qlora_shims)
    if args.module:
        sys.argv = [args.module, *rest]
        runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [args.script, *rest]
        sys.path.insert(0, str(Path(args.script).resolve().parent))
        runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
