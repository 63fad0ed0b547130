"""Ways out when a phase other than the training step sets the run's peak: evaluation's gathered predictions,
GRPO's generation batch, DPO's reference forward. Each saving is the difference of two whole-run plans
(:func:`~vramscope.planner.phases.plan_run`), so it is what the run's peak drops by, not one phase's.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from vramscope.planner.loading import at_moment
from vramscope.planner.memory import Hardware
from vramscope.planner.phases import RunPhases, RunPlan, plan_run, trainer_of
from vramscope.planner.recommendation import Recommendation
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB, MIB


def phase_recommendations(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, run: RunPhases,
                          whole: RunPlan, capacity: int | None) -> list[Recommendation]:
    """Changes to the run's settings that lower its peak, largest saving first (only those that save)."""
    base = whole.peak.device_bytes
    deficit = None if capacity is None else base - capacity
    trainer = trainer_of(run)
    config = trainer.config or "TrainingArguments"  # the HF Trainer's, for a run that names no TRL config
    out: list[Recommendation] = []

    def add(name: str, new: RunPhases, text: str, how: str) -> None:
        after = plan_run(shape, spec, batch, seq, hw, new).peak.device_bytes
        saving = base - after
        if saving >= 64 * MIB:  # less is not worth a line (halving an eval batch of a fixed eval set saves ~nothing)
            out.append(Recommendation(name, saving, text.format(saving=saving / GIB), {"run": _diff(run, new)},
                                      None if deficit is None else saving >= deficit, how))

    if "eval" in whole.phases and not trainer.generates:  # a generating run's evaluation generates
        if run.eval_logits == "kept":
            add("eval_argmax", replace(run, eval_logits="argmax"),
                "reduce the logits to token ids before they are gathered (preprocess_logits_for_metrics): "
                "saves {saving:.2f} GiB",
                "Trainer(..., preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))")
        if run.eval_logits != "none" and (run.eval_accumulation_steps or 0) != 1:
            add("eval_accumulation", replace(run, eval_accumulation_steps=1),
                "move the predictions to the host after every eval batch: saves {saving:.2f} GiB",
                f"{config}(eval_accumulation_steps=1)")
        if run.eval_batch and run.eval_batch > 1:
            half = max(1, run.eval_batch // 2)
            add("eval_batch", replace(run, eval_batch=half),
                # DPO and reward evaluate pairs: per_device_eval_batch_size counts pairs, each two rows
                f"evaluate {half} {'pairs' if trainer.rows_per_example == 2 else 'rows'} at a time: saves "
                f"{{saving:.2f}} GiB",
                f"{config}(per_device_eval_batch_size={half})")
    if trainer.generates:
        steps = run.steps_per_generation or run.grad_accum
        # the fewest micro-batches generated at once that still divide the step and make whole groups of G
        fewer = [n for n in range(1, steps) if steps % n == 0
                 and (batch * n * run.world_size) % run.num_generations == 0]
        if fewer:
            add("steps_per_generation", replace(run, steps_per_generation=fewer[0]),
                f"generate for {fewer[0]} micro-batch(es) at a time, not {steps} (the KV cache grows with the rows "
                "generated at once): saves {saving:.2f} GiB", f"{config}(steps_per_generation={fewer[0]})")
        completion = run.max_completion_len or 512
        if completion > 64:
            add("max_completion_len", replace(run, max_completion_len=completion // 2),
                f"cap completions at {completion // 2} tokens: saves {{saving:.2f}} GiB",
                f"{config}(max_completion_length={completion // 2})")
    if trainer.reference and not run.precompute_ref:
        add("precompute_ref", replace(run, precompute_ref=True),
            "compute the reference log-probabilities once before training: saves {saving:.2f} GiB",
            f"{config}(precompute_ref_log_probs=True)")
    out.sort(key=lambda r: r.saving_bytes, reverse=True)
    return out


def _diff(old: RunPhases, new: RunPhases) -> dict[str, object]:
    return {k: v for k, v in new.to_dict().items() if old.to_dict()[k] != v}


def phase_reason(whole: RunPlan, capacity: int) -> str | None:
    """Why the run does not fit when its training step does: the phase, its peak and what fills it."""
    train = whole.phases["train"]
    top = whole.peak
    if whole.peak_phase == "train" or train.device_bytes > capacity:
        return None
    if whole.peak_phase == "load":
        return f"the training step fits ({train.device_bytes / GIB:.1f} GiB) but {load_reason(whole, capacity)}"
    bd = top.breakdown
    parts = [(bd.eval_predictions, "gathered eval predictions"), (bd.kv_cache, "KV cache"),
             (bd.temporaries, "no-grad forward and transients")]
    what = ", ".join(f"{v / GIB:.1f} GiB of {name}" for v, name in parts if v)
    return (f"the training step fits ({train.device_bytes / GIB:.1f} GiB) but the {whole.peak_phase} phase needs "
            f"{top.device_bytes / GIB:.1f} GiB {at_moment(top.moment)}: {what}")


def load_reason(whole: RunPlan, capacity: int) -> str | None:
    """What loading holds where it alone overflows ``capacity`` (None where it fits): the same at every batch and
    length, so no change to the step's batch or length helps."""
    load = whole.phases.get("load")
    if load is None or load.device_bytes <= capacity:
        return None
    bd = load.breakdown
    # in words, not the breakdown's field names
    parts = [(bd.quantized_weights + bd.quantization_constants, "quantized base weights and their constants"),
             (bd.unquantized_params, "weights left unquantized"), (bd.lora_weights, "adapters"),
             (bd.temporaries, "the loader's copies in flight")]
    what = ", ".join(f"{v / GIB:.1f} GiB of {name}" for v, name in parts if v)
    return (f"loading the model needs {load.device_bytes / GIB:.1f} GiB {at_moment(load.moment)}, before the first "
            f"step ({what}), at any batch and length")
