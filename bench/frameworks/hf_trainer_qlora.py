"""A QLoRA fine-tune through the HF ``Trainer``, written the way the QLoRA reference recipe (qlora.py) and
most HF-Trainer scripts do it: NF4 + double quantization with bf16 compute, peft's
``prepare_model_for_kbit_training``, LoRA on every linear layer, paged AdamW 32-bit, bf16 mixed precision.

It knows nothing of vramscope: the framework benchmark (bench/framework_measure.py) runs it under
``vramscope run``, whose zero-code callback writes the step log the measurement is read from.

    python bench/frameworks/hf_trainer_qlora.py --model DIR --batch 4 --seq 1024 [--no-gradient-checkpointing]
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments


class FixedLengthTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token sequences of one length: memory depends on the shapes, not on the text."""

    def __init__(self, vocab: int, seq: int, count: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (count, seq), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        ids = self.ids[i]
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--optim", default="paged_adamw_32bit")
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": 0}, attn_implementation="sdpa")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    lora = LoraConfig(r=args.lora_r, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear",
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    data = FixedLengthTokens(model.config.vocab_size, args.seq, args.batch * (args.steps + 1))
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
            max_steps=args.steps, learning_rate=2e-4, lr_scheduler_type="constant", bf16=True,
            gradient_checkpointing=args.gradient_checkpointing, optim=args.optim, logging_steps=1,
            save_strategy="no", report_to=[], remove_unused_columns=False, dataloader_num_workers=0,
        )
        Trainer(model=model, args=targs, train_dataset=data).train()
    print("hf_trainer_qlora: done")


if __name__ == "__main__":
    main()
