"""An HF ``Trainer`` QLoRA run over a local token-id dataset, with evaluation, checkpoint saves and epochs: the
whole run, the way qlora.py-style scripts write it (NF4 + double quantization, bf16 compute, peft's
``prepare_model_for_kbit_training``, LoRA on every linear layer, paged AdamW 32-bit, bf16 mixed precision).

It knows nothing of vramscope: the whole-run truth (bench/h200/whole_run.py) runs it under ``vramscope run``,
whose injected callback writes the step log (train and eval phases) the measurement is read from.

    python bench/h200/whole_run_hf.py --model DIR --data FOLDER --batch 2 --eval logits --eval-batch 4 \
        --eval-steps 2 --max-steps 4

``--eval``: ``none``; ``loss`` (``prediction_loss_only=True``); ``logits`` (a ``compute_metrics``, so the
Trainer keeps every eval batch's logits, gathered on the GPU until the loop ends, ``eval_accumulation_steps``
unset); ``argmax`` (``preprocess_logits_for_metrics`` keeps only each position's argmax). Batches are padded to
the longest of the batch (``DataCollatorForSeq2Seq``, labels padded with -100).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import whole_run_probe  # the checks, installed before transformers builds anything

whole_run_probe.install()

import torch  # noqa: E402
import whole_run_snapshot  # noqa: E402  (the pool's segments, when WR_SNAPSHOT_DIR asks for them)
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    DataCollatorForSeq2Seq,
    Trainer,
    TrainingArguments,
)


class TokenRows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """JSON lines of ``input_ids``; labels are the inputs (a causal LM), truncated at ``max_len``."""

    def __init__(self, path: Path, max_len: int | None) -> None:
        self.rows = [json.loads(line)["input_ids"][:max_len] for line in path.open()]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.rows[i]
        return {"input_ids": ids, "labels": list(ids), "attention_mask": [1] * len(ids)}


def sampling(group_by_length: bool) -> dict[str, Any]:
    """transformers 5.17 says ``group_by_length``, later 5.x ``train_sampling_strategy="group_by_length"``."""
    if not group_by_length:
        return {}
    fields = TrainingArguments.__dataclass_fields__
    return {"group_by_length": True} if "group_by_length" in fields else {"train_sampling_strategy": "group_by_length"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, type=Path, help="a folder with train.jsonl (and test.jsonl)")
    ap.add_argument("--output-dir", default="hf-out")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--eval-batch", type=int, default=8)
    ap.add_argument("--eval", choices=("none", "loss", "logits", "argmax"), default="none")
    ap.add_argument("--eval-steps", type=int, default=2)
    ap.add_argument("--save-steps", type=int, default=0, help="0: no checkpoint saves")
    ap.add_argument("--max-steps", type=int, default=-1)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--lora-alpha", type=int, default=16)
    # 0 for fused 3-D experts: peft's ParamWrapper refuses any other dropout (Mixtral under transformers 5).
    ap.add_argument("--lora-dropout", type=float, default=0.05)
    ap.add_argument("--optim", default="paged_adamw_32bit")
    ap.add_argument("--group-by-length", action="store_true")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()

    gpu = torch.cuda.is_available()  # without one (a CPU smoke run): no quantization, float32, nothing measured
    snapshots = whole_run_snapshot.start_recording()
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16) if gpu else None
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=quant,
                                                 dtype=torch.bfloat16 if gpu else torch.float32,
                                                 device_map={"": 0} if gpu else None, attn_implementation="sdpa")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = TokenRows(args.data / "train.jsonl", args.max_len)
    test = TokenRows(args.data / "test.jsonl", args.max_len) if args.eval != "none" else None
    kwargs: dict[str, Any] = {}
    if args.eval == "logits":
        kwargs["compute_metrics"] = lambda p: {"eval_predictions": float(len(p.predictions))}
    if args.eval == "argmax":
        kwargs["preprocess_logits_for_metrics"] = lambda logits, labels: logits.argmax(dim=-1)
        kwargs["compute_metrics"] = lambda p: {"eval_predictions": float(len(p.predictions))}
    targs = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch, per_device_eval_batch_size=args.eval_batch,
        gradient_accumulation_steps=1, max_steps=args.max_steps, num_train_epochs=args.epochs, learning_rate=2e-4,
        lr_scheduler_type="constant", bf16=gpu, use_cpu=not gpu, gradient_checkpointing=args.gradient_checkpointing,
        optim=args.optim if gpu else "adamw_torch", logging_steps=1, report_to=[], remove_unused_columns=False,
        dataloader_num_workers=0,
        eval_strategy="no" if args.eval == "none" else "steps", eval_steps=args.eval_steps,
        prediction_loss_only=args.eval == "loss", save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500, **sampling(args.group_by_length),
    )
    collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, padding="longest")
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=test, data_collator=collator,
                      **kwargs)
    if snapshots is not None:
        trainer.add_callback(whole_run_snapshot.SegmentSnapshots(snapshots))
    trainer.train()
    print("whole_run_hf: done", flush=True)


if __name__ == "__main__":
    main()
