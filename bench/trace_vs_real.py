"""How close is ``vramscope plan --trace`` to the real step? Both, for the same points, on one machine.

For each point (a registry architecture, possibly cut to a few layers; a framework's preparation; a batch
shape; checkpointing on or off) this runs

- the **real** step on the GPU: a random-weight checkpoint loaded in 4 bits by transformers + bitsandbytes,
  prepared by the same code the trace uses (``vramscope.planner.trace.prepare_model``: peft's kbit
  preparation for ``hf``, TRL 1.16's SFTTrainer preparation and fused LM head for ``trl``), two steps with
  bitsandbytes' real paged AdamW, ``torch.cuda.max_memory_allocated`` of the second step after a reset;
- the **trace** (``trace_plan``) of the same point on this machine's CPU, in parallel worker processes;
- the analytic planner's figure for reference,

and writes one CSV row per point to ``--out``. ``--trace-only`` skips the GPU (for a CPU machine: the trace
columns and their times). Nothing here asserts anything: the CSV is the result.

    python bench/trace_vs_real.py --out $OUT            # on the H200 (see bench/h200/trace_vs_real.sh)
    python bench/trace_vs_real.py --out /tmp/t --trace-only --workers 1
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import gc
import multiprocessing
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

# (registry name, layers kept or None for all): layers are cut to keep the GPU part under a few minutes; the
# trace and the real step use the same cut config.
MODELS: list[tuple[str, int | None]] = [("TinyLlama-1.1B", None), ("Llama-2-7B", 8), ("Llama-3-8B", 8)]
SHAPES = [(1, 512, True), (2, 2048, True), (1, 512, False)]
FRAMEWORKS = ["hf", "trl"]
EXTRA = [("Llama-2-7B", 8, "loop", 1, 512, True), ("Llama-2-7B", 8, "loop", 1, 512, False)]

FIELDS = ["model", "layers", "framework", "batch", "seq", "ckpt", "real_peak_allocated", "real_peak_reserved",
          "real_static_allocated", "trace_peak_allocated", "traced_live_peak", "trace_phase", "trace_paged",
          "trace_seconds", "analytic_peak_allocated", "trace_err_pct", "analytic_err_pct", "real_error",
          "trace_error", "torch", "transformers", "peft", "bitsandbytes", "trl"]


def one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def points() -> list[tuple[str, int | None, str, int, int, bool]]:
    out = [(m, layers, fw, b, s, ck) for m, layers in MODELS for fw in FRAMEWORKS for b, s, ck in SHAPES]
    return out + EXTRA


def config_of(name: str, layers: int | None) -> dict[str, Any]:
    from vramscope.planner.registry import get_config

    cfg = dict(get_config(name))
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    cfg["_name_or_path"] = name if layers is None else f"{name}-{layers}L"
    return cfg


def spec_of(framework: str, ckpt: bool) -> Any:
    from vramscope.recipe import QLoraSpec

    return QLoraSpec(framework=framework, gradient_checkpointing=ckpt)


def trace_point(point: tuple[str, int | None, str, int, int, bool]) -> dict[str, Any]:
    """One trace (in a worker process)."""
    import torch

    torch.set_num_threads(1)
    from vramscope.planner import plan
    from vramscope.planner.trace.engine import trace_plan

    name, layers, fw, b, s, ck = point
    cfg, spec = config_of(name, layers), spec_of(fw, ck)
    row: dict[str, Any] = {}
    try:
        t = trace_plan(cfg, b, s, spec, gpu="H200")
        row.update(trace_peak_allocated=t.peak_allocated_bytes, traced_live_peak=t.traced_peak_bytes,
                   trace_phase=t.peak_phase, trace_paged=t.optimizer_states_paged_bytes,
                   trace_seconds=round(t.trace_seconds, 2))
    except Exception as exc:  # a point that cannot be traced is a result too
        row["trace_error"] = one_line(exc)
        traceback.print_exc()
    try:
        row["analytic_peak_allocated"] = plan(cfg, b, s, spec, gpu="H200").peak_allocated_bytes
    except Exception as exc:
        row["analytic_peak_allocated"] = ""
        print("analytic:", exc, file=sys.stderr)
    return row


def real_point(point: tuple[str, int | None, str, int, int, bool], ckpt_dir: Path) -> dict[str, Any]:
    """One real QLoRA step pair on the GPU, prepared by the trace's own preparation code."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from vramscope.planner.trace.engine import prepare_model, run_steps

    name, layers, fw, b, s, ck = point
    cfg, spec = config_of(name, layers), spec_of(fw, ck)
    gc.collect()
    torch.cuda.empty_cache()
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model: Any = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                      quantization_config=quant, device_map={"": 0})
    model = prepare_model(model, spec)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = bnb.optim.PagedAdamW32bit(params, lr=spec.learning_rate)
    gc.collect()
    torch.cuda.synchronize()
    static = torch.cuda.memory_allocated()

    def reset() -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    # the hf step under the HF Trainer's bf16 autocast, as the trace runs it (planner/trace/autocast.py)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if fw == "hf" else None
    run_steps(model, spec, b, s, int(cfg["vocab_size"]), "cuda", opt, before_last_step=reset, autocast=autocast)
    torch.cuda.synchronize()
    row = {"real_peak_allocated": torch.cuda.max_memory_allocated(),
           "real_peak_reserved": torch.cuda.max_memory_reserved(), "real_static_allocated": static}
    del model, opt, params
    gc.collect()
    torch.cuda.empty_cache()
    return row


def write_checkpoint(name: str, layers: int | None, root: Path) -> Path:
    from vramscope.tune.qlora import write_random_checkpoint

    out = root / (name if layers is None else f"{name}-{layers}L")
    if not (out / "config.json").exists():
        cfg = {k: v for k, v in config_of(name, layers).items() if k != "_name_or_path"}
        write_random_checkpoint(cfg, out, device="cuda")
    return out


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "peft", "bitsandbytes", "trl"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = ""
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--trace-only", action="store_true", help="no GPU: the trace columns only")
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting real points after this")
    ap.add_argument("--checkpoints", type=Path, default=Path("/dev/shm/vramscope-trace-ckpt"))
    ap.add_argument("--only", default="", help="comma-separated model names to keep")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    todo = points()
    if args.only:
        keep = set(args.only.split(","))
        todo = [p for p in todo if p[0] in keep]
    rows: dict[int, dict[str, Any]] = {i: {} for i in range(len(todo))}
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx) as pool:
        futures = {pool.submit(trace_point, p): i for i, p in enumerate(todo)}
        if not args.trace_only:
            for i, p in enumerate(todo):
                if time.monotonic() - start > args.budget_s:
                    rows[i]["real_error"] = "skipped: time budget"
                    continue
                try:
                    ckpt = write_checkpoint(p[0], p[1], args.checkpoints)
                    rows[i].update(real_point(p, ckpt))
                except Exception as exc:
                    rows[i]["real_error"] = one_line(exc)
                    traceback.print_exc()
                print(f"real {p}: {rows[i]} ({time.monotonic() - start:.0f} s)", flush=True)
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                rows[i].update(fut.result())
            except Exception as exc:
                rows[i]["trace_error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"trace {todo[i]}: {rows[i]} ({time.monotonic() - start:.0f} s)", flush=True)
    shutil.rmtree(args.checkpoints, ignore_errors=True)
    env = versions()
    out_csv = args.out / ("trace_cpu.csv" if args.trace_only else "trace_vs_real.csv")
    with out_csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for i, (name, layers, fw, b, s, ck) in enumerate(todo):
            r = rows[i]
            real, tr, an = r.get("real_peak_allocated"), r.get("trace_peak_allocated"), r.get("analytic_peak_allocated")
            if real and tr:
                r["trace_err_pct"] = round(100 * (tr - real) / real, 2)
            if real and an:
                r["analytic_err_pct"] = round(100 * (an - real) / real, 2)
            w.writerow({"model": name, "layers": layers or "", "framework": fw, "batch": b, "seq": s,
                        "ckpt": "on" if ck else "off", **r, **env})
    print(f"wrote {out_csv} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
