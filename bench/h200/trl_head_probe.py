"""Which tensors are alive at the peak of TRL's fused-LM-head step on a tiny model (1x1024 vs 8x1024 tokens).

Why: on a tiny random Llama (h 512, vocab 8000) the planner's TRL step memory is 2x low at <= 4096 tokens and right
at 8192 (bench/results/calibrate/trl_probe_h200_2026-12-01.txt). This records the allocator's history over one step
and prints the largest blocks alive at the peak with the Python frames that made them.
"""
from __future__ import annotations

import tempfile

import torch

from vramscope.recipe import QLoraSpec
from vramscope.tune.qlora import Trainer, load_model, make_optimizer, write_random_checkpoint

config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "max_position_embeddings": 4096}
spec = QLoraSpec(framework="trl")
print("triton:", end=" ")
try:
    import triton  # noqa: F401
    print("yes")
except ImportError:
    print("no")
with tempfile.TemporaryDirectory() as tmp:
    write_random_checkpoint(config, tmp, device="cuda")
    model = load_model(tmp, spec)
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = make_optimizer(model, spec)
    trainer = Trainer(model=model, optimizer=opt, vocab_size=8000, device=torch.device("cuda"), spec=spec)
    trainer.step(1, 128)
    for batch, seq in [(1, 1024), (8, 1024)]:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        trainer.step(batch, seq)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated()
        print(f"== {batch}x{seq}: peak {peak / 2**20:.1f} MiB, before {base / 2**20:.1f} MiB")
        # replay the trace to the peak
        live: dict[int, tuple[int, list]] = {}
        cur = best = 0
        best_live: dict[int, tuple[int, list]] = {}
        for dev in snap["device_traces"]:
            for ev in dev:
                if ev["action"] == "alloc":
                    live[ev["addr"]] = (ev["size"], ev.get("frames", []))
                    cur += ev["size"]
                    if cur > best:
                        best, best_live = cur, dict(live)
                elif ev["action"] == "free_completed" and ev["addr"] in live:
                    cur -= live.pop(ev["addr"])[0]
        blocks = sorted(best_live.values(), key=lambda x: -x[0])[:8]
        print(f"   traced rise at peak {best / 2**20:.1f} MiB; largest new blocks alive then:")
        for size, frames in blocks:
            where = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames
                     if f["filename"].endswith(".py")][:4]
            print(f"   {size / 2**20:8.2f} MiB  {' < '.join(where)}")
