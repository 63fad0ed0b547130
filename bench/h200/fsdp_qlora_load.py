"""Where a 4-bit model's weights land at ``from_pretrained`` under accelerate's FSDP settings (one rank).

The planner's multi-GPU loading (``planner/parallel_loading.py``) rests on a reading of transformers 5's loader:
under FSDP with ``cpu_ram_efficient_loading`` a quantized model is no longer quantized on the GPU and moved to
the host as transformers 4.39+ did (PR 29587): each rank loads the whole 4-bit model onto its own GPU, and only
then is it sharded. One rank under torchrun with accelerate's environment (``ACCELERATE_USE_FSDP``,
``FSDP_CPU_RAM_EFFICIENT_LOADING``) shows which: the device of every parameter right after ``from_pretrained``
and the GPU memory it took, beside the same load without those settings.

Usage: ``torchrun --nproc_per_node 1 bench/h200/fsdp_qlora_load.py OUT.json`` (with or without the two variables).
Random weights from a config (no download); bitsandbytes must be installed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter

import torch
import torch.distributed as dist
import transformers
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig


def main() -> int:
    out = sys.argv[1]
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    from transformers.integrations import is_fsdp_enabled

    config = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=8, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, torch_dtype="bfloat16")
    with tempfile.TemporaryDirectory() as folder:
        with torch.device("cpu"):
            AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(folder)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant, dtype=torch.bfloat16,
                                                     low_cpu_mem_usage=True)
        placed: Counter[str] = Counter()
        for param in model.parameters():
            placed[str(param.device)] += param.numel() * param.element_size()
        result = {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "env": {k: os.environ.get(k) for k in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")},
            "is_fsdp_enabled": bool(is_fsdp_enabled()),
            "param_bytes_by_device": dict(placed),
            "gpu_allocated_after_load_bytes": torch.cuda.memory_allocated() - before,
            "gpu_peak_during_load_bytes": torch.cuda.max_memory_allocated() - before,
            "params": sum(p.numel() for p in model.parameters()),
        }
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
