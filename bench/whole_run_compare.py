"""The whole-run truth against the planner (issue 28): reads bench/results/whole-run/measured-*.json, plans each
point on the CPU, writes bench/results/whole-run/points.json in the issue's schema and prints the errors.

    python bench/whole_run_compare.py [--results bench/results/whole-run]

Every point goes through :func:`planned_for`: ``vramscope.planner.plan(..., run=RunPhases(...))`` with the
trainer, the evaluation's settings and TRL's lengths the probe saw inside the run, at the batch the run really
formed: ``batch x`` the longest example after truncation (the longest batch the collator can form when it pads
to the longest of each batch); DPO at prompt + the longer of chosen and rejected; GRPO at the probe's prompt +
completion. ``train``, ``eval`` and ``generation`` points take that phase's figure; ``whole-run`` the largest
phase (or loading, when it holds more); ``load`` the most of the static weights and adapters, from_pretrained's
own peak (``loading_transient_bytes``) and, under HF Trainer, prepare_model_for_kbit_training's upcast
(``upcast_transient_bytes``); no process figure. Failed runs stay, ``planned_* = null`` with ``"why"``.
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

from vramscope.planner import Plan, plan  # noqa: E402
from vramscope.planner.phases import RunPhases  # noqa: E402
from vramscope.recipe import QLoraSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "whole-run"
SCHEMA = ("framework", "trainer", "phase", "arch", "batch", "seq", "command", "measured_peak_allocated_bytes",
          "planned_peak_allocated_bytes", "measured_process_bytes", "planned_process_bytes")
TRAIN_ONLY_TRAINERS = ("Trainer", "sft", "Seq2SeqTrainer")
OPTIMIZERS = {"paged_adamw_32bit": "paged_adamw_32bit", "paged_adamw_8bit": "paged_adamw_8bit",
              "adamw_torch": "adamw_torch", "adamw_torch_fused": "adamw_torch", "adamw_8bit": "adamw_8bit"}


def checkpointing_of(inputs: dict[str, Any], command: str) -> bool:
    """Gradient checkpointing as the run had it. The probe reads it off the first forward, which for GRPO with
    beta != 0 is the reference's no-grad scoring pass in eval mode (``gradient_checkpointing and training`` is
    False there), so a command that turns it on explicitly wins."""
    words = command.split()
    for i, word in enumerate(words[:-1]):
        if word == "--gradient_checkpointing" and words[i + 1].lower() in ("true", "1", "yes"):
            return True
    return bool(inputs.get("gradient_checkpointing"))


def spec_of(inputs: dict[str, Any], command: str = "") -> QLoraSpec:
    """The recipe the run used, from what the probe saw inside it (and its command line)."""
    targets = inputs.get("lora_targets")
    lora_targets = tuple(targets) if isinstance(targets, list) else None  # None: every linear layer
    if "all-linear" in command.split():
        # what the user asked: the probe records peft's target_modules after peft's MoE conversion moved the
        # experts and the router of Mixtral into target_parameters, so its list alone drops those adapters
        lora_targets = None
    dtype = str(inputs.get("compute_dtype") or "bfloat16")
    return QLoraSpec(
        bits=int(inputs.get("bits") or 4), double_quant=bool(inputs.get("double_quant")),
        quant_type=str(inputs.get("quant_type") or "nf4"), compute_dtype="fp16" if "16" in dtype and "b" not in dtype
        else "bf16", lora_r=int(inputs.get("lora_r") or 64), lora_alpha=int(inputs.get("lora_alpha") or 16),
        lora_dropout=float(inputs.get("lora_dropout") or 0.0), lora_targets=lora_targets,
        gradient_checkpointing=checkpointing_of(inputs, command),
        attn=str(inputs.get("attn_implementation") or "sdpa"),
        optim=OPTIMIZERS.get(str(inputs.get("optim")), "paged_adamw_32bit"),
        framework=framework_of(inputs, command))


def framework_of(inputs: dict[str, Any], command: str) -> str:
    """The planner's framework entry: ``qlora`` for qlora.py with --bf16 (what the command reader picks too)."""
    if inputs.get("framework") == "trl":
        return "trl"
    return "qlora" if "qlora.py" in command and inputs.get("bf16") else "hf"


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


TRAINER_OF = {"Trainer": "sft", "Seq2SeqTrainer": "sft", "sft": "sft", "dpo": "dpo", "grpo": "grpo"}


def _lengths(inputs: dict[str, Any], which: str, column: str = "input_ids") -> dict[str, Any]:
    return ((inputs.get(f"{which}_lengths") or {}).get(column) or {})


def eval_logits_of(inputs: dict[str, Any]) -> str:
    """What the evaluation keeps per batch. HF Trainer's evaluation_loop gathers the logits whenever
    prediction_loss_only is off (compute_metrics or not); TRL's SFT computes the loss through its fused head and
    builds full logits only for compute_metrics."""
    if inputs.get("prediction_loss_only"):
        return "none"
    if inputs.get("framework") == "trl" and not inputs.get("compute_metrics"):
        return "none"
    return "argmax" if inputs.get("preprocess_logits_for_metrics") else "kept"


def run_phases_of(point: dict[str, Any]) -> tuple[RunPhases, int, int]:
    """The RunPhases, batch and sequence length the run really had, from what the probe saw inside it."""
    inputs = point["plan_inputs"]
    trl = inputs.get("trl") or {}
    trainer = TRAINER_OF[point["trainer"]]
    batch = int(inputs.get("train_batch") or point["batch"])
    shape = inputs.get("train_input_shape_first") or [None, None]
    seq = longest_batch_seq(point) or 0
    fields: dict[str, Any] = {"trainer": trainer,
                              "grad_accum": int(inputs.get("gradient_accumulation_steps") or 1)}
    if trainer == "dpo":
        # chosen and rejected are each prompt + completion, padded together to the longer (max_length caps it)
        prompt = int(_lengths(inputs, "train", "prompt_ids").get("max") or 0)
        longest = max(int(_lengths(inputs, "train", c).get("max") or 0) for c in ("chosen_ids", "rejected_ids"))
        seq = prompt + longest if longest else int(shape[-1] or 0)
        if trl.get("max_length"):
            seq = min(seq, int(trl["max_length"]))
        fields["precompute_ref"] = bool(trl.get("precompute_ref_log_probs"))
    elif trainer == "grpo":
        completion = int(trl.get("max_completion_length") or 256)
        # the step's rows are prompt + completion, padded to the longest: the probe saw P + C
        prompt = int(shape[-1] or 0) - completion
        seq = prompt
        fields.update(max_prompt_len=prompt, max_completion_len=completion,
                      num_generations=int(trl.get("num_generations") or 8),
                      steps_per_generation=trl.get("steps_per_generation"), beta=float(trl.get("beta") or 0.0))
    if inputs.get("eval_batch"):
        eval_len = _lengths(inputs, "eval")
        eval_shape = inputs.get("eval_input_shape_first") or [None, None]
        fields.update(eval_batch=int(inputs["eval_batch"]), eval_logits=eval_logits_of(inputs),
                      eval_seq=int(eval_len.get("max") or eval_shape[-1] or seq) or None,
                      eval_examples=int(eval_len["n"]) if eval_len.get("n") else None,
                      eval_accumulation_steps=inputs.get("eval_accumulation_steps"))
    return RunPhases(**fields), batch, seq


def load_peak(p: Plan) -> int:
    """Loading's peak, as the planner plans it: the ``load`` phase (``planner/loading.py``: from_pretrained's own
    worst moment, prepare_model_for_kbit_training's upcast, qlora.py's cast back to bf16, the adapters)."""
    assert p.run is not None
    return p.run.phases["load"].peak_allocated_bytes


def planned_for(point: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    """The plan of ``point["phase"]`` ("load", "eval", "generation", "train", "whole-run") for its trainer, from
    ``point["plan_inputs"]`` through ``plan(..., run=RunPhases(...))``. Returns (planned peak allocated,
    planned process bytes, why-not or None)."""
    inputs = point["plan_inputs"]
    try:
        run, batch, seq = run_phases_of(point)
    except (KeyError, TypeError, ValueError) as exc:
        return None, None, f"the point's inputs do not say its shape: {type(exc).__name__}: {exc}"[:300]
    if not seq or seq <= 0:
        return None, None, "no sequence length known for the point"
    try:
        p = plan(inputs["model_config"], batch, seq, spec_of(inputs, str(point.get("command") or "")), run=run)
    except Exception as exc:  # a shape the planner refuses: the point stays, with why
        return None, None, f"plan() refused it: {type(exc).__name__}: {exc}"[:300]
    assert p.run is not None
    phase = point["phase"]
    if phase == "load":
        static = load_peak(p)
        if "precompute_ref" in p.run.phases:  # the step log's start row comes after the reference pass
            ref = p.run.phases["precompute_ref"]
            return max(static, ref.peak_allocated_bytes), None, None
        return static, None, None
    if phase == "whole-run":
        # the run's peak: the largest phase, loading among them (its process was not measured: left out)
        peak = max(ph.peak_allocated_bytes for ph in p.run.phases.values())
        process = max(ph.process_bytes for name, ph in p.run.phases.items() if name != "load")
        return peak, process, None
    if phase not in p.run.phases:
        return None, None, f"the planner has no {phase} phase for trainer {run.trainer}"
    ph = p.run.phases[phase]
    if phase == "generation":  # the probe timed generate() alone: NVML process memory was not sampled there
        return ph.peak_allocated_bytes, None, None
    return ph.peak_allocated_bytes, ph.process_bytes, None


def plan_point(point: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    if point.get("failed"):
        return None, None, f"the run failed: {point.get('why')}"
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


TABLE_START = "<!-- whole-run-table: written by bench/whole_run_compare.py --docs -->"
TABLE_END = "<!-- /whole-run-table -->"
TRAINER_NAMES = {"Trainer": "HF Trainer", "Seq2SeqTrainer": "qlora.py (Seq2SeqTrainer)", "sft": "TRL SFT",
                 "dpo": "TRL DPO", "grpo": "TRL GRPO"}


def _cell(rows: list[dict[str, Any]], key: str) -> str:
    errs = [r[key] for r in rows if r.get(key) is not None]
    if not errs:
        return "-"
    worst = max(errs, key=abs)
    return f"{statistics.median(abs(e) for e in errs):.2f}% / {worst:+.2f}%"


def table(out: list[dict[str, Any]]) -> str:
    """The errors per phase and trainer, as the markdown table docs/planner.md shows."""
    lines = ["| phase | trainer | points (planned) | peak allocated: median / worst | process: median / worst |",
             "|---|---|---|---|---|"]
    for phase in ("load", "train", "eval", "generation", "whole-run"):
        for trainer in TRAINER_NAMES:
            rows = [r for r in out if r["phase"] == phase and r["trainer"] == trainer]
            if not rows:
                continue
            planned = sum(1 for r in rows if r["planned_peak_allocated_bytes"] is not None)
            lines.append(f"| {phase} | {TRAINER_NAMES[trainer]} | {len(rows)} ({planned}) | "
                         f"{_cell(rows, 'peak_error_pct')} | {_cell(rows, 'process_error_pct')} |")
    for label, rows in (("whole-run", [r for r in out if r["phase"] == "whole-run"]), ("every point", out)):
        planned = sum(1 for r in rows if r["planned_peak_allocated_bytes"] is not None)
        lines.append(f"| **{label}** | all | {len(rows)} ({planned}) | **{_cell(rows, 'peak_error_pct')}** | "
                     f"**{_cell(rows, 'process_error_pct')}** |")
    return "\n".join(lines)


def write_docs(path: Path, out: list[dict[str, Any]]) -> None:
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise SystemExit(f"{path} has no {TABLE_START} ... {TABLE_END} block: add the two markers where the table "
                         "goes")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    path.write_text(f"{head}{TABLE_START}\n{table(out)}\n{TABLE_END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--docs", type=Path, default=None, help="write the errors table into this markdown file "
                    "(docs/planner.md) between its whole-run-table markers")
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
    if args.docs:
        write_docs(args.docs, out)
        print(f"table -> {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
