"""Turn the device's whole-run records (bench/h200/whole_run.py's ``measured.json``, one per device call) into
the committed truth: ``bench/results/whole-run/measured-DATE.json``, one object per (run, phase), with what the
planner needs to plan it afterwards (``plan_inputs``) and the checks that the run measured what was meant.

    python bench/h200/whole_run_collect.py --date 2026-12-01 CALL1/measured.json CALL2/measured.json

Phases: ``load`` (the step log's start row: loading and quantizing, before the first step), ``train``, ``eval``,
``generation`` (GRPO: the peak of ``generate`` alone, from the probe), and ``whole-run`` (the largest of them, and
the process's NVML maximum over the run). A run recorded in several calls keeps its latest ok record; failed
records stay, marked, with why. The long-tail runs' every step goes to ``longtail-steps-DATE.json``; the
peak-counter pair (issue 24 item 8) to ``peak-counter-before.json``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import tarfile
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "results" / "whole-run"
TRL_DEFAULT_TARGETS = "peft's default for the model type (TRL's --lora_target_modules unset)"


def _why(run: dict[str, Any]) -> str:
    if run.get("why"):
        return str(run["why"])
    tail = (run.get("error_tail") or "").strip().splitlines()
    return tail[-1][:300] if tail else run.get("status", "?")


def plan_inputs(run: dict[str, Any]) -> dict[str, Any]:
    """The run's settings in one flat record, as the planner would take them (read from the probe's checks,
    which saw the trainer after its own defaults and tokenization, not from the command line alone)."""
    checks = run.get("checks") or {}
    model = checks.get("model") or {}
    trainer = checks.get("trainer") or {}
    args = trainer.get("args") or {}
    peft = next(iter((model.get("peft") or {}).values()), {})
    quant = model.get("quantization_config") or {}
    forwards = checks.get("forwards") or {}
    train_fwd = forwards.get("train") or {}
    eval_fwd = forwards.get("eval") or {}
    targets = peft.get("target_modules")
    if run["framework"] == "hf":
        targets_note = "all-linear (peft resolves it: every nn.Linear but lm_head)"
    elif targets and len(targets) <= 8:
        targets_note = targets
    else:
        targets_note = targets or TRL_DEFAULT_TARGETS
    return {
        "framework": "hf" if run["framework"] in ("hf", "qlora.py") else run["framework"],
        "trainer": run["trainer"],
        "model_config": run.get("model_config"),
        "bits": 4 if quant.get("load_in_4bit") else (8 if quant.get("load_in_8bit") else 16),
        "quant_type": quant.get("bnb_4bit_quant_type"), "double_quant": quant.get("bnb_4bit_use_double_quant"),
        "compute_dtype": quant.get("bnb_4bit_compute_dtype"),
        "param_dtypes": model.get("param_dtypes"), "logits_dtype": train_fwd.get("logits_dtype"),
        "lora_r": peft.get("r"), "lora_alpha": peft.get("lora_alpha"), "lora_dropout": peft.get("lora_dropout"),
        "lora_targets": targets_note,
        "gradient_checkpointing": train_fwd.get("gradient_checkpointing", args.get("gradient_checkpointing")),
        "attn_implementation": model.get("attn_implementation"), "optim": args.get("optim"),
        "bf16": args.get("bf16"),
        "train_batch": args.get("per_device_train_batch_size", run.get("batch")),
        "train_input_shape_first": train_fwd.get("input_shape"),
        "train_tokens_per_step_max": (run.get("tokens_check") or {}).get("max"),
        "gradient_accumulation_steps": args.get("gradient_accumulation_steps"),
        "eval_batch": args.get("per_device_eval_batch_size") if args.get("eval_strategy") not in (None, "no")
        or run["framework"] == "qlora.py" else None,
        "eval_input_shape_first": eval_fwd.get("input_shape"),
        "eval_logits_shape_first": eval_fwd.get("logits_shape"), "eval_logits_dtype": eval_fwd.get("logits_dtype"),
        "eval_strategy": args.get("eval_strategy"), "eval_steps": args.get("eval_steps"),
        "prediction_loss_only": args.get("prediction_loss_only"),
        "eval_accumulation_steps": args.get("eval_accumulation_steps"),
        "compute_metrics": trainer.get("compute_metrics"),
        "preprocess_logits_for_metrics": trainer.get("preprocess_logits_for_metrics"),
        "save_steps": args.get("save_steps") if args.get("save_strategy") not in (None, "no") else None,
        "trl": {k: args.get(k) for k in ("max_length", "max_completion_length", "num_generations",
                                         "generation_batch_size", "steps_per_generation", "beta", "loss_type",
                                         "precompute_ref_log_probs", "truncation_mode", "packing", "padding_free",
                                         "use_vllm") if k in args},
        "train_lengths": trainer.get("train_lengths"), "eval_lengths": trainer.get("eval_lengths"),
        "dataset": run.get("dataset"), "dataset_description": run.get("dataset_description"),
    }


def checks_summary(run: dict[str, Any]) -> dict[str, Any]:
    checks = run.get("checks") or {}
    model = checks.get("model") or {}
    tok = run.get("tokens_check") or {}
    return {
        "linear4bit_modules": model.get("linear4bit_modules"), "params4bit": model.get("params4bit"),
        "lora_layers": model.get("lora_layers"), "base_class": model.get("base_class"),
        "attn_implementation": model.get("attn_implementation"), "param_dtypes": model.get("param_dtypes"),
        "forwards": checks.get("forwards"), "tokens_first_steps": tok.get("first_tokens"),
        "tokens_min": tok.get("min"), "tokens_max": tok.get("max"), "train_rows": tok.get("train_rows"),
        "shims": sorted(set(checks.get("shims") or [])) or None,
        "base_is_4bit": bool(model.get("params4bit")),
    }


def phase_points_process_note() -> str:
    return ("a phase's measured_process_bytes is NVML's reading at that phase's step-log rows; for train, only "
            "the rows before the first evaluation (the process keeps what evaluation reserved, so later train "
            "rows carry the eval phase's memory)")


def phase_process(run: dict[str, Any], phase: str) -> int | None:
    rows = run.get("step_rows") or []  # [step, phase, tokens, peak, allocated, reserved, process]
    if phase == "train":
        first_eval = next((i for i, r in enumerate(rows) if r[1] == "eval"), len(rows))
        rows = rows[:first_eval]
    values = [r[6] for r in rows if r[1] == phase and r[6]]
    return max(values) if values else None


def phase_points(run: dict[str, Any], call: str) -> list[dict[str, Any]]:
    base = {k: run.get(k) for k in ("framework", "trainer", "arch", "batch", "seq", "command")}
    base.update(run=run["name"], status=run["status"], device_call=call, launched_as=run.get("launched_as"),
                cwd=run.get("cwd"), under_vramscope=run.get("under_vramscope"), arch_note=run.get("arch_note"))
    if run["status"] not in ("ok", "killed-at-deadline"):
        return [{**base, "phase": "whole-run", "measured_peak_allocated_bytes": None,
                 "measured_process_bytes": run.get("measured_process_bytes"), "failed": True, "why": _why(run),
                 "plan_inputs": plan_inputs(run) if run.get("checks") else {"model_config": run.get("model_config")}}]
    inputs = plan_inputs(run)
    checks = checks_summary(run)
    phases = run.get("phases") or {}
    out = []
    names = {"start": "load", "train": "train", "eval": "eval"}
    for ph, d in phases.items():
        if ph not in names or d.get("peak_allocated_bytes") is None:
            continue
        out.append({**base, "phase": names[ph], "measured_peak_allocated_bytes": d["peak_allocated_bytes"],
                    "measured_process_bytes": phase_process(run, ph), "peak_step": d.get("peak_step"),
                    "tokens_at_peak": d.get("tokens_at_peak"), "rows": d.get("rows")})
    gen = run.get("generation")
    if gen:
        out.append({**base, "phase": "generation", "measured_peak_allocated_bytes": gen["peak_allocated_bytes"],
                    "measured_process_bytes": None, "generate_calls": gen["calls"],
                    "generate_output_shapes": gen["output_shapes"], "generate_first": gen["first"],
                    "note": "the peak of generate() alone (reset_peak_memory_stats before it, read after it)"})
    peaks = [(p["measured_peak_allocated_bytes"], p["phase"]) for p in out]
    whole = {**base, "phase": "whole-run", "measured_peak_allocated_bytes": max(peaks)[0] if peaks else None,
             "measured_peak_phase": max(peaks)[1] if peaks else None,
             "measured_process_bytes": run.get("measured_process_bytes"), "wall_s": run.get("wall_s")}
    if run["status"] == "killed-at-deadline":
        whole["note"] = run.get("why")
    out.append(whole)
    for p in out:
        p["plan_inputs"] = inputs
        p["checks"] = checks
        if p["phase"] != "whole-run" and p["phase"] != "generation":
            p["process_note"] = phase_points_process_note()
    return out


def longtail_steps(tarballs: list[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {"columns": ["step", "tokens", "peak_allocated_bytes", "reserved_bytes", "process_bytes"]}
    for tb in tarballs:
        with tarfile.open(tb) as tar:
            for m in tar.getmembers():
                if "longtail" in m.name and m.name.endswith("mem.steps.csv"):
                    f = tar.extractfile(m)
                    assert f is not None
                    rows = list(csv.DictReader(io.TextIOWrapper(f)))
                    out[m.name.split("/")[0]] = [
                        [int(r["step"]), int(r["tokens"] or 0), int(r["peak_allocated_bytes"] or 0),
                         int(r["reserved_bytes"] or 0), int(r["process_bytes"] or 0)]
                        for r in rows if r.get("phase") == "train"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measured", nargs="+", type=Path, help="the device's measured.json files, oldest first")
    ap.add_argument("--date", required=True)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    runs: dict[str, tuple[str, dict[str, Any]]] = {}
    metas = []
    for i, path in enumerate(args.measured, 1):
        doc = json.loads(path.read_text())
        metas.append({"call": i, **doc["meta"]})
        for run in doc["points"]:
            if run["status"] == "not-run" and run["name"] in runs:
                continue  # a later call that left it out keeps the earlier record
            old = runs.get(run["name"])
            if old and old[1]["status"] == "ok" and run["status"] != "ok":
                continue
            if run["status"] == "error" and "killed" not in run and run["name"] == "hf-longtail-Llama-3.1-8B" \
                    and (run.get("phases") or {}).get("train", {}).get("rows", 0) > 200:
                # call 1 killed it at its deadline (the driver then said "error"): 237 of 252 steps had run
                run["status"] = "killed-at-deadline"
                run["why"] = ("still running at the call's deadline (445 s), killed after 237 of its 252 steps; "
                              "the 5 long examples were in steps 14, 17, 42, 66 and 154")
            runs[run["name"]] = (f"call{i}", run)
    points = []
    for call, run in runs.values():
        if run["framework"] == "tiny":
            continue
        points += phase_points(run, call)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"measured-{args.date}.json").write_text(json.dumps(points, indent=1, default=str) + "\n")
    (args.out / f"device-meta-{args.date}.json").write_text(json.dumps(metas, indent=1, default=str) + "\n")
    tarballs = [p.parent / "logs.tar.gz" for p in args.measured]
    (args.out / f"longtail-steps-{args.date}.json").write_text(json.dumps(longtail_steps(tarballs)) + "\n")
    pc = {name: run for _, run in runs.values() for name in [run["name"]] if run["framework"] == "tiny"}
    if pc:
        doc = {"what": "issue 24 item 8, today's behaviour: a tiny HF Trainer's own torch.cuda.max_memory_allocated()"
                       " readings (each on_step_end, and after train()), under `vramscope run` (injection on) and "
                       "without it; bench/h200/whole_run_peak_counter.py",
               "date": args.date, "device": metas[0].get("device")}
        for name, run in pc.items():
            doc[name] = {"command": run["command"], "under_vramscope": run["under_vramscope"],
                         "readings": run.get("peak_counter"),
                         "vramscope_step_log_train_peak": ((run.get("phases") or {}).get("train") or {}).get(
                             "peak_allocated_bytes")}
        (args.out / "peak-counter-before.json").write_text(json.dumps(doc, indent=1) + "\n")
    ok = sum(1 for p in points if not p.get("failed"))
    print(f"{len(points)} phase points ({ok} measured, {len(points) - ok} failed) from {len(runs)} runs")


if __name__ == "__main__":
    main()
