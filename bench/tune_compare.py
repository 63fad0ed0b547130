"""Largest batch that fits: vramscope's tuner against accelerate and Lightning, and against the truth.

On one QLoRA model and one memory budget, this measures for each method the batch it returns, the
real training steps it ran (and how many ran out of memory), its wall time, and what it left
allocated, and compares the batch with the true maximum found by an exhaustive search (every batch
from 1 up to the first that runs out of memory, one real step each):

* ``vramscope``: :func:`vramscope.find_max_batch_size` (margin 0 and the default 0.05);
* ``accelerate``: ``accelerate.utils.find_executable_batch_size(starting_batch_size=128)``, which
  multiplies the batch by 0.9 after each OOM;
* ``lightning``: ``Tuner.scale_batch_size(mode="binsearch", steps_per_trial=3, init_val=2)``, which
  doubles, then bisects (margin 0 here, for the comparison with the true maximum).

Every method trains the same model with the same step: ``zero_grad``, forward, backward, optimizer
step, over random tokens (memory depends on shapes only). The GPU's memory is capped with
``torch.cuda.set_per_process_memory_fraction`` so that the maximum is small and the exhaustive search
cheap. One warm-up step at batch 1 runs before any method, so every method starts from the same
state (CUDA context, cuBLAS workspace, allocator).

``--tiny`` runs the same code on the CPU: a tiny Llama trains for real, and its device memory is
simulated by a byte budget (a fake at the hardware boundary, as in the tests) that raises
``torch.OutOfMemoryError`` when exceeded. It proves the script works; its numbers mean nothing.

Writes ``tune_compare.json`` (everything), ``tune_compare.md`` (the table) and ``exhaustive.csv``
(allocated and reserved peak per batch) into ``--out``; ``tune_compare.json`` has vramscope's
per-trial allocated and reserved peaks under ``details.trials``. Nothing is asserted: the script measures.

H200 (TinyLlama-1.1B: about 1.5 min; Llama-2-7B: about 4 min, 1.5 of them writing and loading the
13.5 GB checkpoint, which is then kept under $TMPDIR/vramscope-bench/ for the next run):
    python bench/tune_compare.py --out bench/results/tune-1b
    python bench/tune_compare.py --out bench/results/tune-7b --model Llama-2-7B --seq-len 2048 --memory-limit 24GiB
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import environment, model_config
from vramscope.oom import oom_kind
from vramscope.units import gib, parse_bytes

MIB = 1024**2


# -- the device: real CUDA, or a byte budget on the CPU (tiny mode) --------------------------------


class SimulatedDevice:
    """Tiny mode only: device memory as a byte budget over real (small) CPU tensors; a fake at the
    hardware boundary. Implements vramscope's MemoryProbe."""

    def __init__(self, capacity: int, base: int, per_sample: int, fixed: int) -> None:
        self.capacity, self.per_sample, self.fixed = capacity, per_sample, fixed
        self.current = self.peak = 0
        self.num_ooms = 0
        self._weights = self.empty(base)

    def empty(self, nbytes: int) -> Any:
        import torch

        if self.current + nbytes > self.capacity:
            self.num_ooms += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / MIB:.2f} MiB (simulated budget of "
                f"{self.capacity / MIB:.0f} MiB)"
            )
        tensor = torch.empty(64, dtype=torch.uint8)
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        weakref.finalize(tensor, self._free, nbytes)
        return tensor

    def _free(self, nbytes: int) -> None:
        self.current -= nbytes

    def charge_step(self, batch: int) -> list[Any]:
        """What a step at ``batch`` holds at its peak; keep the list alive through the real step."""
        return [self.empty(self.fixed), *[self.empty(self.per_sample) for _ in range(batch)]]

    # MemoryProbe
    def capacity_bytes(self) -> int:
        return self.capacity

    def allocated_bytes(self) -> int:
        return self.current

    def reserved_bytes(self) -> int:
        return self.current  # no allocator cache simulated: the reserve is the allocation

    def reset_peak(self) -> None:
        self.peak = self.current

    def peak_bytes(self) -> int:
        return self.peak

    def peak_reserved_bytes(self) -> int:
        return self.peak

    def release(self) -> None:
        gc.collect()


@dataclass
class Harness:
    """The model, its training step, and the device; every method calls :meth:`step`."""

    trainer: Any
    seq_len: int
    cuda: bool
    sim: SimulatedDevice | None = None
    limit: int | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    method: str = ""

    def step(self, batch: int) -> None:
        t0 = time.perf_counter()
        ok = False
        try:
            self.trainer.optimizer.zero_grad(set_to_none=True)
            held = self.sim.charge_step(batch) if self.sim is not None else None
            self.trainer.step(batch, self.seq_len)
            del held
            if self.cuda:
                import torch

                torch.cuda.synchronize()
            ok = True
        finally:
            self.calls.append(
                {"method": self.method, "batch": batch, "ok": ok, "seconds": round(time.perf_counter() - t0, 4)}
            )

    def allocated(self) -> int:
        if self.sim is not None:
            return self.sim.allocated_bytes()
        import torch

        return int(torch.cuda.memory_allocated())

    def num_ooms(self) -> int:
        if self.sim is not None:
            return self.sim.num_ooms
        import torch

        return int(torch.cuda.memory_stats().get("num_ooms", 0))

    def release(self) -> None:
        gc.collect()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def peak_probe(self) -> Any:
        if self.sim is not None:
            return self.sim
        from vramscope.tune.cuda import CudaProbe

        return CudaProbe(limit_bytes=self.limit)


def default_checkpoint_dir(model: str, tiny: bool) -> Path:
    """Outside ``--out`` (results stay small) and shared by tune_compare and oom_example, so one writes
    the checkpoint and the other reuses it."""
    return Path(tempfile.gettempdir()) / "vramscope-bench" / f"{model}{'-tiny' if tiny else ''}"


def write_checkpoint(config: dict[str, Any], out_dir: Path, cuda: bool) -> Path:
    """A random-weight checkpoint (memory does not depend on the values). On the GPU the weights are
    initialised there: for a 7B model that takes seconds instead of a minute on the CPU."""
    if (out_dir / "config.json").exists():
        return out_dir
    if not cuda:
        from vramscope.tune.qlora import write_random_checkpoint

        return write_random_checkpoint(config, out_dir)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return out_dir


# -- the methods -----------------------------------------------------------------------------------


def run_exhaustive(h: Harness, limit: int) -> dict[str, Any]:
    """Every batch from 1 until the first OOM (then one more, to see that it stays out)."""
    rows = []
    probe = h.peak_probe()
    true_max = 0
    failures = 0
    for batch in range(1, limit + 1):
        h.release()
        probe.reset_peak()
        base = probe.allocated_bytes()
        # The reserve is what the memory cap limits (allocated + the allocator's cached/rounded blocks).
        base_reserved = probe.reserved_bytes()
        try:
            h.step(batch)
            rows.append(
                {
                    "batch": batch,
                    "ok": True,
                    "base_bytes": base,
                    "peak_bytes": probe.peak_bytes(),
                    "base_reserved_bytes": base_reserved,
                    "peak_reserved_bytes": probe.peak_reserved_bytes(),
                }
            )
            if failures == 0:
                true_max = batch
        except Exception as exc:
            if oom_kind(exc) is None:
                raise
            rows.append(
                {
                    "batch": batch,
                    "ok": False,
                    "base_bytes": base,
                    "peak_bytes": None,
                    "base_reserved_bytes": base_reserved,
                    "peak_reserved_bytes": None,
                }
            )
            failures += 1
            del exc
            if failures >= 2:
                break
    h.release()
    return {"true_max": true_max, "rows": rows}


def run_vramscope(h: Harness, margin: float, max_batch: int) -> dict[str, Any]:
    from vramscope import find_max_batch_size

    result = find_max_batch_size(h.step, margin=margin, max_batch=max_batch, probe=h.peak_probe())
    return {
        "batch": result.batch_size,
        "trials": len(result.trials),
        "details": result.to_dict(),
    }


def run_accelerate(h: Harness, start: int) -> dict[str, Any]:
    from accelerate.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int) -> int:
        h.step(batch_size)
        return batch_size

    return {"batch": train()}


def run_lightning(h: Harness, init_val: int, max_batch: int) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.tuner import Tuner
    from torch.utils.data import DataLoader, Dataset

    from vramscope.tune.qlora import make_optimizer

    harness = h
    vocab = h.trainer.vocab_size

    class RandomTokens(Dataset[Any]):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> Any:
            g = torch.Generator().manual_seed(i)
            return torch.randint(0, vocab, (harness.seq_len,), generator=g)

    class Lit(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = harness.trainer.model
            self.batch_size = init_val

        def train_dataloader(self) -> Any:
            return DataLoader(RandomTokens(self.batch_size * 4), batch_size=self.batch_size)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            # Count this step as a call, in the same ledger as the other methods.
            t0 = time.perf_counter()
            ok = False
            try:
                held = harness.sim.charge_step(batch.shape[0]) if harness.sim is not None else None
                loss = self.model(input_ids=batch, labels=batch).loss
                del held
                ok = True
                return loss
            finally:
                harness.calls.append(
                    {
                        "method": harness.method,
                        "batch": int(batch.shape[0]),
                        "ok": ok,
                        "seconds": round(time.perf_counter() - t0, 4),
                    }
                )

        def configure_optimizers(self) -> Any:
            from vramscope.tune.qlora import QLoraSpec

            return make_optimizer(self.model, QLoraSpec())

    lit = Lit()
    trainer = pl.Trainer(
        accelerator="gpu" if h.cuda else "cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / "vramscope-lightning"),
    )
    try:
        found = Tuner(trainer).scale_batch_size(
            lit, mode="binsearch", steps_per_trial=3, init_val=init_val, margin=0.0, max_val=max_batch
        )
    except Exception as exc:
        # Lightning restores its checkpoint after the search; if only that fails (e.g. a quantized
        # layer it cannot load back), the size it found is still on the module.
        traceback.print_exc()
        return {"batch": lit.batch_size, "error": f"after the search: {type(exc).__name__}: {exc}"[:300]}
    return {"batch": found}


def summarise(h: Harness, name: str, fn: Callable[[], dict[str, Any]], true_max: int | None) -> dict[str, Any]:
    """Run one method, time it, and count its steps, OOMs and what it left allocated."""
    h.release()
    h.method = name
    first_call = len(h.calls)
    before_alloc = h.allocated()
    before_ooms = h.num_ooms()
    t0 = time.perf_counter()
    error = None
    out: dict[str, Any] = {}
    try:
        out = fn()
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        traceback.print_exc()
    seconds = time.perf_counter() - t0
    h.release()
    calls = h.calls[first_call:]
    trials = _trials(calls)
    row = {
        "method": name,
        "batch": out.get("batch"),
        "true_max": true_max,
        "off_by": None if out.get("batch") is None or true_max is None else true_max - out["batch"],
        "trials": out.get("trials", len(trials)),
        "steps": len(calls),
        "oom_steps": sum(1 for c in calls if not c["ok"]),
        "allocator_ooms": h.num_ooms() - before_ooms,
        "seconds": round(seconds, 2),
        "left_allocated_bytes": h.allocated() - before_alloc,
        "error": error or out.get("error"),
        "sizes_tried": [t["batch"] for t in trials],
    }
    if "details" in out:
        row["details"] = out["details"]
    print(
        f"{name}: batch {row['batch']} (true max {true_max}), {row['trials']} trials / {row['steps']} steps, "
        f"{row['oom_steps']} OOM, {row['seconds']} s, left {row['left_allocated_bytes']} B"
        + (f", error {error}" if error else ""),
        flush=True,
    )
    return row


def _trials(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive steps at one batch size are one trial (Lightning runs 3 per trial)."""
    trials: list[dict[str, Any]] = []
    for c in calls:
        if trials and trials[-1]["batch"] == c["batch"] and trials[-1]["ok"]:
            trials[-1]["steps"] += 1
            trials[-1]["ok"] = c["ok"]
        else:
            trials.append({"batch": c["batch"], "ok": c["ok"], "steps": 1})
    return trials


def _device_name(env: dict[str, Any]) -> str:
    device = env.get("device", {})
    return str(device.get("name")) if device.get("kind") == "cuda" else "CPU (tiny mode: simulated memory)"


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"# Largest batch: {s['model']} QLoRA, seq {s['seq_len']}, memory {gib(s['memory_limit_bytes'])}",
        "",
        f"True maximum (exhaustive, one step per batch from 1): **{result['true_max']}**. "
        f"Device: {_device_name(result['env'])}.",
        "",
        "| Method | Batch found | Off by | Trials | Steps run | OOM steps | Wall time | Left allocated |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["methods"]:
        lines.append(
            f"| {r['method']} | {r['batch'] if r['batch'] is not None else 'failed'} | "
            f"{r['off_by'] if r['off_by'] is not None else '-'} | {r['trials']} | {r['steps']} | {r['oom_steps']} | "
            f"{r['seconds']:.1f} s | {r['left_allocated_bytes'] / MIB:.0f} MiB |"
        )
    errors = [r for r in result["methods"] if r["error"]]
    lines += [""] + [f"- {r['method']} failed: `{r['error']}`" for r in errors]
    lines += ["", "Sizes tried, in order:", ""]
    lines += [f"- {r['method']}: {', '.join(map(str, r['sizes_tried']))}" for r in result["methods"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the results")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with simulated memory")
    ap.add_argument("--model", default="TinyLlama-1.1B", help="a vramscope planner registry name")
    ap.add_argument("--seq-len", type=int, default=None, help="default 1024 (64 with --tiny)")
    ap.add_argument("--memory-limit", default="8GiB", help="cap on the GPU's memory (default 8GiB)")
    ap.add_argument("--methods", default="exhaustive,vramscope,vramscope-margin,accelerate,lightning")
    ap.add_argument("--accelerate-start", type=int, default=128)
    ap.add_argument("--lightning-init", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="reuse/write the random checkpoint here (default: TMPDIR/vramscope-bench/<model>)",
    )
    args = ap.parse_args()

    import torch

    from vramscope.tune.qlora import QLoraSpec, build_trainer

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        print("no CUDA GPU: run with --tiny for the CPU smoke run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    config = model_config(args.model, args.tiny)
    seq_len = args.seq_len or (64 if args.tiny else 1024)
    limit = parse_bytes(args.memory_limit)
    ckpt = args.checkpoint_dir or default_checkpoint_dir(args.model, args.tiny)
    t0 = time.perf_counter()
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
    write_checkpoint(config, ckpt, cuda)
    spec = QLoraSpec()
    trainer = build_trainer(ckpt, spec)
    setup_s = time.perf_counter() - t0
    sim = None
    if args.tiny:
        # ~13 samples fit: 40 MiB held, 8 MiB fixed per step, 4 MiB per sample, 100 MiB in all.
        sim = SimulatedDevice(capacity=100 * MIB, base=40 * MIB, per_sample=4 * MIB, fixed=8 * MIB)
    h = Harness(trainer=trainer, seq_len=seq_len, cuda=cuda, sim=sim, limit=limit if cuda else None)
    h.method = "warm-up"
    h.step(1)  # CUDA context, cuBLAS workspace, allocator: the same starting state for every method
    h.release()

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    true_max = None
    exhaustive: dict[str, Any] = {}
    rows = []
    if "exhaustive" in methods:
        holder: dict[str, Any] = {}

        def exhaust() -> dict[str, Any]:
            holder.update(run_exhaustive(h, args.max_batch))
            return {"batch": holder["true_max"]}

        rows.append(summarise(h, "exhaustive", exhaust, None))
        exhaustive = holder
        true_max = exhaustive.get("true_max")
        rows[-1]["true_max"] = true_max
        rows[-1]["off_by"] = 0 if true_max is not None else None
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "vramscope": lambda: run_vramscope(h, 0.0, args.max_batch),
        "vramscope-margin": lambda: run_vramscope(h, 0.05, args.max_batch),
        "accelerate": lambda: run_accelerate(h, args.accelerate_start),
        "lightning": lambda: run_lightning(h, args.lightning_init, args.max_batch),
    }
    for name in methods:
        if name in runners:
            rows.append(summarise(h, name, runners[name], true_max))

    result = {
        "env": environment(),
        "settings": {
            "model": args.model,
            "seq_len": seq_len,
            "memory_limit_bytes": sim.capacity if sim is not None else limit,  # tiny: the simulated budget
            "tiny": args.tiny,
            "spec": spec.to_dict(),
            "accelerate_start": args.accelerate_start,
            "lightning_init": args.lightning_init,
            "setup_seconds": round(setup_s, 1),
        },
        "true_max": true_max,
        "methods": rows,
        "calls": h.calls,
    }
    (args.out / "tune_compare.json").write_text(json.dumps(result, indent=2, default=str))
    (args.out / "tune_compare.md").write_text(markdown(result))
    if exhaustive:
        with open(args.out / "exhaustive.csv", "w") as f:
            f.write("batch,ok,base_bytes,peak_bytes,base_reserved_bytes,peak_reserved_bytes\n")
            for r in exhaustive["rows"]:
                f.write(
                    f"{r['batch']},{int(r['ok'])},{r['base_bytes']},{r['peak_bytes'] or ''},"
                    f"{r['base_reserved_bytes']},{r['peak_reserved_bytes'] or ''}\n"
                )
    print(markdown(result))
    print(f"setup {setup_s:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
