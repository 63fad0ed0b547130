"""A hand-written QLoRA training loop, the way tutorials write it:

    out = model(input_ids=x, labels=x); out.loss.backward(); opt.step(); opt.zero_grad()

``out`` (the logits, and the KV cache when gradient checkpointing is off) stays alive until the next
forward returns and the name is rebound. The model is prepared the QLoRA way (peft's
``prepare_model_for_kbit_training``, LoRA on every linear layer, paged AdamW 32-bit).

It writes its own per-step ``torch.cuda`` peaks to ``--result`` (JSON); the framework benchmark runs it
under ``vramscope run`` for the process memory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bitsandbytes as bnb
import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": 0}, attn_implementation="sdpa")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=16, lora_dropout=0.05,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    opt = bnb.optim.PagedAdamW32bit([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()
    gen = torch.Generator().manual_seed(0)
    steps = []
    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.steps):
        x = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), generator=gen).cuda()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        steps.append({"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "allocated_after_bytes": torch.cuda.memory_allocated()})
        torch.cuda.reset_peak_memory_stats()
    Path(args.result).write_text(json.dumps({"static_allocated_bytes": static, "steps": steps}))
    print(f"loop_qlora: done, final loss {float(out.loss):.3f}")


if __name__ == "__main__":
    main()
