"""The H200 truth of issue 28 ("the whole run, not one step"): train, eval and generation phases under the HF
Trainer, TRL's sft / dpo / grpo scripts and artidoro/qlora's qlora.py, on architectures no fit used, each point a
fresh process under ``vramscope run`` (its injected callback writes the step log: phases, tokens, exact per-step
allocator peaks; the run log samples NVML's per-process memory every 0.2 s).

    python bench/h200/whole_run.py --out OUT --archs Llama-3.1-8B,Phi-3-mini,Llama-2-7B [--budget-s 330]

It records, per run, everything the planner needs to plan it afterwards on a CPU (the config.json fields, LoRA,
bits, dtype, checkpointing, optimizer, batch and eval settings, the dataset's token lengths, TRL's settings), the
measured peaks per phase, the process memory, and the checks that the run measured what was meant (tokens per
step, Linear4bit count, dtypes, attention implementation) into ``OUT/measured.json`` (rewritten after every point,
so that a run cut short keeps what it measured), and the step logs into ``OUT/logs.tar.gz``.
bench/whole_run_compare.py turns the file into points.json with the plan beside each measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path[:0] = [str(HERE), str(BENCH)]

import whole_run_data  # noqa: E402

PY = sys.executable
# name -> registry model and the config fields changed (None: the registry's config as it is)
ARCHS: dict[str, dict[str, Any]] = {
    "Llama-3.1-8B": {"registry": "Llama-3.1-8B"},  # GQA, 128k vocabulary, llama3 rope scaling
    "Phi-3-mini": {"registry": "Phi-3-mini"},  # fused qkv_proj / gate_up_proj, 32k vocabulary
    "Qwen2.5-7B": {"registry": "Qwen2.5-7B"},  # GQA, 152k vocabulary, qkv bias; token ids (Qwen2Tokenizer)
    "Llama-2-7B": {"registry": "Llama-2-7B"},  # qlora.py's 7B (the fitted shape: the point is the client)
    # A Qwen-MoE shape (Qwen1.5-MoE-A2.7B's) with 4 of its 24 layers, so that it loads in seconds.
    "Qwen1.5-MoE-A2.7B-4L": {"config": {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
        "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_experts": 60, "num_experts_per_tok": 4, "num_attention_heads": 16, "num_key_value_heads": 16,
        "num_hidden_layers": 4, "vocab_size": 151936, "max_position_embeddings": 8192, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06, "decoder_sparse_step": 1, "norm_topk_prob": False, "tie_word_embeddings": False,
        "use_sliding_window": False, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 2,
        "eos_token_id": 3}, "scaled_from": "Qwen1.5-MoE-A2.7B (24 layers)"},
    # Mixtral-8x7B with 2 of its 32 layers: the experts are fused 3-D parameters under transformers 5.
    "Mixtral-8x7B-2L": {"registry": "Mixtral-8x7B", "override": {"num_hidden_layers": 2},
                        "scaled_from": "Mixtral-8x7B (32 layers)"},
    # Session 8's check of the loading region and the expert upcast's holes (planner/pool.loading_region,
    # memory.expert_upcast_holes) on architectures none of it was read from:
    "Mistral-Nemo-12B": {"registry": "Mistral-Nemo-12B"},  # 131k vocabulary: a 2560 MiB region, head_dim 128
    "Gemma-2-9B": {"registry": "Gemma-2-9B"},  # tied 256k embedding: one tensor's region, soft-capping
    "Llama-3.2-3B": {"registry": "Llama-3.2-3B"},  # tied 128k embedding: a region smaller than the fp32 logits
    # Qwen3-MoE (Qwen3-30B-A3B's shape) with 2 of its 48 layers: 128 fused experts, peft's MoE conversion
    "Qwen3-30B-A3B-2L": {"registry": "Qwen3-30B-A3B", "override": {"num_hidden_layers": 2},
                         "scaled_from": "Qwen3-30B-A3B (48 layers)"},
}
CHECK_ARCHS = ("Mistral-Nemo-12B", "Gemma-2-9B", "Llama-3.2-3B")


@dataclass
class Point:
    name: str
    arch: str
    framework: str  # hf | trl | qlora.py | tiny
    trainer: str  # Trainer | sft | dpo | grpo | Seq2SeqTrainer
    batch: int
    seq: int | None
    cmd: list[str]  # after the checkpoint folder and data folder are filled in ({ckpt}, {data}, {out})
    est_gib: float
    settings: dict[str, Any] = field(default_factory=dict)
    dataset: str | None = None
    cwd: str | None = None
    plain: bool = False  # run without vramscope (the peak-counter's baseline)
    status: str = "pending"
    result: dict[str, Any] = field(default_factory=dict)


def hf(arch: str, tag: str, batch: int, seq: int | None, data: str, est: float, *extra: str,
       settings: dict[str, Any] | None = None) -> Point:
    cmd = [PY, str(HERE / "whole_run_hf.py"), "--model", "{ckpt}", "--data", "{data}/" + data, "--output-dir",
           "{out}/hf-out", "--batch", str(batch), *extra]
    return Point(f"hf-{tag}-{arch}", arch, "hf", "Trainer", batch, seq, cmd, est, settings or {}, data)


TRL_COMMON = ["--load_in_4bit", "--use_peft", "--dtype", "bfloat16", "--gradient_checkpointing", "True",
              "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--output_dir", "{out}/trl-out"]


def trl(arch: str, script: str, tag: str, batch: int, seq: int | None, data: str, est: float, *extra: str) -> Point:
    cmd = [PY, str(HERE / "whole_run_probe.py"), "-m", f"trl.scripts.{script}", "--", "--model_name_or_path",
           "{ckpt}", "--dataset_name", "{data}/" + data, "--per_device_train_batch_size", str(batch),
           *TRL_COMMON, *extra]
    return Point(f"trl-{script}-{tag}-{arch}", arch, "trl", script, batch, seq, cmd, est, {}, data)


def arch_points(arch: str, big: bool) -> list[Point]:
    """The per-architecture set: HF Trainer eval three ways (with a save and an epoch end), TRL sft with eval,
    dpo (adapter as the reference; and precompute_ref_log_probs), grpo without vLLM."""
    k = 1.0 if big else 0.6
    pts = _arch_points(arch, k)
    if arch == "Phi-3-mini":
        # TRL's --use_peft without --lora_target_modules: peft finds no default targets for phi3 (fused qkv_proj,
        # gate_up_proj) and stops ("Please specify `target_modules`"), seen on the H200 2026-12-01. Again with
        # every linear layer named, as such a user must.
        for p in [q for q in pts if q.framework == "trl"]:
            pts.append(Point(p.name.replace(f"-{arch}", f"+all-linear-{arch}"), arch, "trl", p.trainer, p.batch,
                             p.seq, [*p.cmd, "--lora_target_modules", "all-linear"], p.est_gib, {}, p.dataset))
    return pts


def _arch_points(arch: str, k: float) -> list[Point]:
    return [
        # 2 epochs of 4 steps (8 rows of 1024, batch 2): eval (loss only) at 3 and 6, a checkpoint save at 3 and 6.
        hf(arch, "evalloss-save-epochs", 2, 1024, "ids-1024", 22 * k, "--eval", "loss", "--eval-batch", "4",
           "--eval-steps", "3", "--save-steps", "3", "--epochs", "2"),
        # compute_metrics keeps every eval batch's logits on the GPU (eval_accumulation_steps unset): 16 x 512.
        hf(arch, "evallogits", 2, 512, "ids-512-eval16", 30 * k, "--eval", "logits", "--eval-batch", "4",
           "--eval-steps", "2", "--max-steps", "4"),
        hf(arch, "evalargmax", 2, 512, "ids-512-eval16", 20 * k, "--eval", "argmax", "--eval-batch", "4",
           "--eval-steps", "2", "--max-steps", "4"),
        trl(arch, "sft", "eval", 2, 1024, "ids-1024", 16 * k, "--max_length", "1024", "--max_steps", "4",
            "--eval_strategy", "steps", "--eval_steps", "2", "--per_device_eval_batch_size", "4"),
        trl(arch, "dpo", "peft", 2, 1024, "dpo-100-300-400", 20 * k, "--max_length", "1024", "--max_steps", "4",
            "--lora_r", "16", "--lora_alpha", "32"),
        trl(arch, "dpo", "precompute", 2, 1024, "dpo-100-300-400", 20 * k, "--max_length", "1024",
            "--max_steps", "4", "--lora_r", "16", "--lora_alpha", "32", "--precompute_ref_log_probs", "True"),
        trl(arch, "grpo", "g8-c256", 8, None, "grpo-64", 22 * k, "--reward_funcs", "whole_run_reward.length_reward",
            "--num_generations", "8", "--max_completion_length", "256", "--max_steps", "3", "--lora_r", "16",
            "--lora_alpha", "32"),
    ]


QLORA_FLAGS = [  # scripts/finetune_guanaco_7b.sh (artidoro/qlora 7f4e95a), changed where marked
    "--model_name_or_path", "{ckpt}", "--output_dir", "{out}/qlora-out",  # was huggyllama/llama-7b, ./output/...
    "--logging_steps", "10", "--save_strategy", "steps", "--data_seed", "42",
    "--save_steps", "3",  # was 500: a save inside the short run
    "--save_total_limit", "40", "--evaluation_strategy", "steps", "--eval_dataset_size", "1024",
    "--max_eval_samples", "32",  # was 1000: a small eval set
    "--per_device_eval_batch_size", "1", "--max_new_tokens", "32", "--dataloader_num_workers", "3",
    "--group_by_length", "--logging_strategy", "steps", "--remove_unused_columns", "False", "--do_train",
    "--do_eval", "--do_mmlu_eval",
    "--max_mmlu_samples", "16",  # added: 16 of the 1531 five-shot MMLU validation questions
    "--lora_r", "64", "--lora_alpha", "16", "--lora_modules", "all", "--double_quant", "--quant_type", "nf4",
    "--bf16", "--bits", "4", "--warmup_ratio", "0.03", "--lr_scheduler_type", "constant",
    "--gradient_checkpointing",
    "--dataset", "{data}/qlora-io/train.jsonl",  # was oasst1 (a hub dataset): local input/output JSON lines
    "--source_max_len", "16", "--target_max_len", "512", "--per_device_train_batch_size", "1",
    "--gradient_accumulation_steps", "16",
    "--max_steps", "6", "--eval_steps", "3",  # were 1875 and 187
    "--learning_rate", "0.0002", "--adam_beta2", "0.999", "--max_grad_norm", "0.3", "--lora_dropout", "0.1",
    "--weight_decay", "0.0", "--seed", "0",
]


def all_points(qlora_dir: Path | None) -> list[Point]:
    pts: list[Point] = []
    # The long tail first: a whole epoch of 1005 examples, batch 4, padded to the longest of each batch.
    pts.append(hf("Llama-3.1-8B", "longtail", 4, None, "longtail", 40, "--epochs", "1"))
    pts.append(trl("Llama-3.1-8B", "sft", "longtail", 4, None, "longtail", 30, "--max_length", "8192",
                   "--num_train_epochs", "1"))
    if qlora_dir is not None:
        cmd = [PY, str(HERE / "whole_run_probe.py"), "--qlora-shims", str(qlora_dir / "qlora.py"), "--",
               *QLORA_FLAGS]
        pts.append(Point("qlora.py-guanaco7b-Llama-2-7B", "Llama-2-7B", "qlora.py", "Seq2SeqTrainer", 1, 528, cmd,
                         16, {}, "qlora-io", cwd=str(qlora_dir)))
    pc = [PY, str(HERE / "whole_run_peak_counter.py"), "--result", "{out}/peak-counter.json", "--out-dir",
          "{out}/pc-out"]
    pts.append(Point("peak-counter-vramscope", "tiny-llama-2L", "tiny", "Trainer", 4, 512, pc, 2))
    pts.append(Point("peak-counter-plain", "tiny-llama-2L", "tiny", "Trainer", 4, 512, pc, 2, plain=True))
    for arch, big in (("Llama-3.1-8B", True), ("Phi-3-mini", False), ("Qwen2.5-7B", True)):
        pts += arch_points(arch, big)
    pts.append(trl("Llama-3.1-8B", "grpo", "g8-c256-beta0.04", 8, None, "grpo-64", 24,
                   "--reward_funcs", "whole_run_reward.length_reward", "--num_generations", "8",
                   "--max_completion_length", "256", "--max_steps", "3", "--lora_r", "16", "--lora_alpha", "32",
                   "--beta", "0.04"))
    for moe in ("Qwen1.5-MoE-A2.7B-4L", "Mixtral-8x7B-2L"):
        # peft has no default targets for qwen2_moe/mixtral (seen on the H200 2026-12-01: "Please specify
        # `target_modules`"), so the user names every linear layer; and for Mixtral's fused 3-D experts peft's
        # ParamWrapper takes no dropout ("lora.ParamWrapper does not work with lora_dropout != 0").
        no_dropout = ["--lora_dropout", "0"] if moe.startswith("Mixtral") else []
        pts.append(trl(moe, "sft", "ids", 2, 1024, "ids-1024", 14, "--max_length", "1024", "--max_steps", "4",
                       "--lora_target_modules", "all-linear", *no_dropout))
        pts.append(hf(moe, "evalloss", 2, 1024, "ids-1024", 16, "--eval", "loss", "--eval-batch", "4",
                      "--eval-steps", "2", "--max-steps", "4",
                      *(["--lora-dropout", "0"] if moe.startswith("Mixtral") else [])))
    for arch in CHECK_ARCHS:  # the HF evaluations the pool model is about, and TRL's beside them
        big = arch != "Llama-3.2-3B"
        pts += [q for q in _arch_points(arch, 1.0 if big else 0.6)
                if q.name.startswith(("hf-evalargmax-", "hf-evallogits-", "trl-sft-eval-"))]
    moe = "Qwen3-30B-A3B-2L"  # all-linear reaches the fused experts (ParamWrapper: no dropout)
    pts.append(trl(moe, "sft", "ids", 2, 1024, "ids-1024", 14, "--max_length", "1024", "--max_steps", "4",
                   "--lora_target_modules", "all-linear", "--lora_dropout", "0"))
    pts.append(hf(moe, "evalloss", 2, 1024, "ids-1024", 18, "--eval", "loss", "--eval-batch", "4",
                  "--eval-steps", "2", "--max-steps", "4", "--lora-dropout", "0"))
    return pts


# -- checkpoints --------------------------------------------------------------------------------------------
TINY_SMOKE = os.environ.get("WR_TINY_SMOKE") == "1"  # a CPU dry run of the driver: every arch a 2-layer toy


def arch_config(arch: str) -> dict[str, Any]:
    from vramscope.planner import registry

    if TINY_SMOKE:
        return {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 3100,
                "max_position_embeddings": 8192, "bos_token_id": 2, "eos_token_id": 3}
    spec = ARCHS[arch]
    if "config" in spec:
        return dict(spec["config"])
    config = dict(registry.get_config(spec["registry"]))
    config.update(spec.get("override", {}))
    return config


def _folder_name(arch: str) -> str:
    # No 'llama' in the name: qlora.py would then ask for a sentencepiece LlamaTokenizer (tokenizer_type='llama').
    return re.sub(r"[^A-Za-z0-9]+", "-", arch).lower().replace("llama", "lm")


def place_checkpoints(archs: list[str], configs: dict[str, dict[str, Any]]) -> dict[str, Path]:
    """Each checkpoint in /dev/shm while it has room (RAM: reading is fastest there), keeping room for the
    processes' own memory; the rest on disk."""
    from common import approx_checkpoint_bytes

    shm = Path("/dev/shm")
    room = 0
    if shm.is_dir() and os.access(shm, os.W_OK):
        room = min(shutil.disk_usage(shm).free - 6 * 2**30, 60 * 2**30)
    disk = shutil.disk_usage("/tmp").free - 6 * 2**30
    out = {}
    for arch in archs:  # in the order of the points: the first ones are the most wanted
        size = int(approx_checkpoint_bytes(configs[arch]) * 1.05)
        if size < room:
            out[arch] = shm / "wr-ckpt" / _folder_name(arch)
            room -= size
        elif size < disk:
            out[arch] = Path("/tmp/wr-ckpt") / _folder_name(arch)
            disk -= size
        else:
            print(f"no room for the checkpoint of {arch} ({size / 2**30:.1f} GiB)", flush=True)
    return out


def start_checkpoint(arch: str, folder: Path, log: Path) -> subprocess.Popen[bytes] | None:
    """A random-weight bf16 checkpoint with a word-level tokenizer (bench/framework_measure.py's), written on
    the GPU in its own process."""
    if (folder / ".complete").exists():
        return None
    folder.parent.mkdir(parents=True, exist_ok=True)
    code = ("import json,sys;from pathlib import Path;sys.path[:0]=[%r];"  # noqa: UP031 - code, full of braces
            "from vramscope.tune.qlora import write_random_checkpoint;import framework_measure as fm;"
            "f=Path(%r);c=json.loads(%r);write_random_checkpoint(c,f,device=%r);fm.write_tokenizer(f);"
            "(f/'.complete').write_text('ok')") % (str(BENCH), str(folder), json.dumps(arch_config(arch)),
                                                  None if TINY_SMOKE else "cuda")
    return subprocess.Popen([PY, "-c", code], stdout=log.open("wb"), stderr=subprocess.STDOUT)


# -- reading a point's logs ---------------------------------------------------------------------------------
def _int(v: str | None) -> int | None:
    return int(v) if v not in (None, "") else None


def collect(p: Point, pdir: Path, rc: int, wall: float) -> None:
    out = (pdir / "stdout.txt").read_text(errors="replace") if (pdir / "stdout.txt").exists() else ""
    res: dict[str, Any] = {"rc": rc, "wall_s": round(wall, 1)}
    if "OutOfMemoryError" in out or "CUDA out of memory" in out:
        p.status = "oom"
    elif rc != 0:
        p.status = "error"
    else:
        p.status = "ok"
    if p.status != "ok":
        res["error_tail"] = out[-1500:]
    run_rows = list(csv.DictReader((pdir / "mem.csv").open())) if (pdir / "mem.csv").exists() else []
    steps = list(csv.DictReader((pdir / "mem.steps.csv").open())) if (pdir / "mem.steps.csv").exists() else []
    proc = [x for x in (_int(r.get("process_bytes")) for r in run_rows + steps) if x]
    res["measured_process_bytes"] = max(proc) if proc else None
    res["run_log_max_allocated_bytes"] = max((x for x in (_int(r.get("peak_allocated_bytes")) for r in run_rows)
                                              if x), default=None)
    phases: dict[str, dict[str, Any]] = {}
    rows = []
    for r in steps:
        ph = r.get("phase") or "?"
        peak = _int(r.get("peak_allocated_bytes"))
        rows.append([_int(r.get("step")), ph, _int(r.get("tokens")), peak, _int(r.get("allocated_bytes")),
                     _int(r.get("reserved_bytes")), _int(r.get("process_bytes"))])
        d = phases.setdefault(ph, {"rows": 0, "peak_allocated_bytes": None, "peak_step": None, "tokens_at_peak": None})
        d["rows"] += 1
        if peak is not None and (d["peak_allocated_bytes"] is None or peak > d["peak_allocated_bytes"]):
            d.update(peak_allocated_bytes=peak, peak_step=_int(r.get("step")), tokens_at_peak=_int(r.get("tokens")))
        procb = _int(r.get("process_bytes"))
        if procb:
            d["process_bytes_max"] = max(d.get("process_bytes_max", 0), procb)
    res["phases"] = phases
    res["step_rows_columns"] = ["step", "phase", "tokens", "peak_allocated", "allocated", "reserved", "process"]
    res["step_rows"] = rows if len(rows) <= 40 else rows[:20] + rows[-20:]
    train_tokens = [r[2] for r in rows if r[1] == "train" and r[2] is not None]
    res["tokens_check"] = {"train_rows": len(train_tokens), "first_tokens": train_tokens[:6],
                           "min": min(train_tokens, default=None), "max": max(train_tokens, default=None)}
    peaks = [d["peak_allocated_bytes"] for d in phases.values() if d["peak_allocated_bytes"]]
    res["measured_peak_allocated_bytes"] = max(peaks) if peaks else None
    if (pdir / "checks.json").exists():
        try:
            res["checks"] = json.loads((pdir / "checks.json").read_text())
        except ValueError as exc:
            res["checks"] = {"error": repr(exc)}
    gen = (res.get("checks") or {}).get("generate_calls") or []
    if gen:
        res["generation"] = {"calls": len(gen), "peak_allocated_bytes": max(g["peak_allocated"] for g in gen),
                             "first": gen[0], "output_shapes": sorted({str(g["output_shape"]) for g in gen})}
    if (pdir / "peak-counter.json").exists():
        res["peak_counter"] = json.loads((pdir / "peak-counter.json").read_text())
    if p.status == "ok" and not peaks and p.framework != "tiny":
        p.status = "no-data"
    p.result = res


def record(p: Point, ckpt: str | None, data: Path, pdir: Path, configs: dict[str, Any],
           datasets: dict[str, Any]) -> dict[str, Any]:
    fill = {"{ckpt}": ckpt or "", "{data}": str(data), "{out}": str(pdir)}
    cmd = [_fill(a, fill) for a in p.cmd]
    user_cmd = cmd
    if "whole_run_probe.py" in " ".join(cmd[:3]):  # what a user types: the program, not the probe around it
        cut = cmd.index("--")
        user_cmd = ([PY, "-m", cmd[cmd.index("-m") + 1]] if "-m" in cmd[:cut] else [PY, cmd[cut - 1]]) + cmd[cut + 1:]
    return {
        "name": p.name, "framework": p.framework, "trainer": p.trainer, "arch": p.arch, "batch": p.batch,
        "seq": p.seq, "status": p.status, "command": " ".join(user_cmd), "launched_as": " ".join(cmd),
        "under_vramscope": not p.plain, "cwd": p.cwd, "dataset": p.dataset,
        "dataset_description": datasets.get(p.dataset or ""), "model_config": configs.get(p.arch),
        "arch_note": ARCHS.get(p.arch, {}).get("scaled_from"), "est_gib": p.est_gib, **p.result,
    }


def _fill(arg: str, fill: dict[str, str]) -> str:
    for k, v in fill.items():
        arg = arg.replace(k, v)
    return arg


def versions() -> dict[str, str]:
    out = {}
    for mod in ("torch", "transformers", "peft", "bitsandbytes", "trl", "datasets", "accelerate"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as exc:
            out[mod] = f"missing ({type(exc).__name__})"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", default="/tmp/wr", type=Path)
    ap.add_argument("--archs", default=",".join(ARCHS), help="only points on these architectures (and tiny)")
    ap.add_argument("--only", default=None, help="a regular expression on point names")
    ap.add_argument("--skip", default=None, help="a regular expression on point names to leave out")
    ap.add_argument("--qlora-dir", type=Path, default=None, help="a folder with artidoro/qlora's qlora.py, data/")
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=330.0, help="start no point after this many seconds")
    ap.add_argument("--deadline-s", type=float, default=500.0, help="kill what still runs after this")
    ap.add_argument("--gpu-budget-gib", type=float, default=128.0)
    args = ap.parse_args()
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    archs = set(args.archs.split(","))
    points = [p for p in all_points(args.qlora_dir) if p.arch in archs or p.framework == "tiny"]
    if args.only:
        points = [p for p in points if re.search(args.only, p.name)]
    if args.skip:
        points = [p for p in points if not re.search(args.skip, p.name)]
    data = args.work / "data"
    datasets = whole_run_data.write_all(data)
    need = list(dict.fromkeys(p.arch for p in points if p.arch in ARCHS))
    configs = {a: arch_config(a) for a in need}
    folders = place_checkpoints(need, configs)
    for p in points:
        if p.arch in ARCHS and p.arch not in folders:
            p.status, p.result = "not-run", {"why": "no room on the machine for its checkpoint"}
    points_to_run = [p for p in points if p.status == "pending"]
    (args.work / "logs").mkdir(parents=True, exist_ok=True)
    writers = {a: start_checkpoint(a, f, args.work / "logs" / f"ckpt-{a}.txt") for a, f in folders.items()}
    print(f"[{time.perf_counter() - started:5.0f}s] {len(points)} points; checkpoints {folders}", flush=True)
    meta: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": versions(),
                            "checkpoints": {a: str(f) for a, f in folders.items()},
                            "gpu_budget_gib": args.gpu_budget_gib, "argv": sys.argv}
    try:
        import torch

        meta["device"] = torch.cuda.get_device_name(0)
        meta["device_total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    except Exception as exc:
        meta["device"] = f"unknown ({exc})"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1",
               HF_DATASETS_CACHE=str(args.work / "hf-datasets"), TRANSFORMERS_VERBOSITY="error")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    queue = list(points_to_run)
    running: dict[str, tuple[Point, subprocess.Popen[bytes], float, Any]] = {}
    records: dict[str, dict[str, Any]] = {}

    def ready(arch: str) -> bool:
        if arch not in ARCHS:
            return True
        if arch not in folders:
            return False
        w = writers.get(arch)
        if w is not None and w.poll() is None:
            return False
        return (folders[arch] / ".complete").exists()

    def dump() -> None:
        out = [records.get(p.name) or record(p, None, data, args.work / "points" / p.name, configs, datasets)
               for p in points]
        tmp = args.out / "measured.json.tmp"
        tmp.write_text(json.dumps({"meta": meta, "points": out}, indent=1, default=str))
        os.replace(tmp, args.out / "measured.json")

    while queue or running:
        now = time.perf_counter() - started
        for name, (p, proc, t0, fh) in list(running.items()):
            rc = proc.poll()
            killed = False
            if rc is None and now > args.deadline_s:
                proc.kill()
                rc = proc.wait()
                killed = True
            if rc is not None:
                fh.close()
                pdir = args.work / "points" / name
                collect(p, pdir, rc, time.perf_counter() - t0)
                if killed:
                    p.status = "killed-at-deadline"
                    p.result["why"] = f"still running at the call's deadline ({args.deadline_s:.0f} s): killed"
                records[name] = record(p, str(folders[p.arch]) if p.arch in ARCHS else None, data,
                                       pdir, configs, datasets)
                res = p.result
                print(f"[{now:5.0f}s] {name}: {p.status} peak={res.get('measured_peak_allocated_bytes')} "
                      f"proc={res.get('measured_process_bytes')} tokens={res['tokens_check']['first_tokens']}",
                      flush=True)
                del running[name]
                dump()
        for arch, w in writers.items():
            if w is not None and w.poll() not in (None, 0) and not any(p.arch == arch for p in running.values()):
                for p in [q for q in queue if q.arch == arch]:
                    p.status = "checkpoint-failed"
                    p.result = {"error_tail": (args.work / "logs" / f"ckpt-{arch}.txt").read_text()[-1500:]}
                    queue.remove(p)
        if now > args.budget_s:
            for p in queue:
                p.status = "not-run"
                p.result = {"why": f"not started within the call's budget of {args.budget_s:.0f} s"}
            queue = []
        used = sum(p.est_gib for p, *_ in running.values())
        for p in list(queue):
            if len(running) >= args.jobs:
                break
            if not ready(p.arch) or (running and used + p.est_gib > args.gpu_budget_gib):
                continue
            pdir = args.work / "points" / p.name
            pdir.mkdir(parents=True, exist_ok=True)
            fill = {"{ckpt}": str(folders.get(p.arch, "")), "{data}": str(data), "{out}": str(pdir)}
            inner = [_fill(a, fill) for a in p.cmd]
            cmd = inner if p.plain else [PY, "-m", "vramscope", "run", "--quiet", "--log", str(pdir / "mem.csv"),
                                         "--interval", "0.2", "--", *inner]
            fh = (pdir / "stdout.txt").open("wb")
            penv = dict(env, WR_CHECKS=str(pdir / "checks.json"))
            running[p.name] = (p, subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=penv,
                                                   cwd=p.cwd or pdir), time.perf_counter(), fh)
            used += p.est_gib
            queue.remove(p)
            print(f"[{now:5.0f}s] start {p.name} (est {p.est_gib} GiB, running {len(running)}, {used:.0f} GiB)",
                  flush=True)
        time.sleep(0.5)
    dump()
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        for pdir in sorted((args.work / "points").iterdir()):
            for fname in ("mem.steps.csv", "checks.json", "stdout.txt", "peak-counter.json"):
                if (pdir / fname).exists():
                    tar.add(pdir / fname, arcname=f"{pdir.name}/{fname}")
        for f in sorted((args.work / "logs").iterdir()):
            tar.add(f, arcname=f"checkpoints/{f.name}")
    ok = sum(p.status == "ok" for p in points)
    print(f"{ok} of {len(points)} points ok in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
