"""A short, real LoRA fine-tune of a tiny randomly initialised Llama: the README's main job.

transformers + peft with the HF Trainer. On a CUDA GPU the base model is loaded in 4-bit NF4 through
bitsandbytes (QLoRA, paged AdamW); on a CPU it stays in fp32 with plain AdamW. Run it under the monitor:

    vramscope run --log out/demo_memory.csv -- python examples/train_tiny_lora.py
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from vramscope.recipe import QLoraSpec
from vramscope.tune.qlora import load_model, write_random_checkpoint

TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 1024,
}


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences of varying length: memory depends on shapes, not on text."""

    def __init__(self, count: int, vocab: int, max_len: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.items = [
            torch.randint(
                0, vocab, (int(torch.randint(max_len // 2, max_len + 1, (1,), generator=gen)),), generator=gen
            )
            for _ in range(count)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.items[i]}


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    longest = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, item in enumerate(batch):
        ids[row, : len(item["input_ids"])] = item["input_ids"]
        mask[row, : len(item["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_random_checkpoint(TINY_LLAMA, Path(tmp) / "tiny-llama", device="cuda" if cuda else None)
        spec = QLoraSpec(lora_r=16, lora_alpha=32, optim="paged_adamw_32bit" if cuda else "adamw_torch")
        model = load_model(checkpoint, spec)
        model.print_trainable_parameters()
        training_args = TrainingArguments(
            output_dir=str(Path(tmp) / "out"),
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=2e-4,
            logging_steps=10,
            save_strategy="no",
            report_to=[],
            optim=spec.optim,
            bf16=cuda,
            use_cpu=not cuda,
            dataloader_num_workers=0,
        )
        data = RandomTokens(count=args.steps * args.batch_size, vocab=TINY_LLAMA["vocab_size"], max_len=args.seq_len)
        trainer = Trainer(model=model, args=training_args, train_dataset=data, data_collator=collate)
        result = trainer.train()
        print(f"trained {result.global_step} steps, final loss {result.training_loss:.3f}")


if __name__ == "__main__":
    main()
