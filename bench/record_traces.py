"""Record real memory traces of QLoRA training, with planted leaks and without, for the leak corpus.

    python bench/record_traces.py --out tests/data/traces/h200          # on the GPU (~3 min on an H200)
    python bench/record_traces.py --tiny --out tests/data/traces/cpu    # on a CPU: host RSS traces

Every scenario trains the same model (built once): a TinyLlama-1.1B-shaped Llama with random weights,
QLoRA reference recipe (NF4, LoRA on every linear layer, gradient checkpointing, paged AdamW) on a
GPU; in ``--tiny`` mode a tiny Llama in fp32 on the CPU, where the monitor falls back to host RSS.
Each scenario gets a fresh optimizer (so each trace has its own warm-up), logs every step through
:class:`vramscope.MemoryMonitor` (plain loop) or :class:`MemoryMonitorCallback` (HF Trainer), and
writes beside its log a ``.truth.json``: what was planted, from which step, and how many bytes per
step it holds by construction. Nothing is synthesised: the rows are what the monitor read.

Scenarios (leaks start at step 100 unless said otherwise, so a detector has a warm-up to sit through):

* clean_fixed, clean_varlen, clean_eval (eval phase every 50 steps), clean_curriculum (sequence
  length grows: the peak and the reserved memory grow, allocated does not);
* leak_cache_1mib / leak_cache_4mib: a list that keeps a 1 / 4 MiB tensor per step ("a growing cache");
* leak_loss_graph: a metric loss kept without ``.item()``, holding its autograd graph;
* leak_eval_logits: eval every 20 steps keeps every batch's logits;
* leak_slow_256k: 256 KiB per step, below the 1 MiB/step goal (shows where the floor is);
* hf_clean_eval, hf_leak_eval_logits: a real ``transformers.Trainer`` with the callback; the leak
  is a ``preprocess_logits_for_metrics`` that stashes the logits.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cuda_available, ensure_checkpoint, environment, log, model_config

MIB = 1024 * 1024


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    kind: str = "loop"  # or "hf"
    seq: str = "fixed"  # "fixed", "varlen" or "curriculum"
    eval_every: int | None = None
    leak: str | None = None  # "cache", "loss_graph", "eval_logits"
    leak_bytes: int = 0  # per step, for "cache"
    leak_start: int = 100
    expect: str = "none"  # what the trace is: "leak", "none", "caching"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("leak_cache_1mib", "a list keeps a 1 MiB tensor every step from step 100", seq="varlen",
             leak="cache", leak_bytes=MIB, expect="leak"),
    Scenario("clean_varlen", "variable sequence lengths, nothing kept"),
    Scenario("hf_leak_eval_logits", "HF Trainer; preprocess_logits_for_metrics stashes logits; eval every 20 steps",
             kind="hf", seq="varlen", eval_every=20, leak="eval_logits", leak_start=20, expect="leak"),
    Scenario("clean_eval", "variable lengths, an eval phase every 50 steps that keeps nothing", seq="varlen",
             eval_every=50),
    Scenario("leak_loss_graph", "from step 100 a metric loss is kept without .item(), holding its graph",
             seq="varlen", leak="loss_graph", expect="leak"),
    Scenario("hf_clean_eval", "HF Trainer, variable lengths, eval every 50 steps", kind="hf", seq="varlen",
             eval_every=50),
    Scenario("leak_eval_logits", "eval (2 batches) every 20 steps from step 100 keeps each batch's logits",
             seq="varlen", eval_every=20, leak="eval_logits", expect="leak"),
    Scenario("clean_curriculum", "sequence length grows over the run: peak and reserved grow, allocated flat",
             seq="curriculum", expect="caching"),
    Scenario("leak_cache_4mib", "a list keeps a 4 MiB tensor every step from step 150", seq="varlen",
             leak="cache", leak_bytes=4 * MIB, leak_start=150, expect="leak"),
    Scenario("clean_fixed", "one sequence length, nothing kept"),
    Scenario("leak_slow_256k", "a list keeps 256 KiB every step from step 100 (below the 1 MiB/step goal)",
             seq="varlen", leak="cache", leak_bytes=256 * 1024, expect="leak"),
)
# The order is on purpose: the traces the corpus needs most come first (a 1 MiB/step leak, a clean
# variable-length run, one of each integration), so a run cut short by --budget-s still yields them.


@dataclass
class Setup:
    """The model and what a step needs, built once."""

    model: Any
    spec: Any
    vocab: int
    device: Any
    batch: int
    seq_range: tuple[int, int]
    eval_batch: int
    loss_tokens: int  # tokens of the kept metric loss (leak_loss_graph)
    tiny: bool


def build(tiny: bool) -> tuple[Setup, dict[str, Any]]:
    import torch

    from vramscope.tune.qlora import QLoraSpec, load_model

    if tiny:
        torch.set_num_threads(1)  # a shared CPU: one thread is steadier and kinder to neighbours
        config = model_config("TinyLlama-1.1B", tiny=True)
        config.update(vocab_size=8192)  # logits big enough that the logits leaks show in RSS
        spec = QLoraSpec(bits=16, lora_r=8, optim="adamw_torch", gradient_checkpointing=False)
    else:
        config = model_config("TinyLlama-1.1B", tiny=False)
        spec = QLoraSpec()
    folder, write_s, reused = ensure_checkpoint(config)
    started = time.perf_counter()
    model = load_model(folder, spec, device="cpu" if tiny else None)
    load_s = time.perf_counter() - started
    device = next(model.parameters()).device
    setup = Setup(model=model, spec=spec, vocab=int(config["vocab_size"]), device=device,
                  batch=2, seq_range=(32, 128) if tiny else (128, 512), eval_batch=4 if tiny else 2,
                  loss_tokens=32, tiny=tiny)
    info = {"config": config, "spec": spec.to_dict(), "checkpoint_write_s": write_s, "checkpoint_reused": reused,
            "load_s": load_s, "device": str(device)}
    return setup, info


def seq_len(scn: Scenario, setup: Setup, step: int, steps: int, rng: random.Random) -> int:
    lo, hi = setup.seq_range
    if scn.seq == "fixed":
        return (lo + hi) // 2
    if scn.seq == "curriculum":
        return lo + (hi - lo) * step // max(1, steps - 1)
    return rng.randint(lo, hi)


def random_batch(setup: Setup, rows: int, length: int, gen: Any) -> Any:
    import torch

    ids = torch.randint(0, setup.vocab, (rows, length), generator=gen)
    return ids.to(setup.device)


def run_loop(scn: Scenario, setup: Setup, log_path: Path, steps: int) -> dict[str, Any]:
    """A plain PyTorch loop under MemoryMonitor, with the scenario's leak planted."""
    import torch
    import torch.nn.functional as F

    from vramscope.integrations.loop import MemoryMonitor
    from vramscope.tune.qlora import make_optimizer

    model = setup.model
    model.train()
    optimizer = make_optimizer(model, setup.spec)
    rng = random.Random(scn.name)
    gen = torch.Generator().manual_seed(len(scn.name))
    kept: list[Any] = []  # the leak
    planted = 0
    with MemoryMonitor(log=str(log_path), every_n_steps=1, warn=False, total_steps=steps) as mon:
        mon.watch_model(model)
        for step in range(1, steps + 1):
            ids = random_batch(setup, setup.batch, seq_len(scn, setup, step, steps, rng), gen)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            leaking = scn.leak is not None and step >= scn.leak_start
            if leaking and scn.leak == "cache":
                kept.append(torch.empty(scn.leak_bytes, dtype=torch.uint8, device=setup.device).fill_(1))
                planted += scn.leak_bytes
            elif leaking and scn.leak == "loss_graph":
                # A per-step metric computed with grad enabled and stored as a tensor: its graph keeps
                # the log-softmax of the last tokens' logits alive.
                tail = out.logits[:, -setup.loss_tokens :].float()
                metric = F.cross_entropy(tail.reshape(-1, setup.vocab), ids[:, -setup.loss_tokens :].reshape(-1))
                kept.append(metric)
                planted += tail.numel() * 4
            del out
            mon.step(step, tokens=int(ids.numel()))
            if scn.eval_every and step % scn.eval_every == 0:
                with mon.phase("eval"):
                    model.eval()
                    with torch.no_grad():
                        for _ in range(2):
                            eids = random_batch(setup, setup.eval_batch, setup.seq_range[1], gen)
                            logits = model(input_ids=eids).logits
                            if scn.leak == "eval_logits" and step >= scn.leak_start:
                                kept.append(logits)
                                planted += logits.numel() * logits.element_size()
                            del logits
                    model.train()
    del kept, optimizer
    return {"planted_bytes": planted}


def run_hf(scn: Scenario, setup: Setup, log_path: Path, steps: int, work: Path) -> dict[str, Any]:
    """A real transformers.Trainer with MemoryMonitorCallback; the leak lives in user code it calls."""
    import torch
    from transformers import Trainer, TrainingArguments

    from vramscope.integrations.hf import MemoryMonitorCallback

    rng = random.Random(scn.name)
    gen = torch.Generator().manual_seed(len(scn.name))
    lo, hi = setup.seq_range
    lengths = [rng.randint(lo, hi) for _ in range(steps * setup.batch)]
    train = [{"input_ids": torch.randint(0, setup.vocab, (n,), generator=gen)} for n in lengths]
    evalset = [{"input_ids": torch.randint(0, setup.vocab, (hi,), generator=gen)} for _ in range(2 * setup.eval_batch)]

    def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(i["input_ids"]) for i in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros(len(items), width, dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n] = item["input_ids"]
            labels[row, :n] = item["input_ids"]
            mask[row, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    kept: list[Any] = []
    planted = [0]

    def stash_logits(logits: Any, labels: Any) -> Any:
        if scn.leak == "eval_logits":
            kept.append(logits)  # the bug: a reference outside the loop keeps every eval batch's logits
            planted[0] += logits.numel() * logits.element_size()
        return logits.argmax(-1)

    args = TrainingArguments(
        output_dir=str(work / scn.name),
        max_steps=steps,
        per_device_train_batch_size=setup.batch,
        per_device_eval_batch_size=setup.eval_batch,
        eval_strategy="steps" if scn.eval_every else "no",
        eval_steps=scn.eval_every,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        remove_unused_columns=False,
        use_cpu=setup.tiny,
        bf16=not setup.tiny,
        optim="adamw_torch" if setup.tiny else "paged_adamw_32bit",
        learning_rate=2e-4,
        dataloader_num_workers=0,
        seed=0,
    )
    callback = MemoryMonitorCallback(log=str(log_path), every_n_steps=1, warn=False)
    trainer = Trainer(
        model=setup.model,
        args=args,
        train_dataset=train,
        eval_dataset=evalset,
        data_collator=collate,
        compute_metrics=lambda _: {},
        preprocess_logits_for_metrics=stash_logits,
        callbacks=[callback],
    )
    trainer.train()
    callback.close()  # now, not at exit: the trace is complete when the scenario ends
    kept.clear()
    del trainer
    return {"planted_bytes": planted[0]}


def release_memory() -> None:
    """Give what the last scenario freed back to the system, so the next trace starts like a new process.

    On a GPU, ``empty_cache`` returns the allocator's cached blocks. On a CPU, glibc keeps freed heap
    memory resident and hands it out again, so a leak in the next scenario would not raise the RSS at
    all; ``malloc_trim(0)`` returns the free pages to the kernel.
    """
    import ctypes
    import ctypes.util

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        try:
            ctypes.CDLL(libc_name).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to trim
            pass


def record(scn: Scenario, setup: Setup, out: Path, steps: int, work: Path) -> dict[str, Any]:
    import torch

    log_path = out / f"{scn.name}.csv"
    for stale in out.glob(f"{scn.name}.*"):
        stale.unlink()
    started = time.perf_counter()
    runner: Callable[..., dict[str, Any]] = run_hf if scn.kind == "hf" else run_loop
    extra = runner(scn, setup, log_path, steps, work) if scn.kind == "hf" else runner(scn, setup, log_path, steps)
    seconds = time.perf_counter() - started
    release_memory()
    # The monitor's own analysis and warnings at recording time are derived data, and would go stale
    # as the detector changes; the corpus keeps the log and the truth, and is re-analysed by its tests.
    for derived in (".analysis.json", ".warnings.jsonl"):
        (out / f"{scn.name}{derived}").unlink(missing_ok=True)
    leak = scn.leak is not None
    active_steps = steps - scn.leak_start + 1 if leak else 0
    truth = {
        "scenario": scn.name,
        "description": scn.description,
        "expect": scn.expect,
        "leak": leak,
        "leak_kind": scn.leak,
        "leak_start_step": scn.leak_start if leak else None,
        "planted_bytes": extra["planted_bytes"],
        "planted_bytes_per_step": extra["planted_bytes"] / active_steps if active_steps > 0 else None,
        "steps": steps,
        "every_n_steps": 1,
        "integration": "hf" if scn.kind == "hf" else "loop",
        "device": "cuda" if torch.cuda.is_available() and not setup.tiny else "cpu",
        "signal": "host_rss_bytes" if setup.tiny or not torch.cuda.is_available() else "allocated_bytes",
        "seconds": round(seconds, 2),
    }
    (out / f"{scn.name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n", encoding="utf-8")
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="folder for the traces (created if missing)")
    parser.add_argument("--tiny", action="store_true", help="CPU mode: a tiny model; the traces are host RSS")
    parser.add_argument("--steps", type=int, default=300, help="steps per scenario (default 300)")
    parser.add_argument("--only", default=None, help="comma-separated scenario names (default: all)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting new scenarios after this many seconds (default: 170 on a GPU, none on CPU)")
    args = parser.parse_args(argv)
    names = {s.name for s in SCENARIOS}
    chosen = list(SCENARIOS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(sorted(names))}")
        chosen = [s for s in SCENARIOS if s.name in wanted]
    if args.steps < 160:
        parser.error("--steps must be at least 160: the leaks start at step 100-150 and need room to show")
    if not args.tiny and not cuda_available():
        parser.error("no CUDA GPU here; run with --tiny for the CPU traces")
    budget = args.budget_s if args.budget_s is not None else (None if args.tiny else 170.0)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = out / "_work"
    started = time.perf_counter()
    setup, info = build(args.tiny)
    release_memory()  # what loading the model freed is not the first scenario's
    log(f"model ready in {time.perf_counter() - started:.1f} s on {setup.device}")
    recorded: list[dict[str, Any]] = []
    skipped: list[str] = []
    for scn in chosen:
        if budget is not None and time.perf_counter() - started > budget:
            skipped.append(scn.name)
            continue
        truth = record(scn, setup, out, args.steps, work)
        recorded.append(truth)
        planted = truth["planted_bytes"] / MIB
        log(f"{scn.name}: {args.steps} steps in {truth['seconds']:.1f} s, planted {planted:.0f} MiB")
    if work.exists():
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    manifest = {
        "environment": environment(),
        "model": info,
        "steps": args.steps,
        "tiny": args.tiny,
        "scenarios": [asdict(s) for s in chosen],
        "recorded": [t["scenario"] for t in recorded],
        "skipped_for_budget": skipped,
        "total_s": round(time.perf_counter() - started, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n", encoding="utf-8")
    note = f"; skipped for the time budget: {', '.join(skipped)}" if skipped else ""
    log(f"wrote {len(recorded)} traces to {out} in {manifest['total_s']} s{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
