"""Measure QLoRA steps the way people really run them: TRL's own ``trl.scripts.sft``, an HF ``Trainer`` script
with the qlora.py recipe, and a hand-written loop, each point in a fresh process under ``vramscope run``.

The planner is held against these points per framework (bench/planner_accuracy.py, docs/planner.md).
For each architecture a random-weight bf16 checkpoint is written from its registry config, with a word-level
tokenizer; TRL reads a local folder of JSON lines whose texts are longer than the longest sequence, so every
batch is exactly batch x seq tokens. Recorded per point:

- ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the largest per-step ``torch.cuda`` peak (the step log
  of ``vramscope run``'s injected callback for TRL and the HF Trainer; the loop's own per-step readings);
- ``process_bytes``: the largest NVML reading of the process's GPU memory (what nvidia-smi shows for it),
  from the run log sampled every 0.2 s and the step log;
- ``static_allocated_bytes``: allocated when training begins (weights, LoRA).

Points run several at a time on one GPU (each process has its own allocator and CUDA context, so the
per-process figures are unaffected); a point starts only when the planner's estimate of all running points
stays under ``--gpu-budget-gib``.

Run on a GPU:  python bench/framework_measure.py --out OUT [--archs A,B] [--jobs 7] [--budget-s 480]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ARCHS: dict[str, dict[str, Any]] = {
    # name -> registry model and layer override (None = the full model)
    "Llama-2-7B": {"registry": "Llama-2-7B", "layers": None},  # full multi-head attention, 32k vocabulary
    "Llama-3-8B": {"registry": "Llama-3-8B", "layers": None},  # GQA, 128k vocabulary
    "Qwen2.5-1.5B": {"registry": "Qwen2.5-1.5B", "layers": None},  # GQA, 152k tied vocabulary, qkv bias
}
# Never used to fit anything: points of an architecture the planner was not tuned on, to check it afterwards.
HELD_OUT: dict[str, dict[str, Any]] = {
    "Mistral-7B": {"registry": "Mistral-7B", "layers": None},  # GQA, 32k vocabulary, sliding window
}
WORDS = 3000  # the tokenizer's vocabulary; the model's own vocabulary size sets the logits


@dataclass
class Point:
    arch: str
    framework: str  # hf | trl | loop
    batch: int
    seq: int
    gc: bool
    variant: str = "default"  # trl: default | bf16 (--dtype bfloat16) | all-linear (r64 on every linear)
    status: str = "pending"
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.framework}-{self.variant}-{self.arch}-b{self.batch}-s{self.seq}-gc{int(self.gc)}"


def held_out_grid() -> list[Point]:
    """A few points per framework on :data:`HELD_OUT`, at shapes and variants the main grid has too."""
    pts: list[Point] = []
    for arch in HELD_OUT:
        pts += [Point(arch, "trl", 2, 1024, True), Point(arch, "trl", 1, 2048, True, "bf16"),
                Point(arch, "trl", 1, 512, False), Point(arch, "hf", 2, 2048, True), Point(arch, "hf", 1, 512, False),
                Point(arch, "loop", 1, 1024, True)]
    return pts


def grid(archs: list[str], quick: bool) -> list[Point]:
    shapes = [(True, 1, 512), (True, 4, 1024), (True, 1, 4096), (False, 1, 512), (False, 2, 1024)]
    if quick:
        shapes = [(True, 1, 512), (False, 1, 512)]
    pts: list[Point] = []
    for gc, b, s in shapes:
        for arch in archs:
            for fw in ("trl", "hf", "loop"):
                pts.append(Point(arch, fw, b, s, gc))
    if not quick:
        for arch in archs:
            for gc, b, s in [(True, 4, 1024), (True, 1, 4096)]:
                pts.append(Point(arch, "trl", b, s, gc, "bf16"))
            pts.append(Point(arch, "trl", 4, 1024, True, "all-linear"))
    return pts


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer beside the checkpoint; a byte-level one where transformers ignores it.

    transformers 5's AutoTokenizer picks the tokenizer class from config.json's model_type for some models
    (qwen2: Qwen2Tokenizer) and then ignores a saved word-level tokenizer.json: it encodes "w1 w2" to no tokens,
    TRL appends EOS, and every sequence is 1 token long. Such models get a byte-level BPE tokenizer of their own
    class instead (one token per character; the texts are long enough that truncation sets the length).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, "<s>": 2, "</s>": 3}
    for i in range(WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
                                   eos_token="</s>", model_max_length=1 << 20)
    fast.save_pretrained(folder)
    if len(AutoTokenizer.from_pretrained(folder)("w1 w2")["input_ids"]) >= 2:
        return
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for special in ("<|endoftext|>", "[PAD]"):
        chars[special] = len(chars)
    byte_level = Qwen2Tokenizer(vocab=chars, merges=[], unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                                pad_token="[PAD]", model_max_length=1 << 20)
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / stale).unlink(missing_ok=True)
    byte_level.save_pretrained(folder)
    if len(AutoTokenizer.from_pretrained(folder)("w1 w2")["input_ids"]) < 2:
        raise RuntimeError(f"no tokenizer that AutoTokenizer keeps for {folder}")


def write_dataset(folder: Path, longest: int, rows: int = 96) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with (folder / "train.jsonl").open("w") as f:
        for _ in range(rows):
            text = " ".join(f"w{rng.randrange(WORDS)}" for _ in range(longest + 64))
            f.write(json.dumps({"text": text}) + "\n")


def make_checkpoints(archs: list[str], root: Path) -> dict[str, dict[str, Any]]:
    import torch

    from vramscope.planner import registry
    from vramscope.tune.qlora import write_random_checkpoint

    configs: dict[str, dict[str, Any]] = {}
    for arch in archs:
        spec = {**ARCHS, **HELD_OUT}[arch]
        config = dict(registry.get_config(spec["registry"]))
        if spec["layers"]:
            config["num_hidden_layers"] = spec["layers"]
        folder = root / arch
        started = time.perf_counter()
        if not (folder / "config.json").exists():
            write_random_checkpoint(config, folder, device="cuda")
            write_tokenizer(folder)
            torch.cuda.empty_cache()
        configs[arch] = {"config": json.loads((folder / "config.json").read_text()), "dir": str(folder),
                         "write_s": round(time.perf_counter() - started, 1)}
        print(f"checkpoint {arch}: {configs[arch]['write_s']} s", flush=True)
    return configs


def command(p: Point, ckpt: str, data: Path, pdir: Path) -> list[str]:
    py = sys.executable
    if p.framework == "trl":
        cmd = [py, "-m", "trl.scripts.sft", "--model_name_or_path", ckpt, "--dataset_name", str(data),
               "--load_in_4bit", "--use_peft", "--per_device_train_batch_size", str(p.batch),
               "--max_length", str(p.seq), "--gradient_checkpointing", str(p.gc), "--max_steps", "4",
               "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
               "--output_dir", str(pdir / "trl-out")]
        if p.variant == "bf16":
            cmd += ["--dtype", "bfloat16"]
        if p.variant == "all-linear":
            cmd += ["--lora_target_modules", "all-linear", "--lora_r", "64"]
        return cmd
    if p.framework == "hf":
        return [py, str(HERE / "frameworks" / "hf_trainer_qlora.py"), "--model", ckpt, "--batch", str(p.batch),
                "--seq", str(p.seq), "--gradient-checkpointing" if p.gc else "--no-gradient-checkpointing"]
    return [py, str(HERE / "frameworks" / "loop_qlora.py"), "--model", ckpt, "--batch", str(p.batch), "--seq",
            str(p.seq), "--gradient-checkpointing" if p.gc else "--no-gradient-checkpointing",
            "--result", str(pdir / "loop.json")]


def estimate_gib(p: Point, config: dict[str, Any]) -> float:
    """What the point may need, to schedule points side by side (the hf-recipe plan, with room)."""
    from vramscope.planner import plan
    from vramscope.recipe import QLoraSpec

    est = plan(config, p.batch, p.seq, QLoraSpec(gradient_checkpointing=p.gc)).process_bytes / 2**30
    return est * 1.4 + 3.0


def _ints(rows: list[dict[str, str]], key: str) -> list[int]:
    return [int(r[key]) for r in rows if r.get(key) not in (None, "")]


def collect(p: Point, pdir: Path, rc: int, wall: float) -> None:
    out = (pdir / "stdout.txt").read_text(errors="replace") if (pdir / "stdout.txt").exists() else ""
    res: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 1)}
    if "OutOfMemoryError" in out or "CUDA out of memory" in out:
        p.status = "oom"
    elif rc != 0:
        p.status = "error"
        res["error_tail"] = out[-600:]
    else:
        p.status = "ok"
    run_rows: list[dict[str, str]] = []
    if (pdir / "mem.csv").exists():
        run_rows = list(csv.DictReader((pdir / "mem.csv").open()))
    step_rows: list[dict[str, str]] = []
    if (pdir / "mem.steps.csv").exists():
        step_rows = list(csv.DictReader((pdir / "mem.steps.csv").open()))
    train = [r for r in step_rows if r.get("phase") == "train"]
    proc = _ints(run_rows, "process_bytes") + _ints(step_rows, "process_bytes")
    res["process_bytes"] = max(proc) if proc else None
    if p.framework == "loop" and (pdir / "loop.json").exists():
        loop = json.loads((pdir / "loop.json").read_text())
        res["step_peaks"] = [s["peak_allocated_bytes"] for s in loop["steps"]]
        res["peak_allocated_bytes"] = max(res["step_peaks"])
        res["peak_reserved_bytes"] = max(s["peak_reserved_bytes"] for s in loop["steps"])
        res["static_allocated_bytes"] = loop["static_allocated_bytes"]
    elif train:
        res["step_peaks"] = _ints(train, "peak_allocated_bytes")
        res["peak_allocated_bytes"] = max(res["step_peaks"]) if res["step_peaks"] else None
        reserved = _ints(train, "reserved_bytes")
        res["peak_reserved_bytes"] = max(reserved) if reserved else None
        res["tokens"] = _ints(train, "tokens")[:4]
        start = [r for r in step_rows if r.get("phase") == "start"]
        res["static_allocated_bytes"] = _ints(start, "allocated_bytes")[0] if _ints(start, "allocated_bytes") else None
    if p.status == "ok" and not res.get("peak_allocated_bytes"):
        p.status = "no-data"
    p.result = res


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "peft", "bitsandbytes", "trl", "datasets", "accelerate"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:  # a missing library is recorded, not fatal
            out[mod] = f"missing ({type(exc).__name__})"
    return out


def trl_defaults() -> dict[str, Any]:
    try:
        from trl import ModelConfig, SFTConfig

        c = SFTConfig(output_dir="/tmp/trl-defaults")
        m = ModelConfig()
        return {"optim": str(c.optim), "max_length": c.max_length, "gradient_checkpointing": c.gradient_checkpointing,
                "gradient_checkpointing_kwargs": c.gradient_checkpointing_kwargs, "bf16": c.bf16,
                "learning_rate": c.learning_rate, "packing": c.packing, "padding_free": c.padding_free,
                "loss_type": getattr(c, "loss_type", None), "lora_r": m.lora_r, "lora_alpha": m.lora_alpha,
                "lora_dropout": m.lora_dropout, "lora_target_modules": m.lora_target_modules, "dtype": m.dtype,
                "bnb_4bit_quant_type": m.bnb_4bit_quant_type, "use_bnb_nested_quant": m.use_bnb_nested_quant}
    except Exception as exc:
        return {"error": repr(exc)}


def write_points(path: Path, points: list[Point], meta: dict[str, Any]) -> None:
    fields = ["arch", "framework", "variant", "batch_size", "seq_len", "gradient_checkpointing", "status",
              "peak_allocated_bytes", "peak_reserved_bytes", "process_bytes", "static_allocated_bytes",
              "step_peaks", "tokens", "wall_s", "device", "date"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for p in points:
            r = p.result
            w.writerow({"arch": p.arch, "framework": p.framework, "variant": p.variant, "batch_size": p.batch,
                        "seq_len": p.seq, "gradient_checkpointing": p.gc, "status": p.status,
                        "peak_allocated_bytes": r.get("peak_allocated_bytes"),
                        "peak_reserved_bytes": r.get("peak_reserved_bytes"), "process_bytes": r.get("process_bytes"),
                        "static_allocated_bytes": r.get("static_allocated_bytes"),
                        "step_peaks": " ".join(map(str, r.get("step_peaks", []))),
                        "tokens": " ".join(map(str, r.get("tokens", []))), "wall_s": r.get("wall_s"),
                        "device": meta["device"], "date": meta["date"]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--jobs", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no point after this many seconds")
    ap.add_argument("--point-timeout-s", type=float, default=240.0)
    ap.add_argument("--gpu-budget-gib", type=float, default=120.0)
    ap.add_argument("--work", default="/tmp/fw")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None, help="a regular expression: run only the points whose name matches")
    ap.add_argument("--held-out", action="store_true", help="run only the held-out architectures' points")
    args = ap.parse_args()
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    archs = list(HELD_OUT) if args.held_out else args.archs.split(",")
    points = held_out_grid() if args.held_out else grid(archs, args.quick)
    if args.only:
        points = [p for p in points if re.search(args.only, p.name)]
    data = work / "data"
    write_dataset(data, max(p.seq for p in points))
    configs = make_checkpoints(archs, work / "ckpt")
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": versions(),
            "trl_defaults": trl_defaults(), "archs": configs}
    try:
        import torch

        meta["device"] = torch.cuda.get_device_name(0)
    except Exception as exc:
        meta["device"] = f"unknown ({exc})"
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1",
               HF_DATASETS_CACHE=str(work / "hf-datasets"))
    est = {p.name: estimate_gib(p, configs[p.arch]["config"]) for p in points}
    queue = list(points)
    running: dict[str, tuple[Point, subprocess.Popen[bytes], float, Any]] = {}
    while queue or running:
        now = time.perf_counter() - started
        for name, (p, proc, t0, fh) in list(running.items()):
            rc = proc.poll()
            if rc is None and time.perf_counter() - t0 > args.point_timeout_s:
                proc.kill()
                rc = proc.wait()
            if rc is not None:
                fh.close()
                collect(p, work / "points" / name, rc, time.perf_counter() - t0)
                print(f"[{now:6.0f}s] {name}: {p.status} {p.result.get('peak_allocated_bytes')}", flush=True)
                write_points(out / "points.csv", points, meta)  # a run cut short keeps what it measured
                del running[name]
        if now > args.budget_s:
            for p in queue:
                p.status = "not-run"
            queue = []
        used = sum(est[n] for n in running)
        for p in list(queue):
            if len(running) >= args.jobs:
                break
            if running and used + est[p.name] > args.gpu_budget_gib:
                continue
            pdir = work / "points" / p.name
            pdir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "vramscope", "run", "--quiet", "--log", str(pdir / "mem.csv"),
                   "--interval", "0.2", "--", *command(p, configs[p.arch]["dir"], data, pdir)]
            fh = (pdir / "stdout.txt").open("wb")
            running[p.name] = (p, subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=pdir),
                               time.perf_counter(), fh)
            used += est[p.name]
            queue.remove(p)
        time.sleep(0.5)
    write_points(out / "points.csv", points, meta)
    (out / "errors.json").write_text(json.dumps({p.name: p.result.get("error_tail") for p in points
                                                 if p.status == "error"}, indent=1))
    with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
        for pdir in sorted((work / "points").iterdir()):
            for fname in ("mem.csv", "mem.steps.csv", "mem.steps.breakdown.json", "loop.json", "stdout.txt"):
                if (pdir / fname).exists():
                    tar.add(pdir / fname, arcname=f"{pdir.name}/{fname}")
    ok = sum(p.status == "ok" for p in points)
    print(f"{ok} of {len(points)} points ok in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
