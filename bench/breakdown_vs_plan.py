"""The live memory breakdown of real H200 runs beside the planner's breakdown for the same runs.

Reads the breakdown files that ``vramscope run``'s injected callback wrote beside each step log in the
framework benchmark (bench/framework_measure.py, part 9: bench/results/frameworks/part9/logs.tar.gz; run again
after the optimizer-state fix: bench/results/frameworks/session4-breakdown/logs.tar.gz) and
prints, per run, the measured categories next to ``vramscope plan``'s for the same model, shapes, recipe
and framework. Markdown, for docs/training.md.

    python bench/breakdown_vs_plan.py [--logs bench/results/frameworks/part9/logs.tar.gz]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tarfile
from pathlib import Path
from typing import Any

from vramscope.planner import plan
from vramscope.recipe import QLoraSpec
from vramscope.types import MemoryBreakdown

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "frameworks"
RUNS = ["hf-default-Llama-2-7B-b4-s1024-gc1", "trl-bf16-Llama-3-8B-b1-s4096-gc1",
        "trl-default-Qwen2.5-1.5B-b2-s1024-gc0"]


def spec_of(name: str, defaults: dict[str, Any]) -> tuple[QLoraSpec, int, int, str]:
    """The recipe the benchmark ran for a point name like ``trl-bf16-Llama-3-8B-b1-s4096-gc1``."""
    framework, variant, rest = name.split("-", 2)
    arch, b, s, gc = rest.rsplit("-", 3)
    checkpointing = gc == "gc1"
    spec = QLoraSpec(gradient_checkpointing=checkpointing)
    if framework == "trl":
        all_linear = variant == "all-linear"
        spec = spec.with_(lora_r=64 if all_linear else int(defaults["lora_r"]), lora_alpha=int(defaults["lora_alpha"]),
                          lora_targets=None if all_linear else ("q_proj", "v_proj"),
                          double_quant=bool(defaults["use_bnb_nested_quant"]), optim="adamw_torch_fused")
    fields = {f.name for f in dataclasses.fields(QLoraSpec)}
    if "framework" in fields:
        spec = spec.with_(framework=framework)
    if framework == "trl" and variant != "bf16":
        spec = spec.with_(compute_dtype="fp32")  # trl.scripts.sft's float32 default (--dtype)
    return spec, int(b[1:]), int(s[1:]), arch


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--logs", default=str(RESULTS / "part9" / "logs.tar.gz"))
    args = ap.parse_args()
    meta = json.loads((RESULTS / "part9" / "meta.json").read_text())
    with tarfile.open(args.logs) as tar:
        for name in RUNS:
            member = tar.extractfile(f"{name}/mem.steps.breakdown.json")
            if member is None:
                continue
            measured = MemoryBreakdown.from_dict(json.loads(member.read()))
            spec, batch, seq, arch = spec_of(name, meta["trl_defaults"])
            p = plan(meta["archs"][arch]["config"], batch, seq, spec)
            bd = p.breakdown
            weights = sum(measured.weights.values())
            planned_weights = bd.quantized_weights + bd.unquantized_params
            rows = [
                ("weights (4-bit and 16/32-bit)", weights, planned_weights),
                ("quantization constants", measured.quantization_constants, bd.quantization_constants),
                ("LoRA weights", measured.lora_weights, bd.lora_weights),
                ("gradients", measured.gradients, bd.lora_gradients),
                ("optimizer states (GPU)", measured.optimizer_states, bd.optimizer_states),
                ("activations, logits, temporaries", measured.activations_at_peak,
                 bd.activations + bd.logits_and_loss + bd.temporaries + bd.cublas_workspaces + bd.calibration),
                ("= peak allocated", measured.peak_allocated_bytes, p.peak_allocated_bytes),
                ("CUDA context (process - reserved)", measured.cuda_context_bytes, bd.cuda_context),
                ("= process memory", measured.process_bytes, p.process_bytes),
            ]
            print(f"\n{name} (framework {getattr(spec, 'framework', 'hf')}, peak phase planned: {p.peak_phase})\n")
            print("| GiB | measured (vramscope run, H200) | planned (vramscope plan) |")
            print("|---|---:|---:|")
            for label, m, q in rows:
                print(f"| {label} | {gib(m)} | {gib(q)} |")


if __name__ == "__main__":
    main()
