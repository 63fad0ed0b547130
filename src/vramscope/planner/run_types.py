"""The whole run as data: what it does besides its supervised step (:class:`RunPhases`), and its plan, one
:class:`PhasePeak` per phase (:class:`RunPlan`); with the two builders every phase is made with (:func:`phase_peak`,
:func:`resident`). :mod:`.phases` plans the run; :mod:`.nograd` its no-grad phases.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vramscope.planner.errors import PlanInputError
from vramscope.planner.memory import Breakdown, Estimate
from vramscope.trainers import DEFAULT_TRAINER, TRAINERS, Trainer

# What an evaluation keeps of each batch's logits:
#   none    prediction_loss_only (the Trainer's choice when no compute_metrics is given): nothing
#   kept    compute_metrics without preprocess_logits_for_metrics: the [b, s, V] fp32 logits and the labels
#   argmax  preprocess_logits_for_metrics returning argmax(-1): [b, s] int64 ids and the labels
# Each phase a run is planned in, in words: what the report's plan check and the tuner's limit say of a phase.
PHASE_WORDS = {"load": "loading", "train": "the training step", "eval": "evaluation", "generation": "generation",
               "precompute_ref": "the reference pass"}
EVAL_LOGITS = ("none", "kept", "argmax")
# TRL 1.16 defaults (grpo_config.py, dpo_config.py / base_config.py).
GRPO_COMPLETION = 512
GRPO_GENERATIONS = 8
ALIGN = 512


def align(n: float) -> int:
    return int(math.ceil(n / ALIGN) * ALIGN) if n > 0 else 0



@dataclass(frozen=True)
class RunPhases:
    """What a run does besides its supervised step: the trainer and its lengths, and its evaluation.

    Every field has the default of the program that reads it (HF Trainer, TRL 1.16), so ``RunPhases()`` is
    today's single SFT step and a pasted command only fills what it sets.

    Attributes:
        trainer: a row of :data:`vramscope.trainers.TRAINERS`: ``sft`` (HF Trainer or TRL SFTTrainer: the
            recipe's framework), ``dpo``, ``grpo``, ``reward`` (TRL RewardTrainer) or ``kto``. The last four are
            TRL trainers and plan TRL's fused LM head.
        eval_batch: ``per_device_eval_batch_size``; None = the run does not evaluate.
        eval_seq: the longest padded eval row; None = the training length.
        eval_logits: what evaluation keeps per batch (:data:`EVAL_LOGITS`).
        eval_accumulation_steps: batches of predictions held on the GPU before they move to the host;
            None = all of them (the Trainer's default).
        eval_examples: the eval set's size, to count its batches; None = unknown (one batch is planned and the
            growth per batch is reported).
        world_size: ranks whose predictions every rank gathers (accelerate's ``gather``).
        grad_accum: ``gradient_accumulation_steps`` (GRPO generates for ``steps_per_generation`` of them).
        max_prompt_len: GRPO's longest prompt P; None = the plan's sequence length.
        max_completion_len: GRPO's ``max_completion_length`` C.
        num_generations: GRPO's completions per prompt G (checked against the generation batch).
        steps_per_generation: None = ``grad_accum`` (TRL's default).
        beta: GRPO's KL weight; None = 0.0 (TRL 1.16: no reference model, no reference forward).
        precompute_ref: DPO/KTO ``precompute_ref_log_probs``: the reference runs once before training, not in
            each step.
        precompute_batch: ``precompute_ref_batch_size``; None = the training batch.
        kto_kl: KTO's KL term (``loss_type="kto"``): a mismatched KL batch through the policy and the reference.
    """

    trainer: str = DEFAULT_TRAINER
    eval_batch: int | None = None
    eval_seq: int | None = None
    eval_logits: str = "none"
    eval_accumulation_steps: int | None = None
    eval_examples: int | None = None
    world_size: int = 1
    grad_accum: int = 1
    max_prompt_len: int | None = None
    max_completion_len: int | None = None
    num_generations: int = GRPO_GENERATIONS
    steps_per_generation: int | None = None
    beta: float | None = None
    precompute_ref: bool = False
    precompute_batch: int | None = None
    kto_kl: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}



def trainer_of(run: RunPhases) -> Trainer:
    """The :data:`~vramscope.trainers.TRAINERS` row of ``run.trainer``.

    Raises:
        PlanInputError: a trainer the table does not have.
    """
    try:
        return TRAINERS[run.trainer]
    except KeyError:
        raise PlanInputError(f"unknown trainer {run.trainer!r}; choose one of {', '.join(TRAINERS)}") from None


def validate_run(run: RunPhases) -> None:
    """Check a :class:`RunPhases`; raises :class:`PlanInputError` with what to change."""
    trainer_of(run)
    if run.eval_logits not in EVAL_LOGITS:
        raise PlanInputError(f"eval logits must be one of {', '.join(EVAL_LOGITS)}, got {run.eval_logits!r}")
    for name in ("eval_batch", "eval_seq", "eval_accumulation_steps", "eval_examples", "max_prompt_len",
                 "max_completion_len", "steps_per_generation", "precompute_batch"):
        value = getattr(run, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0
                                  or value > 10**12):
            raise PlanInputError(f"{name.replace('_', ' ')} must be a positive whole number, got {value!r}"[:200])
    for name in ("world_size", "grad_accum", "num_generations"):
        value = getattr(run, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 10**6:
            raise PlanInputError(f"{name.replace('_', ' ')} must be a positive whole number, got {value!r}"[:200])
    if run.beta is not None and not (isinstance(run.beta, (int, float)) and math.isfinite(run.beta)):
        raise PlanInputError(f"beta must be a number, got {run.beta!r}")


@dataclass(frozen=True)
class PhasePeak:
    """One phase's peak: the three totals, the breakdown at the peak, and the moment inside it that peaks."""

    name: str
    rows: int
    seq: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    moment: str
    breakdown: Breakdown
    moments: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    device_bytes: int = 0
    breakdowns: dict[str, Breakdown] = field(default_factory=dict)  # every moment's, the peak's included

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "seq": self.seq, "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "process_bytes": self.process_bytes,
                "peak_moment": self.moment, "moments": dict(self.moments), "breakdown": self.breakdown.to_dict(),
                "notes": list(self.notes)}


@dataclass(frozen=True)
class RunEvent:
    """Something that happens between steps, and what it adds to the GPU at that moment (0 with the reason)."""

    name: str
    adds_bytes: int
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"adds_bytes": self.adds_bytes, "why": self.why}


@dataclass(frozen=True)
class RunPlan:
    """Every phase of the run, the one that sets the peak, and the events between steps."""

    trainer: str
    phases: dict[str, PhasePeak]
    peak_phase: str
    events: tuple[RunEvent, ...]
    train: Estimate  # the training step's estimate (its moments, its breakdowns)
    notes: tuple[str, ...] = ()

    @property
    def peak(self) -> PhasePeak:
        return self.phases[self.peak_phase]


def resident(train: Estimate, tokens: int) -> Breakdown:
    """What stays on the GPU between steps: weights, adapters, optimizer states, workspaces (and the batch)."""
    bd = train.phase_breakdowns["optimizer step"]
    return Breakdown(quantized_weights=bd.quantized_weights, quantization_constants=bd.quantization_constants,
                     unquantized_params=bd.unquantized_params, lora_weights=bd.lora_weights,
                     optimizer_states=bd.optimizer_states, optimizer_states_paged=bd.optimizer_states_paged,
                     cublas_workspaces=bd.cublas_workspaces, activations=4 * align(8 * tokens))


def phase_peak(name: str, rows: int, seq: int, moments: dict[str, Breakdown], overhead: int, context: int,
           paged_in_process: int, notes: tuple[str, ...] = ()) -> PhasePeak:
    allocated = {k: bd.allocated() for k, bd in moments.items()}
    moment = max(allocated, key=lambda k: allocated[k])
    bd = replace(moments[moment], allocator_overhead=overhead, cuda_context=context)
    reserved = allocated[moment] + overhead
    process = reserved + context + paged_in_process
    return PhasePeak(name=name, rows=rows, seq=seq, peak_allocated_bytes=allocated[moment],
                     peak_reserved_bytes=reserved, process_bytes=process, moment=moment, breakdown=bd,
                     moments=allocated, notes=notes, device_bytes=process - paged_in_process, breakdowns=moments)

def grpo_prompt(run: RunPhases, seq: int) -> int:
    return run.max_prompt_len or seq


def grpo_completion(run: RunPhases) -> int:
    return run.max_completion_len or GRPO_COMPLETION

