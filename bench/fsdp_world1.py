"""A strategy's per-rank memory at world size 1, measured on one GPU, against the distributed plan.

One GPU cannot show what N ranks share, but it can show what a strategy's wrapper adds to a rank: DDP's
gradient buckets, FSDP's gathered units and root, NCCL's one-rank communicator. Each case runs in its own
process (clean peak counters, clean CUDA context) on the same random-weight QLoRA model, loaded with
``bnb_4bit_quant_storage=bfloat16`` as FSDP-QLoRA needs, three real steps each:

``single``  no process group, no wrapper (the single-GPU plan)
``ddp``     ``DistributedDataParallel`` over an NCCL group of one rank
``fsdp2``   ``fully_shard`` on every decoder layer and on the root (FSDP2), NCCL, world size 1
``fsdp1``   ``FullyShardedDataParallel`` (FSDP1; at world size 1 it runs as NO_SHARD), every leaf module
            with parameters its own unit (uniform dtypes, as Answer.AI's ``size`` policy)

The optimizer is torch's AdamW in every case (bitsandbytes' paged optimizers do not take FSDP2's DTensor
parameters). Writes ``fsdp_world1.csv`` (planned vs measured per case) and ``fsdp_world1.json`` (every raw
figure, the errors, the versions) to --out.

    NCCL_NVLS_ENABLE=0 python bench/fsdp_world1.py --out $OUT      # one GPU, about 2 minutes
    python bench/fsdp_world1.py --tiny --out /tmp/w1                 # CPU, gloo, a tiny 4-bit model
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ("single", "ddp", "fsdp2", "fsdp1")
ARCH = "TinyLlama-1.1B"
BATCH, SEQ = 4, 512
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}
CASE_TIMEOUT_S = 90
BUDGET_S = 225  # the whole run, so that it ends inside 4 minutes on the H200
FIELDS = ["case", "implementation", "status", "batch_size", "seq_len",
          "planned_allocated_bytes", "measured_allocated_bytes", "allocated_error",
          "planned_reserved_bytes", "measured_reserved_bytes",
          "planned_process_bytes", "measured_process_bytes", "process_error",
          "planned_added_vs_single_bytes", "measured_added_vs_single_bytes",
          "planned_gathered_bytes", "planned_comm_bytes", "measured_process_minus_reserved_bytes",
          "weights_allocated_bytes", "wrapped_allocated_bytes", "error"]


# ---------------------------------------------------------------------------------------------- child
def _load(ckpt: str, cuda: bool, reentrant: bool) -> Any:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    # bitsandbytes 0.50 quantizes on the CPU too, so --tiny runs the same 4-bit model through the same wrappers.
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa", dtype=torch.bfloat16,
                                                 quantization_config=quant, device_map={"": 0 if cuda else "cpu"})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                            gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.config.use_cache = False
    lora = LoraConfig(r=64, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


def _wrap(case: str, model: Any, cuda: bool) -> tuple[Any, str]:
    import torch

    if case == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # Reentrant checkpointing re-runs each layer's forward inside backward, where DDP would see the LoRA
        # gradients become ready twice; a static graph accepts that (bench/ddp_qlora.py went non-reentrant).
        ddp = DistributedDataParallel(model, device_ids=[0] if cuda else None, find_unused_parameters=False,
                                      static_graph=True)
        return ddp, "DDP (static_graph)"
    if case == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cuda" if cuda else "cpu", (1,))
        for layer in model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, "FSDP2 fully_shard"
    if case == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        def leaf_with_params(module: Any) -> bool:
            return not list(module.children()) and any(True for _ in module.parameters(recurse=False))

        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=leaf_with_params)
        wrapped = FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=True,
                                           sharding_strategy=ShardingStrategy.FULL_SHARD,
                                           device_id=torch.cuda.current_device() if cuda else None)
        return wrapped, f"FSDP1 {wrapped.sharding_strategy.name}"
    return model, "none"


def child(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not args.tiny
    out: dict[str, Any] = {"case": args.case, "status": "error", "reentrant": args.reentrant}
    sampler = None
    try:
        if cuda:
            torch.cuda.set_device(0)
        if args.case != "single":
            if cuda:
                dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
            else:
                dist.init_process_group("gloo", rank=0, world_size=1)
        model = _load(args.ckpt, cuda, bool(args.reentrant))
        if cuda:
            torch.cuda.synchronize()
            out["weights_allocated_bytes"] = torch.cuda.memory_allocated()
        wrapped, out["implementation"] = _wrap(args.case, model, cuda)
        if cuda:
            out["wrapped_allocated_bytes"] = torch.cuda.memory_allocated()
        params = [p for p in wrapped.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=2e-4)
        if cuda:
            from vramscope.backends.host import HostBackend
            from vramscope.backends.nvml import NvmlBackend
            from vramscope.sampling.sampler import Collector, Sampler

            nvml = NvmlBackend()
            if nvml.is_available():
                sampler = Sampler(Collector(nvml=nvml, host=HostBackend()), interval=0.05, history=4000).start()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        gen = torch.Generator().manual_seed(0)
        vocab = int(json.loads((Path(args.ckpt) / "config.json").read_text())["vocab_size"])
        process_peak = 0
        started = time.perf_counter()
        for _ in range(3):
            ids = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)
            loss = wrapped(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, ids
            if cuda:
                torch.cuda.synchronize()
            if sampler is not None:
                process_peak = max(process_peak, sampler.sample_now().process_bytes(0) or 0)
        out["step_seconds"] = round((time.perf_counter() - started) / 3, 3)
        if cuda:
            out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        if sampler is not None:
            for sample in list(sampler.history):
                process_peak = max(process_peak, sample.process_bytes(0) or 0)
            out["process_bytes"] = process_peak or None
        out["status"] = "ok"
    except Exception as exc:  # a wrapper that refuses the model is a result too: record it and go on
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if cuda and isinstance(exc, torch.OutOfMemoryError):
            out["status"] = "oom"
    finally:
        if sampler is not None:
            sampler.close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------------------------- parent
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_case(case: str, ckpt: str, args: argparse.Namespace, reentrant: int, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    cmd = [sys.executable, __file__, "--child", case, "--ckpt", ckpt, "--batch", str(args.batch), "--seq",
           str(args.seq), "--reentrant", str(reentrant)] + (["--tiny"] if args.tiny else [])
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "status": "timeout", "error": f"no result within {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"case": case, "status": "error", "error": f"exit {proc.returncode}: {tail[0][:300]}"}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    result["seconds"] = round(time.time() - t0, 1)
    return result


def _plans(config: dict[str, Any], batch: int, seq: int) -> dict[str, Any]:
    from vramscope.planner.distributed import Parallelism, estimate_distributed
    from vramscope.planner.memory import estimate
    from vramscope.planner.shapes import shape_from_config
    from vramscope.recipe import QLoraSpec

    shape = shape_from_config(config)
    # The child's loop runs without autocast and keeps only the loss: the planner's loop-loss framework (planned as
    # the default hf, an autocast run, every case comes out 3-8% high; the rehearsal grid had the same mismatch).
    spec = QLoraSpec(optim="adamw_torch", framework="loop-loss")
    single = estimate(shape, spec, batch, seq)
    out: dict[str, Any] = {"single": {"allocated": single.peak_allocated_bytes, "reserved": single.peak_reserved_bytes,
                                      "process": single.process_bytes, "gathered": 0, "comm": 0}}
    for case, strategy, version in (("ddp", "ddp", 1), ("fsdp2", "fsdp", 2), ("fsdp1", "fsdp", 1)):
        par = Parallelism(1, strategy, fsdp_version=version)
        rank = estimate_distributed(shape, spec, batch, seq, par, single=single).worst
        out[case] = {"allocated": rank.peak_allocated_bytes, "reserved": rank.peak_reserved_bytes,
                     "process": rank.process_bytes, "gathered": rank.parts.get("gathered_params", 0),
                     "comm": rank.parts.get("comm_buffers", 0)}
    return out


def _err(pred: Any, meas: Any) -> str:
    return f"{(pred - meas) / meas * 100:+.1f}%" if isinstance(pred, int) and isinstance(meas, int) and meas else ""


def parent(args: argparse.Namespace) -> int:
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if args.tiny:
        config = dict(TINY)
        args.batch, args.seq = 2, 32
    else:
        from vramscope.planner.registry import get_config

        config = get_config(ARCH)
    from vramscope.tune.qlora import write_random_checkpoint

    root = Path(tempfile.mkdtemp(prefix="vs-w1-", dir="/dev/shm" if os.path.isdir("/dev/shm") and cuda else None))
    ckpt = str(write_random_checkpoint(config, root / "model", device="cuda" if cuda else None))
    print(f"checkpoint {time.time() - start:.1f} s", flush=True)
    results: list[dict[str, Any]] = []
    for case in CASES:
        left = BUDGET_S - (time.time() - start)
        if left < 25:
            results.append({"case": case, "status": "skipped", "error": f"{left:.0f} s left of the budget"})
            continue
        r = _run_case(case, ckpt, args, 1, min(CASE_TIMEOUT_S, left))
        if r.get("status") == "error" and case != "single" and BUDGET_S - (time.time() - start) > 40:
            # A wrapper may refuse reentrant checkpointing; non-reentrant is what FSDP/DDP recipes use.
            retry = _run_case(case, ckpt, args, 0, min(CASE_TIMEOUT_S, BUDGET_S - (time.time() - start)))
            retry["first_error"] = r.get("error")
            r = retry
        print(f"{case}: {r.get('status')} {r.get('implementation', '')} alloc={r.get('peak_allocated_bytes')} "
              f"proc={r.get('process_bytes')} {r.get('error') or ''} ({r.get('seconds')} s)", flush=True)
        results.append(r)
    plans = _plans(config, args.batch, args.seq)
    by_case = {r["case"]: r for r in results}
    base = by_case.get("single", {})
    rows = []
    for r in results:
        p = plans[r["case"]]
        meas_alloc, meas_proc = r.get("peak_allocated_bytes"), r.get("process_bytes")
        added = (meas_alloc - base["peak_allocated_bytes"]) if isinstance(meas_alloc, int) and isinstance(
            base.get("peak_allocated_bytes"), int) else ""
        rows.append({
            "case": r["case"], "implementation": r.get("implementation", ""), "status": r.get("status"),
            "batch_size": args.batch, "seq_len": args.seq,
            "planned_allocated_bytes": p["allocated"], "measured_allocated_bytes": meas_alloc or "",
            "allocated_error": _err(p["allocated"], meas_alloc),
            "planned_reserved_bytes": p["reserved"], "measured_reserved_bytes": r.get("peak_reserved_bytes") or "",
            "planned_process_bytes": p["process"], "measured_process_bytes": meas_proc or "",
            "process_error": _err(p["process"], meas_proc),
            "planned_added_vs_single_bytes": p["allocated"] - plans["single"]["allocated"],
            "measured_added_vs_single_bytes": added,
            "planned_gathered_bytes": p["gathered"], "planned_comm_bytes": p["comm"],
            "measured_process_minus_reserved_bytes": (meas_proc - r["peak_reserved_bytes"]) if isinstance(
                meas_proc, int) and isinstance(r.get("peak_reserved_bytes"), int) else "",
            "weights_allocated_bytes": r.get("weights_allocated_bytes", ""),
            "wrapped_allocated_bytes": r.get("wrapped_allocated_bytes", ""),
            "error": r.get("error") or r.get("first_error") or "",
        })
    with open(out / "fsdp_world1.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}
    for name in ("transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            env[name] = __import__(name).__version__
        except Exception:
            env[name] = None
    (out / "fsdp_world1.json").write_text(json.dumps(
        {"arch": "tiny" if args.tiny else ARCH, "batch": args.batch, "seq": args.seq, "env": env,
         "results": results, "plans": plans, "seconds": round(time.time() - start, 1)}, indent=2))
    for row in rows:
        print(f"{row['case']:7} {row['status']:8} alloc plan {row['planned_allocated_bytes']} meas "
              f"{row['measured_allocated_bytes']} ({row['allocated_error']}); added plan "
              f"{row['planned_added_vs_single_bytes']} meas {row['measured_added_vs_single_bytes']}; "
              f"process plan {row['planned_process_bytes']} meas {row['measured_process_bytes']}", flush=True)
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    print(f"done in {time.time() - start:.0f} s", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/fsdp-world1")
    parser.add_argument("--tiny", action="store_true", help="CPU, gloo, a tiny 4-bit model: proves the flow")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--seq", type=int, default=SEQ)
    parser.add_argument("--child", choices=CASES, dest="case", help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", help=argparse.SUPPRESS)
    parser.add_argument("--reentrant", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return child(args) if args.case else parent(args)


if __name__ == "__main__":
    raise SystemExit(main())
