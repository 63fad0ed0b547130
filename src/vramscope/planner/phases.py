"""The whole run, not one step: the training step of each trainer, then loading, evaluation and generation as
phases (:mod:`.nograd`).

:func:`plan_run` takes what :func:`~vramscope.planner.memory.estimate` takes plus one :class:`RunPhases` (the
trainer and its lengths, the evaluation's settings) and returns a :class:`RunPlan`: one :class:`PhasePeak` per
phase the run goes through (``train``, ``eval``, ``generation``, ``precompute_ref``), the phase that sets the
run's peak, and what the first step, a checkpoint save and the end of an epoch add. docs/planner.md ("The whole
run") walks through each term with its source (trl 1.16, transformers 5.24, peft 0.21, accelerate 1.15).

What a trainer's step is made of is its row of :data:`vramscope.trainers.TRAINERS` (its rows per example, its
head, its reference model, whether it generates), read by its fields.

What stays resident across phases: the weights, the adapters and (from the first optimizer step on) the
optimizer states; the LoRA gradients are freed by ``zero_grad(set_to_none=True)`` after every step, so an
evaluation or a generation in the middle of training runs beside everything but them.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from vramscope.planner.frameworks import TRL_TRAINERS, Framework, Precision, framework_for, precision
from vramscope.planner.loading import load_moments
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate, lora_tensors
from vramscope.planner.nograd import (
    beside_training_pool,
    eval_accumulation_peak,
    eval_phase,
    eval_segments,
    fused_head_nograd,
    generation_phase,
    kv_cache_bytes,
    nograd_layer_bytes,
    precompute_phase,
    returned_logit_bytes,
)
from vramscope.planner.run_types import (
    ALIGN,
    EVAL_LOGITS,
    GRPO_COMPLETION,
    GRPO_GENERATIONS,
    PhasePeak,
    RunEvent,
    RunPhases,
    RunPlan,
    grpo_completion,
    grpo_prompt,
    phase_peak,
    trainer_of,
    validate_run,
)
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

# Re-exported: the run's types and its no-grad phases lived here before they had modules of their own.
__all__ = ["ALIGN", "EVAL_LOGITS", "GRPO_COMPLETION", "GRPO_GENERATIONS", "PhasePeak", "RunEvent", "RunPhases",
           "RunPlan", "eval_accumulation_peak", "eval_phase", "generation_phase", "kv_cache_bytes", "load_phase",
           "nograd_layer_bytes", "plan_run", "precompute_phase", "returned_logit_bytes", "train_phase",
           "trainer_of", "validate_run"]


def _accumulating(moments: dict[str, Breakdown], grad_accum: int) -> dict[str, Breakdown]:
    """With ``gradient_accumulation_steps`` > 1 the Trainer calls ``zero_grad`` only after the optimizer step, so
    every micro-batch after the first runs its forward and backward beside the LoRA gradients accumulated so far:
    each moment holds the full gradients (the optimizer step's), not only those its backward has made."""
    if grad_accum <= 1 or "optimizer step" not in moments:
        return moments
    grads = moments["optimizer step"].lora_gradients
    return {k: replace(bd, lora_gradients=max(bd.lora_gradients, grads)) for k, bd in moments.items()}


def _from_estimate(name: str, rows: int, seq: int, est: Estimate, extra: dict[str, Breakdown] | None = None,
                   notes: tuple[str, ...] = (), grad_accum: int = 1) -> PhasePeak:
    """A training step's estimate as a phase; ``extra`` moments (the reference forward) join its own."""
    moments = dict(est.phase_breakdowns)
    if est.breakdown.calibration:  # a calibration applies to the step's peak moment only
        moments[est.peak_phase] = replace(moments[est.peak_phase], calibration=est.breakdown.calibration)
    moments.update(extra or {})
    moments = _accumulating(moments, grad_accum)
    return phase_peak(name, rows, seq, moments, est.breakdown.allocator_overhead, est.breakdown.cuda_context,
                  est.paged_in_process_bytes, notes)


def _reference_moment(est: Estimate, shape: ModelShape, spec: QLoraSpec, rows: int, seq: int,
                      pr: Precision) -> Breakdown:
    """The reference forward (the adapter switched off, no grad) right after the policy's forward: the policy's
    saved activations and its fused head's saved rows are alive; the reference adds one layer's no-grad
    working set or its own head, whichever is larger, and keeps only its [rows] log-probabilities."""
    T = rows * seq
    fwd = est.phase_breakdowns["forward"]
    policy_head_saved = pr.stream * shape.hidden * T + 40 * T  # the gathered rows and the statistics
    transient = max(nograd_layer_bytes(shape, spec, rows, seq, pr, adapters=False),
                    pr.stream * shape.hidden * T + fused_head_nograd(shape, pr, T))
    return replace(fwd, logits_and_loss=policy_head_saved, temporaries=transient)


def train_phase(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, run: RunPhases,
                framework: Framework | None = None) -> tuple[PhasePeak, Estimate]:
    """The training step of ``run.trainer``: rows, length and what the trainer adds to the step."""
    trainer = trainer_of(run)
    if not trainer.trl_step:
        est = estimate(shape, spec, batch, seq, hw, framework=framework)
        return _from_estimate("train", batch, seq, est, grad_accum=run.grad_accum), est
    fw = replace(TRL_TRAINERS, logits="score") if trainer.score_head else TRL_TRAINERS
    if trainer.generates:  # a row is a prompt and its completion
        rows, length = batch, grpo_prompt(run, seq) + grpo_completion(run)
    else:
        rows, length = trainer.rows_per_example * batch, seq
    est = estimate(shape, spec, rows, length, hw, framework=fw)
    extra: dict[str, Breakdown] = {}
    notes: list[str] = []
    if trainer.step_note:
        notes.append(trainer.step_note.format(rows=rows, seq=length, batch=batch)
                     + (", plus a no-grad KL batch through the policy" if trainer.kl_batch and run.kto_kl else ""))
    if trainer.reference and run.precompute_ref:
        notes.append("precompute_ref_log_probs: no reference forward in the step (see phase precompute_ref)")
    elif trainer.reference:
        extra["reference forward"] = _reference_moment(est, shape, spec, rows, seq, precision(spec, fw))
        notes.append("the reference is the adapter switched off: a second, no-grad forward of the same rows "
                     "after the policy's, beside its saved activations; it keeps only its log-probabilities")
    return _from_estimate("train", rows, length, est, extra, tuple(notes), run.grad_accum), est


def _events(shape: ModelShape, spec: QLoraSpec, train: Estimate, run: RunPhases) -> tuple[RunEvent, ...]:
    states = train.breakdown.optimizer_states + train.breakdown.optimizer_states_paged
    tensors = lora_tensors(shape, spec)
    return (
        RunEvent("first_step", 0,
                 f"the optimizer's states ({states / 2**30:.2f} GiB) appear at the first optimizer.step(), beside "
                 "that step's gradients: the steady-state peak above already counts them, and every step before "
                 "the first optimizer step peaks that much lower"),
        RunEvent("checkpoint_save", 0,
                 "a PEFT save_pretrained copies the adapter to the host tensor by tensor (references to the live "
                 f"tensors, {len(tensors)} contiguous ones), and torch.save(optimizer.state_dict()) serialises "
                 "each state by a host copy: no new GPU tensor"),
        RunEvent("epoch_end", 0,
                 "nothing is allocated at the end of an epoch; an evaluation or save it triggers "
                 "(eval_strategy / save_strategy = epoch) costs what that phase costs"),
    )


def load_phase(shape: ModelShape, spec: QLoraSpec, est: Estimate, fw: Framework) -> PhasePeak:
    """Loading, from ``from_pretrained`` to the adapters (:mod:`.loading`): its peak allocated; reserved as
    allocated (the loader's segment is sized to the weights) and the CUDA context beside it. Its process figure
    was not measured on the H200 (the step log's start row comes after it)."""
    return phase_peak("load", 0, 0, load_moments(shape, spec, fw, est), 0, est.breakdown.cuda_context, 0)


def plan_run(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware | None = None,
             run: RunPhases | None = None, *, framework: Framework | None = None) -> RunPlan:
    """Every phase of a run and the one that sets its peak (see the module docstring).

    Raises:
        PlanInputError: bad trainer or run settings, a GRPO batch that num_generations does not divide.
    """
    hw = hw or Hardware()
    run = run or RunPhases()
    validate_run(run)
    notes: list[str] = []
    train, est = train_phase(shape, spec, batch, seq, hw, run, framework)
    phases = {"load": load_phase(shape, spec, est, framework or framework_for(spec)), "train": train}
    trainer = trainer_of(run)
    if trainer.generates:
        phases["generation"] = generation_phase(shape, spec, batch, seq, est, hw, run)
    if run.precompute_ref and trainer.reference:
        phases["precompute_ref"] = precompute_phase(shape, spec, batch, seq, est, run)
    if run.eval_batch is not None and trainer.generates:
        # GRPO's prediction_step generates for the eval batch (one generation per eval step) and scores it
        once = replace(run, steps_per_generation=1)
        phases["eval"] = generation_phase(shape, spec, run.eval_batch, seq, est, hw, once, "eval")
    elif run.eval_batch is not None:
        fw = framework or framework_for(spec)  # an unknown framework is the recipe's error, not planned as hf
        ev = eval_phase(shape, spec, est, hw, run, fw, run.eval_seq or train.seq)
        ev_fw = TRL_TRAINERS if trainer.trl_step else fw
        phases["eval"] = beside_training_pool(ev, train, eval_segments(shape, spec, ev_fw, run, ev, train))
    peak = max(phases, key=lambda k: phases[k].device_bytes)
    return RunPlan(trainer=run.trainer, phases=phases, peak_phase=peak, events=_events(shape, spec, est, run),
                   train=est, notes=tuple(notes))
