"""Measure real QLoRA steps over a grid of shapes: the ground truth the planner is held against.

For each architecture a random-weight checkpoint is written from its registry config, loaded the QLoRA
way (src/vramscope/tune/qlora.py), and for each (optimizer, gradient checkpointing, batch, sequence length)
a fresh optimizer runs three real steps. Recorded per point:

- ``peak_allocated_bytes`` / ``peak_reserved_bytes``: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
  over the three steps (peak counters reset before them, cache emptied).
- ``process_bytes``: the highest NVML reading of this process's GPU memory while the steps ran, sampled at
  20 Hz by vramscope's own Sampler and at every step end (what nvidia-smi shows for the process).
- ``weights_allocated_bytes``: allocated after loading, before any step.

Run on a GPU:  python bench/planner_measure.py --out OUT [--archs A,B] [--quick]
On a CPU, ``--tiny`` runs one tiny model through the same code to prove the harness works.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.tune.qlora import QLoraSpec, load_model, make_optimizer, write_random_checkpoint

FIELDS = [
    "arch",
    "batch_size",
    "seq_len",
    "gradient_checkpointing",
    "optim",
    "bits",
    "lora_r",
    "status",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "process_bytes",
    "weights_allocated_bytes",
    "weights_reserved_bytes",
    "step_seconds",
    "device",
    "torch",
    "transformers",
    "peft",
    "bitsandbytes",
    "date",
]

# (gradient checkpointing, batch, seq) per optimizer. Few optimizer variants: states scale with LoRA size only.
GRID: dict[str, list[tuple[bool, int, int]]] = {
    "paged_adamw_32bit": [
        (True, 1, 512),
        (True, 4, 512),
        (True, 1, 2048),
        (True, 4, 1024),
        (True, 8, 1024),
        (True, 2, 4096),
        (False, 1, 512),
        (False, 4, 1024),
        (False, 2, 2048),
    ],
    "adamw_torch": [(True, 4, 1024), (False, 1, 512)],
    "paged_adamw_8bit": [(True, 4, 1024)],
}
QUICK_GRID: dict[str, list[tuple[bool, int, int]]] = {
    "paged_adamw_32bit": [(True, 1, 512), (True, 4, 1024), (False, 2, 1024)],
    "adamw_torch": [(True, 4, 1024)],
}
DEFAULT_ARCHS = ["TinyLlama-1.1B", "Qwen2.5-1.5B", "Llama-2-7B", "Mistral-7B", "Llama-3-8B"]
TINY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
}


def versions() -> dict[str, str]:
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}
    for name in ("peft", "bitsandbytes"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = ""
    out["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return out


def measure_point(
    model: Any, spec: QLoraSpec, batch: int, seq: int, vocab: int, sampler: Sampler | None
) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    if spec.gradient_checkpointing:
        model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    else:
        model.base_model.model.gradient_checkpointing_disable()
    optimizer = make_optimizer(model, spec)
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(batch * 100_003 + seq)
    process_peak = 0
    status = "ok"
    wall_start = time.time()
    started = time.perf_counter()
    steps = 0
    try:
        for _ in range(3):
            ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, ids
            if cuda:
                torch.cuda.synchronize()
            steps += 1
            if sampler is not None:
                sample = sampler.sample_now()
                process_peak = max(process_peak, sample.process_bytes(0) or 0)
    except torch.OutOfMemoryError:
        status = "oom"
    elapsed = (time.perf_counter() - started) / max(steps, 1)
    if sampler is not None:
        for sample in list(sampler.history):
            if sample.time >= wall_start:
                process_peak = max(process_peak, sample.process_bytes(0) or 0)
    row = {
        "status": status,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else "",
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else "",
        "process_bytes": process_peak or "",
        "step_seconds": round(elapsed, 4),
    }
    del optimizer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def run_arch(
    arch: str,
    config: dict[str, Any],
    grid: dict[str, list[tuple[bool, int, int]]],
    root: Path,
    writer: csv.DictWriter,
    out_file: Any,
    env: dict[str, str],
    sampler: Sampler | None,
) -> None:
    import torch

    ckpt = root / arch
    t0 = time.time()
    write_random_checkpoint(config, ckpt, device="cuda" if torch.cuda.is_available() else None)
    base = QLoraSpec()
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    model = load_model(ckpt, base)
    weights_alloc = torch.cuda.memory_allocated() if torch.cuda.is_available() else ""
    weights_res = torch.cuda.memory_reserved() if torch.cuda.is_available() else ""
    print(f"[{arch}] checkpoint + load {time.time() - t0:.1f} s, weights {weights_alloc}", flush=True)
    vocab = int(config["vocab_size"])
    for optim, points in grid.items():
        for gckpt, batch, seq in points:
            spec = base.with_(optim=optim, gradient_checkpointing=gckpt)
            t1 = time.time()
            row = measure_point(model, spec, batch, seq, vocab, sampler)
            row.update(
                arch=arch,
                batch_size=batch,
                seq_len=seq,
                gradient_checkpointing=int(gckpt),
                optim=optim,
                bits=spec.bits,
                lora_r=spec.lora_r,
                weights_allocated_bytes=weights_alloc,
                weights_reserved_bytes=weights_res,
                date=env["date"],
                **{k: env[k] for k in ("device", "torch", "transformers", "peft", "bitsandbytes")},
            )
            writer.writerow(row)
            out_file.flush()
            print(
                f"[{arch}] {optim} gc={int(gckpt)} b={batch} s={seq}: {row['status']} "
                f"alloc={row['peak_allocated_bytes']} res={row['peak_reserved_bytes']} "
                f"proc={row['process_bytes']} ({time.time() - t1:.1f} s)",
                flush=True,
            )
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    shutil.rmtree(ckpt, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--archs", default=",".join(DEFAULT_ARCHS))
    parser.add_argument("--quick", action="store_true", help="a few points per architecture")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny model")
    parser.add_argument(
        "--ckpt-root", default="/dev/shm/vramscope-ckpt" if os.path.isdir("/dev/shm") else "/tmp/vs-ckpt"
    )
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = versions()
    env["date"] = datetime.now(timezone.utc).date().isoformat()
    (out / "planner_env.json").write_text(json.dumps(env, indent=2))
    root = Path(args.ckpt_root)
    root.mkdir(parents=True, exist_ok=True)
    nvml = NvmlBackend()
    sampler = None
    if nvml.is_available():
        sampler = Sampler(Collector(nvml=nvml, host=HostBackend()), interval=0.05, history=2000).start()
    with open(out / "h200_measurements.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        if args.tiny:
            run_arch(
                "tiny", TINY_CONFIG, {"adamw_torch": [(True, 2, 32), (False, 2, 32)]}, root, writer, f, env, sampler
            )
        else:
            from vramscope.planner.registry import get_config

            for arch in args.archs.split(","):
                try:
                    run_arch(arch, get_config(arch), QUICK_GRID if args.quick else GRID, root, writer, f, env, sampler)
                except Exception as exc:
                    print(f"[{arch}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if sampler is not None:
        sampler.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
