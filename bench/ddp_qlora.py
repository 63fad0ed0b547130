"""A real two-rank QLoRA DDP job with vramscope's MemoryMonitor: rank 0's log carries both ranks.

    torchrun --nproc_per_node 2 bench/ddp_qlora.py --out bench/results/ddp-qlora
    torchrun --nproc_per_node 2 bench/ddp_qlora.py --out /tmp/ddp --tiny     # CPU, gloo, tiny model

TinyLlama-1.1B's architecture (from the planner's registry) with random weights, written once by rank 0
while the others wait at a barrier; 4-bit NF4 QLoRA (``vramscope.tune.qlora.load_model``) on
``cuda:LOCAL_RANK``; DDP over NCCL. The ranks train on different lengths (rank 0 4x1024 tokens, rank 1
4x512) so that the report's per-rank peaks differ and the imbalance is visible. Every step is logged
(``every_n_steps=1``), so every step also runs the monitor's all-gather. Rank 0 then writes
``ddp_report.txt``, ``.json`` and ``.html`` beside ``ddp_memory.csv``.

Gradient checkpointing runs non-reentrant (``use_reentrant=False``): the reentrant kind re-runs the
forward inside backward, where DDP sees the LoRA weights' gradients become ready twice and fails
("marked ready twice") unless the graph is declared static. The 4-bit base has no gradients, so
only the LoRA parameters are DDP's; ``find_unused_parameters=False`` because all of them are used.

NCCL: ``NCCL_NVLS_ENABLE=0`` is set before the process group starts unless it is already set (NVLink
SHARP multicast is not available on the lent machines, and NCCL hangs or fails trying it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from vramscope.integrations.loop import MemoryMonitor
from vramscope.planner.registry import get_config
from vramscope.tune.qlora import QLoraSpec, load_model, make_optimizer, write_random_checkpoint

MODEL = "TinyLlama-1.1B"
# The same shape of model, small enough for two CPU processes in seconds.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the checkpoint, the log and the report")
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU with gloo (a check without GPUs)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 30, 6 with --tiny)")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        parser.error("run under torchrun: torchrun --nproc_per_node 2 bench/ddp_qlora.py --out DIR")
    local_rank = int(os.environ["LOCAL_RANK"])
    steps = args.steps or (6 if args.tiny else 30)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.tiny:
        device = "cpu"
        dist.init_process_group("gloo")
    else:
        if not torch.cuda.is_available():
            print("no CUDA here; use --tiny for the CPU check", file=sys.stderr)
            return 2
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
        dist.init_process_group("nccl", device_id=torch.device(device))
    rank, world = dist.get_rank(), dist.get_world_size()

    config = get_config(MODEL)
    if args.tiny:
        config.update(TINY)
    checkpoint = out / ("checkpoint-tiny" if args.tiny else "checkpoint")
    if rank == 0 and not (checkpoint / "config.json").exists():
        write_random_checkpoint(config, checkpoint, device=None if args.tiny else device)
    dist.barrier()  # the others load only once rank 0 has written it

    # Rank 0 trains on twice the tokens of rank 1, so the two ranks' memory differs.
    batch = 2 if args.tiny else 4
    seq_len = (64 if args.tiny else 1024) // (1 + rank)
    spec = QLoraSpec(optim="adamw_torch" if args.tiny else "paged_adamw_32bit")
    log = out / "ddp_memory.csv"
    with MemoryMonitor(log=log, every_n_steps=1, total_steps=steps) as mon:
        model: Any = load_model(checkpoint, spec, device=device)
        # load_model enables HF's default (reentrant) checkpointing; switch to the kind DDP accepts.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        ddp = DistributedDataParallel(
            model, device_ids=None if args.tiny else [local_rank], find_unused_parameters=False
        )
        mon.watch_model(ddp)
        optimizer = make_optimizer(model, spec)
        generator = torch.Generator().manual_seed(rank)
        start = time.perf_counter()
        for step in range(1, steps + 1):
            ids = torch.randint(0, int(config["vocab_size"]), (batch, seq_len), generator=generator).to(device)
            loss = ddp(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mon.step(step)
            if rank == 0 and (step == 1 or step % 10 == 0):
                took = time.perf_counter() - start
                took = time.perf_counter() - start
                print(f"step {step}/{steps} loss {float(loss.detach()):.3f} {took:.1f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()

    if rank == 0:
        report = [sys.executable, "-m", "vramscope", "report", str(log)]
        text = subprocess.run(report, capture_output=True, text=True, env=dict(os.environ, COLUMNS="120"))
        (out / "ddp_report.txt").write_text(text.stdout + text.stderr, encoding="utf-8")
        js = subprocess.run([*report, "--json", "--html", str(out / "ddp_report.html")], capture_output=True, text=True)
        (out / "ddp_report.json").write_text(js.stdout, encoding="utf-8")
        print(text.stdout)
        if text.returncode or js.returncode:
            print(js.stderr, file=sys.stderr)
            return 1
        print(f"{world} ranks; log {log}; report {out / 'ddp_report.txt'} .json .html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
