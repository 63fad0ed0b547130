"""Force a real CUDA OOM on a QLoRA model, write its post-mortem, and measure what recording costs.

1. Cost: training steps at a batch that fits, timed (``torch.cuda.synchronize`` per step) in
   interleaved blocks with allocator history recording off, on with Python stacks, and on with
   Python+C++ stacks (``--stacks-all``), each with a ring buffer of ``--max-entries`` events; plus the
   time and size of one snapshot.
2. Post-mortem: :class:`vramscope.oom.OomRecorder` (with the planner told the model and recipe) is
   started, a step at ``--batch`` (too large for ``--memory-limit``) runs out of memory, and the
   recorder writes ``oom-1-snapshot.pickle`` (open it in https://pytorch.org/memory_viz),
   ``oom-1.md``, ``oom-1.html``, ``oom-1.json`` and ``oom-1.event.json`` into ``OUT/oom/``.
   torch's own ``_memory_viz.segsum`` reads the snapshot back, and ``trace_plot`` of the small copy
   (part 3) writes ``OUT/oom/memory_viz.html`` (torch's page; it loads the viewer from a CDN).
3. Test data: a copy of the snapshot cut to its last ``--test-entries`` history events (torch's
   format unchanged otherwise) in ``OUT/testdata/``, small enough to commit under ``tests/data/oom/``
   for the CPU test of the report builder.

Everything is written to ``OUT/oom_example.json``; nothing is asserted.

``--tiny`` (CPU): the model and the timing loop run for real, but a CPU has no CUDA allocator, no
history and no OOM observer, so parts 1-3 are skipped with a note. It proves the script runs.

H200 (about 45 s with the 1.1B model when tune_compare already wrote its checkpoint, 60 s otherwise):
    python bench/oom_example.py --out out/oom-example --stacks-all
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import environment, model_config
from vramscope.units import parse_bytes


def timed_steps(trainer: Any, batch: int, seq: int, n: int, cuda: bool) -> list[float]:
    import torch

    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        trainer.step(batch, seq)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def measure_cost(trainer: Any, args: argparse.Namespace, cuda: bool) -> dict[str, Any]:
    """Per-step time with history recording off / python stacks / all stacks, interleaved blocks."""
    import torch

    # On the CPU there is no history to record: one "off" block shows that the loop runs.
    modes = (["off", "python"] + (["all"] if args.stacks_all else [])) if cuda else ["off"]
    samples: dict[str, list[float]] = {m: [] for m in modes}
    timed_steps(trainer, args.cost_batch, args.seq_len, 2, cuda)  # warm-up: optimizer state, kernels
    for _ in range(args.rounds):
        for mode in modes:
            if cuda and mode != "off":
                torch.cuda.memory._record_memory_history(
                    enabled="all", context="alloc", stacks=mode, max_entries=args.max_entries
                )
            samples[mode] += timed_steps(trainer, args.cost_batch, args.seq_len, args.steps, cuda)
            if cuda and mode != "off":
                torch.cuda.memory._record_memory_history(enabled=None)
        if not cuda:
            break
    out: dict[str, Any] = {"batch": args.cost_batch, "seq_len": args.seq_len, "max_entries": args.max_entries}
    base = statistics.median(samples["off"])
    for mode, values in samples.items():
        if not values:
            continue
        med = statistics.median(values)
        out[mode] = {
            "steps": len(values),
            "median_ms": round(med * 1e3, 2),
            "min_ms": round(min(values) * 1e3, 2),
            "overhead_pct": round((med / base - 1) * 100, 2) if mode != "off" else 0.0,
        }
    if cuda:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=args.max_entries
        )
        timed_steps(trainer, args.cost_batch, args.seq_len, 3, cuda)  # fill the ring buffer with real steps
        t0 = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        blob = pickle.dumps(snap)
        out["snapshot"] = {
            "seconds": round(time.perf_counter() - t0, 3),
            "bytes": len(blob),
            "history_entries": sum(len(t) for t in snap.get("device_traces", [])),
        }
        torch.cuda.memory._record_memory_history(enabled=None)
        del snap, blob
    else:
        out["note"] = "CPU: no CUDA allocator history to record; only steps without recording ran"
    return out


def force_oom(trainer: Any, args: argparse.Namespace, config: dict[str, Any], spec: Any) -> dict[str, Any]:
    import torch
    from torch.cuda import _memory_viz

    from vramscope.oom import OomRecorder, oom_kind

    out_dir = args.out / "oom"
    shape = [args.batch, args.seq_len]
    context: dict[str, Any] = {"step": 1, "phase": None, "tokens": args.batch * args.seq_len, "batch_shape": shape}

    def ctx() -> dict[str, Any]:
        return dict(context)

    recorder = OomRecorder(out_dir, context=ctx, max_entries=args.oom_max_entries, model=config, spec=spec.to_dict())
    recorder.start()
    error = None
    t0 = time.perf_counter()
    try:
        # Trainer.step's three phases, spelled out so that the context says which one ran out.
        trainer.optimizer.zero_grad(set_to_none=True)
        ids = trainer.batch(args.batch, args.seq_len)
        context["phase"] = "forward"
        loss = trainer.model(input_ids=ids, labels=ids).loss
        context["phase"] = "backward"
        loss.backward()
        context["phase"] = "optimizer"
        trainer.optimizer.step()
    except Exception as exc:
        if oom_kind(exc) is None:
            raise
        error = str(exc).splitlines()[0]
        recorder.record_exception(exc)  # adds the message to the post-mortem the observer wrote
        del exc
    ids = loss = None
    elapsed = time.perf_counter() - t0
    recorder.stop()
    trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    result: dict[str, Any] = {
        "batch": args.batch,
        "error": error,
        "seconds": round(elapsed, 2),
        "files": [str(p) for p in sorted(out_dir.glob("*"))],
    }
    if error is None:
        result["note"] = f"batch {args.batch} did not run out of memory; raise --batch or lower --memory-limit"
        return result
    snap_path = out_dir / "oom-1-snapshot.pickle"
    with open(snap_path, "rb") as f:
        snapshot = pickle.load(f)
    # torch's own tools read the snapshot: the same check memory_viz's loader makes.
    result["segsum_tail"] = _memory_viz.segsum(snapshot).splitlines()[-10:-7]
    report = json.loads((out_dir / "oom-1.json").read_text())
    result["report"] = {
        k: report[k]
        for k in (
            "requested_bytes",
            "capacity_bytes",
            "reserved_bytes",
            "allocated_bytes",
            "fragmentation",
            "shortfall_bytes",
            "advice_source",
        )
    }
    result["report"]["top_sites"] = [(s["where"], s["kind"], s["bytes"]) for s in report["top_sites"][:5]]
    result["report"]["advice"] = [(a["key"], a["source"], a["saves_bytes"], a["sufficient"]) for a in report["advice"]]
    # A small copy for the CPU test: the same structure, only the history cut to its last entries.
    small = dict(snapshot)
    small["device_traces"] = [t[-args.test_entries :] for t in snapshot["device_traces"]]
    test_dir = args.out / "testdata"
    test_dir.mkdir(parents=True, exist_ok=True)
    with open(test_dir / "h200-oom-1-snapshot.pickle", "wb") as f:
        pickle.dump(small, f)
    (test_dir / "h200-oom-1.event.json").write_text((out_dir / "oom-1.event.json").read_text())
    result["testdata_bytes"] = (test_dir / "h200-oom-1-snapshot.pickle").stat().st_size
    # The timeline page (torch's template; it loads the viewer's JavaScript from a CDN) of the small copy.
    (out_dir / "memory_viz.html").write_text(_memory_viz.trace_plot(small))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run (no CUDA: recording parts skipped)")
    ap.add_argument("--model", default="TinyLlama-1.1B", help="a vramscope planner registry name")
    ap.add_argument("--seq-len", type=int, default=None, help="default 1024 (64 with --tiny)")
    ap.add_argument("--memory-limit", default="8GiB")
    ap.add_argument("--batch", type=int, default=64, help="the batch that runs out of memory")
    ap.add_argument("--cost-batch", type=int, default=2, help="the batch the cost is measured at")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of blocks")
    ap.add_argument("--max-entries", type=int, default=100_000, help="history ring buffer for the cost runs")
    ap.add_argument("--oom-max-entries", type=int, default=20_000, help="ring buffer for the forced OOM")
    ap.add_argument("--stacks-all", action="store_true", help="also time C++ stacks (slower to record)")
    ap.add_argument("--test-entries", type=int, default=500, help="history kept in the test-data copy")
    ap.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="reuse/write the random checkpoint here (default: TMPDIR/vramscope-bench/<model>)",
    )
    args = ap.parse_args()

    import torch

    from vramscope.tune.qlora import QLoraSpec, build_trainer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tune_compare import default_checkpoint_dir, write_checkpoint

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print("no CUDA GPU: run with --tiny for the CPU smoke run", file=sys.stderr)
        return 2
    args.seq_len = args.seq_len or (64 if args.tiny else 1024)
    args.out.mkdir(parents=True, exist_ok=True)
    config = model_config(args.model, args.tiny)
    limit = parse_bytes(args.memory_limit)
    if cuda:
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / torch.cuda.get_device_properties(0).total_memory))
    ckpt = args.checkpoint_dir or default_checkpoint_dir(args.model, args.tiny)
    t0 = time.perf_counter()
    write_checkpoint(config, ckpt, cuda)
    spec = QLoraSpec()
    trainer = build_trainer(ckpt, spec)
    setup_s = time.perf_counter() - t0

    result: dict[str, Any] = {
        "env": environment(),
        "settings": {
            "model": args.model,
            "seq_len": args.seq_len,
            "memory_limit_bytes": limit,
            "batch": args.batch,
            "tiny": args.tiny,
            "setup_seconds": round(setup_s, 1),
        },
        "cost": measure_cost(trainer, args, cuda),
    }
    if cuda:
        result["oom"] = force_oom(trainer, args, config, spec)
    else:
        result["oom"] = {"note": "CPU: no CUDA allocator, no OOM observer; the post-mortem needs the GPU"}
    (args.out / "oom_example.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result[k] for k in ("settings", "cost", "oom")}, indent=2, default=str))
    if cuda and (args.out / "oom" / "oom-1.md").exists():
        print((args.out / "oom" / "oom-1.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
