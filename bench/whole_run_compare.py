"""The whole-run truth against the planner (issue 28): reads bench/results/whole-run/measured-*.json, plans each
point on the CPU, writes bench/results/whole-run/points.json in the issue's schema and prints the errors.

    python bench/whole_run_compare.py [--results bench/results/whole-run]

Today's ``vramscope.planner.plan`` answers for the train step (HF Trainer, TRL's SFT, qlora.py's Seq2SeqTrainer),
so ``train`` points, and ``whole-run`` points of runs that only train, are planned with it, at the batch the run
really formed: ``batch x`` the longest example after truncation (the longest batch the collator can form when
it pads to the longest of each batch). Every other point (load, eval, generation, DPO and GRPO steps, and the
whole run of runs that evaluate or generate) goes through :func:`planned_for`, the one place to complete when the
planner's phase API lands; until then such points keep ``planned_* = null`` with ``"why"``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from vramscope.planner import plan  # noqa: E402
from vramscope.recipe import QLoraSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "whole-run"
SCHEMA = ("framework", "trainer", "phase", "arch", "batch", "seq", "command", "measured_peak_allocated_bytes",
          "planned_peak_allocated_bytes", "measured_process_bytes", "planned_process_bytes")
TRAIN_ONLY_TRAINERS = ("Trainer", "sft", "Seq2SeqTrainer")
OPTIMIZERS = {"paged_adamw_32bit": "paged_adamw_32bit", "paged_adamw_8bit": "paged_adamw_8bit",
              "adamw_torch": "adamw_torch", "adamw_torch_fused": "adamw_torch", "adamw_8bit": "adamw_8bit"}


def spec_of(inputs: dict[str, Any]) -> QLoraSpec:
    """The recipe the run used, from what the probe saw inside it."""
    targets = inputs.get("lora_targets")
    lora_targets = tuple(targets) if isinstance(targets, list) else None  # None: every linear layer
    dtype = str(inputs.get("compute_dtype") or "bfloat16")
    return QLoraSpec(
        bits=int(inputs.get("bits") or 4), double_quant=bool(inputs.get("double_quant")),
        quant_type=str(inputs.get("quant_type") or "nf4"), compute_dtype="fp16" if "16" in dtype and "b" not in dtype
        else "bf16", lora_r=int(inputs.get("lora_r") or 64), lora_alpha=int(inputs.get("lora_alpha") or 16),
        lora_dropout=float(inputs.get("lora_dropout") or 0.0), lora_targets=lora_targets,
        gradient_checkpointing=bool(inputs.get("gradient_checkpointing")),
        attn=str(inputs.get("attn_implementation") or "sdpa"),
        optim=OPTIMIZERS.get(str(inputs.get("optim")), "paged_adamw_32bit"),
        framework="trl" if inputs.get("framework") == "trl" else "hf")


def longest_batch_seq(point: dict[str, Any]) -> int | None:
    """The padded length of the longest batch the collator can form: the longest example after truncation."""
    inputs = point["plan_inputs"]
    lengths = (inputs.get("train_lengths") or {}).get("input_ids") or {}
    if lengths.get("max"):
        longest = int(lengths["max"])
        cap = (inputs.get("trl") or {}).get("max_length")
        return min(longest, int(cap)) if cap else longest
    if point.get("seq"):
        return int(point["seq"])
    return None


def evaluates_or_generates(point: dict[str, Any]) -> bool:
    inputs = point["plan_inputs"]
    return bool(inputs.get("eval_batch")) or point["trainer"] not in TRAIN_ONLY_TRAINERS


def plan_today(point: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    inputs = point["plan_inputs"]
    seq = longest_batch_seq(point)
    batch = int(inputs.get("train_batch") or point["batch"])
    if not seq:
        return None, None, "no sequence length known for the point"
    try:
        p = plan(inputs["model_config"], batch, seq, spec_of(inputs))
    except Exception as exc:  # a shape the planner refuses: the point stays, with why
        return None, None, f"plan() refused it: {type(exc).__name__}: {exc}"[:300]
    return p.peak_allocated_bytes, p.process_bytes, None


def planned_for(point: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    """LEAD: complete this when the planner's phase API lands (h28phases, src/vramscope/planner/): the plan of
    ``point["phase"]`` ("load", "eval", "generation", "train" of dpo/grpo, "whole-run") for the trainer
    ``point["trainer"]`` ("Trainer", "sft", "dpo", "grpo", "Seq2SeqTrainer"), from ``point["plan_inputs"]``
    (model_config, recipe, train/eval batch and the shapes seen, eval settings: prediction_loss_only,
    compute_metrics, preprocess_logits_for_metrics, eval_accumulation_steps, the eval set's lengths; TRL settings:
    max_length, max_completion_length, num_generations, generation_batch_size, beta, precompute_ref_log_probs;
    the tokenized datasets' lengths). Returns (planned peak allocated, planned process bytes, why-not or None)."""
    return None, None, "no phase API yet"


def plan_point(point: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    if point.get("failed"):
        return None, None, f"the run failed: {point.get('why')}"
    phase = point["phase"]
    if point["trainer"] in TRAIN_ONLY_TRAINERS and (
            phase == "train" or (phase == "whole-run" and not evaluates_or_generates(point)
                                 and point.get("measured_peak_phase") == "train")):
        return plan_today(point)
    return planned_for(point)


def error_pct(measured: int | None, planned: int | None) -> float | None:
    if not measured or planned is None:
        return None
    return round((planned - measured) / measured * 100, 2)


def summarize(rows: list[dict[str, Any]], key: str) -> str:
    errs = [abs(r[key]) for r in rows if r.get(key) is not None]
    if not errs:
        return "none planned"
    worst = max(rows, key=lambda r: abs(r[key]) if r.get(key) is not None else -1)
    return (f"{len(errs)} points: median |error| {statistics.median(errs):.2f}%, worst {worst[key]:+.2f}% "
            f"({worst['run']} {worst['phase']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    files = sorted(args.results.glob("measured-*.json"))
    if not files:
        print(f"no measured-*.json in {args.results}: run bench/h200/whole_run.py on a GPU, then "
              "bench/h200/whole_run_collect.py", file=sys.stderr)
        return 2
    out = []
    for f in files:
        for point in json.loads(f.read_text()):
            planned, process, why = plan_point(point)
            row = {k: point.get(k) for k in SCHEMA}
            if row["seq"] is None:  # no fixed length: the longest batch's padded length, or the first batch's
                shape = point["plan_inputs"].get("train_input_shape_first") or [None, None]
                row["seq"] = longest_batch_seq(point) or shape[-1]
            row.update(planned_peak_allocated_bytes=planned, planned_process_bytes=process, run=point["run"],
                       status=point["status"], source=f.name,
                       peak_error_pct=error_pct(point.get("measured_peak_allocated_bytes"), planned),
                       process_error_pct=error_pct(point.get("measured_process_bytes"), process))
            if point.get("measured_peak_phase"):
                row["measured_peak_phase"] = point["measured_peak_phase"]
            if why:
                row["why"] = why
            out.append(row)
    (args.results / "points.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(out)} points from {', '.join(f.name for f in files)} -> {args.results / 'points.json'}")
    for phase in sorted({r["phase"] for r in out}):
        rows = [r for r in out if r["phase"] == phase]
        unplanned = sum(1 for r in rows if r["planned_peak_allocated_bytes"] is None)
        print(f"  {phase:10} peak allocated: {summarize(rows, 'peak_error_pct')}; process: "
              f"{summarize(rows, 'process_error_pct')}; {unplanned} of {len(rows)} not planned")
    print(f"  all        peak allocated: {summarize(out, 'peak_error_pct')}; process: "
          f"{summarize(out, 'process_error_pct')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
