"""How much does ``vramscope plan --calibrate`` improve on the analytic model? Measured on a GPU.

For each architecture (default TinyLlama-1.1B and Qwen2.5-1.5B: small, so the run stays near a minute on an
H200) a random-weight checkpoint is loaded the QLoRA way once; two real steps run at the three small
calibration shapes and at larger evaluation shapes, reading ``torch.cuda.max_memory_allocated``. The
calibration is fitted on the small shapes only; the evaluation shapes are then predicted by the analytic model
and by the calibrated one. Writes ``--out DIR``/calibrate_eval.csv and calibrate_eval.md.

GPU:  python bench/calibrate_eval.py --out OUT [--archs TinyLlama-1.1B,Qwen2.5-1.5B]
CPU:  python bench/calibrate_eval.py --out OUT --tiny   (a tiny model through the same code; no memory numbers)
"""

from __future__ import annotations

import argparse
import csv
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from vramscope.planner import estimate, plan, resolve_model
from vramscope.planner.registry import get_config
from vramscope.tune.calibrate import DEFAULT_SHAPES, Point, _static, fit, measure
from vramscope.tune.qlora import QLoraSpec, load_model, make_optimizer, write_random_checkpoint

EVAL_SHAPES = ((4, 1024), (2, 2048), (8, 1024))
TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}
GIB = 2**30


def run_gpu(arch: str, config: dict[str, Any], spec: QLoraSpec) -> list[dict[str, Any]]:
    import torch

    _, shape = resolve_model(config)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="vramscope-caleval-") as tmp:
        write_random_checkpoint(config, tmp, device="cuda")
        gc.collect()
        torch.cuda.empty_cache()
        static, rows = measure(tmp, spec, shape.vocab, list(DEFAULT_SHAPES) + list(EVAL_SHAPES))
    n_cal = len(DEFAULT_SHAPES)
    points = []
    for batch, seq, alloc, _, _ in rows[:n_cal]:
        est = estimate(shape, spec, batch, seq)
        points.append(Point(batch, seq, alloc, est.peak_allocated_bytes - _static(est.breakdown)))
    hw = fit(points, static, _static(estimate(shape, spec, 1, 1).breakdown))
    out = []
    for i, (batch, seq, alloc, _reserved, _process) in enumerate(rows):
        analytic = plan(config, batch, seq, spec).peak_allocated_bytes
        calibrated = plan(config, batch, seq, spec, hardware=hw).peak_allocated_bytes
        out.append({"arch": arch, "batch_size": batch, "seq_len": seq, "role": "calibrate" if i < n_cal else "evaluate",
                    "measured_allocated": alloc, "analytic": analytic, "calibrated": calibrated,
                    "analytic_error_pct": round(100 * (analytic - alloc) / alloc, 2),
                    "calibrated_error_pct": round(100 * (calibrated - alloc) / alloc, 2),
                    "scale": round(hw.dynamic_scale, 4), "offset_bytes": hw.dynamic_offset_bytes,
                    "seconds": round(time.time() - t0, 1)})
        print(f"[{arch}] {out[-1]['role']:9} {batch} x {seq}: measured {alloc / GIB:.2f} GiB, analytic "
              f"{analytic / GIB:.2f} ({out[-1]['analytic_error_pct']:+.1f}%), calibrated {calibrated / GIB:.2f} "
              f"({out[-1]['calibrated_error_pct']:+.1f}%)", flush=True)
    return out


def run_cpu_tiny(spec: QLoraSpec) -> list[dict[str, Any]]:
    """No GPU: load and step a tiny model through the same loader so the script's plumbing is exercised."""
    import torch

    out = []
    with tempfile.TemporaryDirectory(prefix="vramscope-caleval-") as tmp:
        write_random_checkpoint(TINY, tmp)
        model = load_model(tmp, spec, device="cpu")
        optimizer = make_optimizer(model, spec)
        for batch, seq in ((1, 16), (2, 32)):
            ids = torch.randint(0, TINY["vocab_size"], (batch, seq))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            out.append({"arch": "tiny", "batch_size": batch, "seq_len": seq, "role": "cpu-smoke",
                        "measured_allocated": "", "analytic": plan(TINY, batch, seq, spec).peak_allocated_bytes,
                        "calibrated": "", "analytic_error_pct": "", "calibrated_error_pct": "", "scale": "",
                        "offset_bytes": "", "seconds": ""})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--archs", default="TinyLlama-1.1B,Qwen2.5-1.5B")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny model")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = QLoraSpec()
    import torch

    if args.tiny or not torch.cuda.is_available():
        records = run_cpu_tiny(spec)
    else:
        records = []
        for arch in args.archs.split(","):
            records += run_gpu(arch, get_config(arch), spec)
    with open(out_dir / "calibrate_eval.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    lines = ["| arch | batch x seq | role | measured | analytic (err) | calibrated (err) |",
             "|---|---|---|---|---|---|"]
    for r in records:
        if r["measured_allocated"] == "":
            lines.append(f"| {r['arch']} | {r['batch_size']} x {r['seq_len']} | {r['role']} | - | "
                         f"{r['analytic'] / GIB:.4f} GiB | - |")
            continue
        lines.append(f"| {r['arch']} | {r['batch_size']} x {r['seq_len']} | {r['role']} | "
                     f"{r['measured_allocated'] / GIB:.2f} GiB | {r['analytic'] / GIB:.2f} GiB "
                     f"({r['analytic_error_pct']:+.1f}%) | {r['calibrated'] / GIB:.2f} GiB "
                     f"({r['calibrated_error_pct']:+.1f}%) |")
    (out_dir / "calibrate_eval.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out_dir / 'calibrate_eval.csv'} and calibrate_eval.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
