"""Issue 24 item 8, today's behaviour: does ``vramscope run``'s injected callback change what the training's own
code reads from ``torch.cuda.max_memory_allocated()``?

A tiny HF Trainer (a random 2-layer Llama in bf16, no quantization) whose own callback reads
``torch.cuda.max_memory_allocated()`` and ``memory_allocated()`` at every ``on_step_end`` and once after
``train()`` returns, and writes them to ``--result``. Run it twice, plain and under ``vramscope run``
(bench/h200/whole_run.py does), and compare: a monitor that resets the peak counter makes the program's own
"peak since the start" smaller than it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class OwnReadings(TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.steps: list[dict[str, int]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append({"step": int(state.global_step), "max_allocated": torch.cuda.max_memory_allocated(),
                           "allocated": torch.cuda.memory_allocated()})


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--result", required=True, type=Path)
    ap.add_argument("--out-dir", default="pc-out")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    readings = OwnReadings()
    targs = TrainingArguments(output_dir=args.out_dir, per_device_train_batch_size=4, max_steps=6, bf16=True,
                              logging_steps=1, report_to=[], save_strategy="no", learning_rate=1e-4)
    trainer = Trainer(model=model, args=targs, train_dataset=Rows(32, 512, cfg.vocab_size), callbacks=[readings])
    trainer.train()
    end = {"max_allocated": torch.cuda.max_memory_allocated(), "allocated": torch.cuda.memory_allocated()}
    stats = torch.cuda.memory_stats()
    args.result.write_text(json.dumps({
        "steps": readings.steps, "after_train": end,
        "allocated_bytes.all.peak": stats.get("allocated_bytes.all.peak"),
        "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks]}, indent=1))


if __name__ == "__main__":
    main()
