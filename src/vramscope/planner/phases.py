"""The whole run, not one step: the training step of each trainer, evaluation and generation as phases.

:func:`plan_run` takes what :func:`~vramscope.planner.memory.estimate` takes plus one :class:`RunPhases` (the
trainer and its lengths, the evaluation's settings) and returns a :class:`RunPlan`: one :class:`PhasePeak` per
phase the run goes through (``train``, ``eval``, ``generation``, ``precompute_ref``), the phase that sets the
run's peak, and what the first step, a checkpoint save and the end of an epoch add. docs/planner.md ("The whole
run") walks through each term with its source (trl 1.16, transformers 5.24, peft 0.21, accelerate 1.15).

What stays resident across phases: the weights, the adapters and (from the first optimizer step on) the
optimizer states; the LoRA gradients are freed by ``zero_grad(set_to_none=True)`` after every step, so an
evaluation or a generation in the middle of training runs beside everything but them.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import (
    TOKEN_TILE,
    TRL_TRAINERS,
    VOCAB_TILE,
    Framework,
    Precision,
    framework_for,
    precision,
)
from vramscope.planner.layer import attention_bytes, forward_temporaries, merged_expert_bytes
from vramscope.planner.loading import load_moments
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate, lora_tensors
from vramscope.planner.pool import eval_loop_segments, eval_moments, loading_region, train_blocks
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

TRAINERS = ("sft", "dpo", "grpo", "reward", "kto")
# What an evaluation keeps of each batch's logits:
#   none    prediction_loss_only (the Trainer's choice when no compute_metrics is given): nothing
#   kept    compute_metrics without preprocess_logits_for_metrics: the [b, s, V] fp32 logits and the labels
#   argmax  preprocess_logits_for_metrics returning argmax(-1): [b, s] int64 ids and the labels
EVAL_LOGITS = ("none", "kept", "argmax")
# TRL 1.16 defaults (grpo_config.py, dpo_config.py / base_config.py).
GRPO_COMPLETION = 512
GRPO_GENERATIONS = 8
ALIGN = 512


def _align(n: float) -> int:
    return int(math.ceil(n / ALIGN) * ALIGN) if n > 0 else 0


@dataclass(frozen=True)
class RunPhases:
    """What a run does besides its supervised step: the trainer and its lengths, and its evaluation.

    Every field has the default of the program that reads it (HF Trainer, TRL 1.16), so ``RunPhases()`` is
    today's single SFT step and a pasted command only fills what it sets.

    Attributes:
        trainer: ``sft`` (HF Trainer or TRL SFTTrainer: the recipe's framework), ``dpo``, ``grpo``, ``reward``
            (TRL RewardTrainer) or ``kto``. The last four are TRL trainers and plan TRL's fused LM head.
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

    trainer: str = "sft"
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


def validate_run(run: RunPhases) -> None:
    """Check a :class:`RunPhases`; raises :class:`PlanInputError` with what to change."""
    if run.trainer not in TRAINERS:
        raise PlanInputError(f"unknown trainer {run.trainer!r}; choose one of {', '.join(TRAINERS)}")
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


# --- no-grad forwards: evaluation, the reference, generation's prefill ------------------------------------

def nograd_layer_bytes(shape: ModelShape, spec: QLoraSpec, rows: int, seq: int, pr: Precision,
                       adapters: bool = True) -> int:
    """The most one decoder layer's forward holds under ``torch.no_grad()`` (nothing saved for backward).

    The embedding output (the model's forward keeps ``inputs_embeds``), the layer's input and its residual
    sum, plus the larger of the attention half (the normed input and,
    for a LoRA module with dropout, its dropped copy; q, k, v and the attention output) and the MLP half (the
    normed input and the three intermediates of a gated MLP alive at the product; routed experts per token),
    and the largest weight being dequantized. Errs high: each half is taken at its fullest moment.
    ``adapters=False``: the reference's forward, peft's adapters switched off (an adapted expert stack is then
    read as it is, with no merged copy).
    """
    T = rows * seq
    sd, ad = pr.stream, attention_bytes(spec, pr)
    h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
    dropped = sd * h * T if spec.lora_dropout > 0 else 0
    dequant = pr.compute * max(lin.params for lin in shape.linears) if spec.bits in (4, 8) else 0
    attn = sd * h * T + dropped + ad * (2 * q + 2 * kv) * T
    if shape.experts:
        k, i = shape.experts_per_token, shape.intermediate
        wd = pr.params  # grouped_mm casts the routed tokens to the experts' dtype
        mlp = sd * h * T + 2 * 4 * shape.experts * T + k * T * wd * (2 * h + 3 * i)
        # adapted experts (peft's ParamWrapper): both merged expert stacks exist through the experts' forward
        mlp += sum(merged_expert_bytes(shape, spec, pr)) if adapters else 0
        if shape.shared_expert_intermediate:
            mlp += 3 * sd * shape.shared_expert_intermediate * T
    else:
        mlp = sd * h * T + dropped + forward_temporaries(shape, spec, rows, seq, pr) + sd * shape.intermediate * T
    return 3 * sd * h * T + max(attn, mlp + dequant)


def _fused_head_nograd(shape: ModelShape, pr: Precision, tokens: int) -> int:
    """TRL's fused LM head without grad: the gathered hidden rows, one tile, ~40 bytes of statistics a token."""
    tile = 2 * min(tokens, TOKEN_TILE) * VOCAB_TILE
    if pr.params == 4:  # an fp32 lm_head: each tile's weight rows and hidden rows cast to half
        tile += 2 * min(shape.vocab, VOCAB_TILE) * shape.hidden + 2 * min(tokens, TOKEN_TILE) * shape.hidden
    return pr.stream * shape.hidden * tokens + tile + 40 * tokens


def _full_logits_nograd(shape: ModelShape, fw: Framework, pr: Precision, tokens: int, with_loss: bool) -> int:
    """A full causal-LM head without grad: the logits, the loss's fp32 upcast and log-softmax (``with_loss``),
    then accelerate's fp32 copy of the returned logits (under autocast).

    An fp32 lm_head under autocast is cast to half for the matmul; without grad nothing saves that copy (and
    autocast caches only leaves that require grad), so it is freed when the matmul returns, before the loss."""
    TV = tokens * shape.vocab
    logits_b = 2 if fw.autocast else pr.params
    weight = 2 * shape.vocab * shape.hidden if fw.autocast and pr.params == 4 else 0
    loss = (4 if logits_b != 4 else 0) * TV + 4 * TV if with_loss else 0
    convert = 4 * TV if fw.autocast else 0
    return logits_b * TV + max(weight, loss, convert)


def returned_logit_bytes(fw: Framework, pr: Precision) -> int:
    """Bytes per logit of the logits an evaluation gets back: fp32 under autocast (accelerate's
    ``convert_outputs_to_fp32``), else lm_head's dtype."""
    return 4 if fw.autocast else pr.params


# --- phases -----------------------------------------------------------------------------------------------

def _resident(train: Estimate, tokens: int) -> Breakdown:
    """What stays on the GPU between steps: weights, adapters, optimizer states, workspaces (and the batch)."""
    bd = train.phase_breakdowns["optimizer step"]
    return Breakdown(quantized_weights=bd.quantized_weights, quantization_constants=bd.quantization_constants,
                     unquantized_params=bd.unquantized_params, lora_weights=bd.lora_weights,
                     optimizer_states=bd.optimizer_states, optimizer_states_paged=bd.optimizer_states_paged,
                     cublas_workspaces=bd.cublas_workspaces, activations=4 * _align(8 * tokens))


def _phase(name: str, rows: int, seq: int, moments: dict[str, Breakdown], overhead: int, context: int,
           paged_in_process: int, notes: tuple[str, ...] = ()) -> PhasePeak:
    allocated = {k: bd.allocated() for k, bd in moments.items()}
    moment = max(allocated, key=lambda k: allocated[k])
    bd = replace(moments[moment], allocator_overhead=overhead, cuda_context=context)
    reserved = allocated[moment] + overhead
    process = reserved + context + paged_in_process
    return PhasePeak(name=name, rows=rows, seq=seq, peak_allocated_bytes=allocated[moment],
                     peak_reserved_bytes=reserved, process_bytes=process, moment=moment, breakdown=bd,
                     moments=allocated, notes=notes, device_bytes=process - paged_in_process, breakdowns=moments)


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
    return _phase(name, rows, seq, moments, est.breakdown.allocator_overhead, est.breakdown.cuda_context,
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
                    pr.stream * shape.hidden * T + _fused_head_nograd(shape, pr, T))
    return replace(fwd, logits_and_loss=policy_head_saved, temporaries=transient)


def train_phase(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, run: RunPhases,
                framework: Framework | None = None) -> tuple[PhasePeak, Estimate]:
    """The training step of ``run.trainer``: rows, length and what the trainer adds to the step."""
    t = run.trainer
    if t == "sft":
        est = estimate(shape, spec, batch, seq, hw, framework=framework)
        return _from_estimate("train", batch, seq, est, grad_accum=run.grad_accum), est
    fw = TRL_TRAINERS
    if t == "reward":
        rows = 2 * batch
        est = estimate(shape, spec, rows, seq, hw, framework=replace(fw, logits="score"))
        return _from_estimate("train", rows, seq, est, notes=(
            "RewardTrainer: chosen and rejected as one forward of 2 x batch rows, a Linear(h, 1) score head: "
            "no vocabulary-sized logits",), grad_accum=run.grad_accum), est
    if t == "grpo":
        length = _grpo_prompt(run, seq) + _grpo_completion(run)
        est = estimate(shape, spec, batch, length, hw, framework=fw)
        return _from_estimate("train", batch, length, est, notes=(
            f"the loss step: {batch} completions of prompt + completion = {length} tokens through the fused head",
        ), grad_accum=run.grad_accum), est
    rows = 2 * batch if t == "dpo" else batch
    est = estimate(shape, spec, rows, seq, hw, framework=fw)
    pr = precision(spec, fw)
    extra: dict[str, Breakdown] = {}
    notes: list[str] = []
    if t == "dpo":
        notes.append(f"DPO: chosen and rejected together, one forward of {rows} rows x {seq} tokens")
    else:
        notes.append("KTO: one forward of the batch, plus a no-grad KL batch through the policy"
                     if run.kto_kl else "KTO: one forward of the batch")
    if run.precompute_ref:
        notes.append("precompute_ref_log_probs: no reference forward in the step (see phase precompute_ref)")
    else:
        extra["reference forward"] = _reference_moment(est, shape, spec, rows, seq, pr)
        notes.append("the reference is the adapter switched off: a second, no-grad forward of the same rows "
                     "after the policy's, beside its saved activations; it keeps only its log-probabilities")
    return _from_estimate("train", rows, seq, est, extra, tuple(notes), run.grad_accum), est


def _grpo_prompt(run: RunPhases, seq: int) -> int:
    return run.max_prompt_len or seq


def _grpo_completion(run: RunPhases) -> int:
    return run.max_completion_len or GRPO_COMPLETION


def eval_accumulation_peak(step_bytes: int, held_bytes: int, transient: int, steps: int,
                           accumulate_every: int | None) -> tuple[int, int, str]:
    """The most an evaluation loop holds over its steps, replayed step by step (transformers 5.24
    ``evaluation_loop`` and ``EvalLoopContainer``).

    Each step makes ``transient`` bytes in its forward, of which ``step_bytes`` are returned and, of those,
    ``held_bytes`` are gathered into the container (logits, or argmax ids, and labels). The first batch is
    taken as it is; every later one is concatenated into a new tensor of all rows so far (padded to the
    longest), so old and new are alive together. The step's own tensors stay referenced until the next step
    returns. ``accumulate_every`` (``eval_accumulation_steps``) moves the container to the host.

    Returns:
        (peak bytes, prediction bytes alive at the peak (gathered, being concatenated, the last step's), the
        moment).
    """
    if accumulate_every:
        steps = min(steps, 2 * accumulate_every + 1)  # after the first move to the host the cycles repeat
    elif steps > 3 and held_bytes:
        # Nothing leaves the GPU, so every step holds more than the one before: the last step is the peak,
        # from its state (k - 1 batches gathered, the previous step's tensors alive). O(1) for any eval set.
        held = (steps - 1) * held_bytes
        forward, concat = held + step_bytes + transient, 2 * held + step_bytes + held_bytes
        return (concat, concat, "eval concat") if concat > forward else (forward, held + step_bytes, "eval forward")
    elif not held_bytes:
        steps = min(steps, 1)  # loss only: every step is the same
    held = 0
    previous = 0  # the last step's returned tensors, still referenced by the loop's variables
    best, best_held, moment = 0, 0, "eval forward"
    cycle = 0
    for _ in range(steps):
        now = held + previous + transient
        if now > best:
            best, best_held, moment = now, held + previous, "eval forward"
        if held_bytes:
            if held == 0:
                held = held_bytes  # the container takes the first batch's tensors themselves
                previous = step_bytes - held_bytes
            else:
                concat = held + step_bytes + held + held_bytes
                if concat > best:
                    best, best_held, moment = concat, concat, "eval concat"
                held += held_bytes
                previous = step_bytes
        else:
            previous = 0  # prediction_loss_only: the step returns the loss alone
        cycle += 1
        if accumulate_every and cycle == accumulate_every:
            held, cycle = 0, 0  # to_cpu_and_numpy: copied tensor by tensor, then empty_cache
            previous = step_bytes if held_bytes else 0
    return best, best_held, moment


def eval_phase(shape: ModelShape, spec: QLoraSpec, train: Estimate, hw: Hardware, run: RunPhases,
               framework: Framework, seq: int) -> PhasePeak:
    """Evaluation in the middle of training at ``per_device_eval_batch_size``: no grad, eval mode, beside the
    weights, adapters and optimizer states; the logits kept per :attr:`RunPhases.eval_logits`."""
    assert run.eval_batch is not None
    b = run.eval_batch
    rows = 2 * b if run.trainer in ("dpo", "reward") else b
    T = rows * seq
    fw = framework if run.trainer == "sft" else TRL_TRAINERS
    if run.trainer == "reward":
        fw = replace(fw, logits="score")
    pr = precision(spec, fw)
    notes: list[str] = []
    layer = nograd_layer_bytes(shape, spec, rows, seq, pr)
    hid = pr.stream * shape.hidden * T
    V = shape.vocab
    world = run.world_size
    labels = 8 * T * world
    keeps = run.eval_logits != "none" and fw.logits != "score"
    if fw.logits == "score":
        head = 2 * T
        step_logits = 0
    elif fw.logits == "chunked":
        head = _fused_head_nograd(shape, pr, T)
        step_logits = 0
        if keeps:
            # trl 1.16 prediction_step: with compute_metrics a second no-grad forward returns the full logits
            head = max(head, _full_logits_nograd(shape, fw, pr, T, with_loss=False))
            notes.append("TRL computes the loss through its fused head and, for compute_metrics, runs a second "
                         "no-grad forward for the full logits")
    else:
        # HF Trainer's prediction_step always asks compute_loss for the outputs: the full logits are built even
        # when only the loss is kept, and dropped afterwards.
        head = _full_logits_nograd(shape, fw, pr, T, with_loss=True)
    if keeps:
        step_logits = returned_logit_bytes(fw, pr) * T * V * world
    transient = max(layer, hid + head)
    if run.eval_logits == "kept" and keeps:
        step_returned, step_held = step_logits + labels, step_logits + labels
    elif run.eval_logits == "argmax" and keeps:
        # preprocess_logits_for_metrics turns the logits into [rows, s] ids before they are gathered
        step_returned, step_held = 8 * T * world + labels, 8 * T * world + labels
        # the step's full logits are still alive while argmax makes the ids (the loss' temporaries are gone)
        transient = max(transient, step_logits + 8 * T * world)
    else:
        step_returned = step_held = 0
    steps = math.ceil(run.eval_examples / (b * world)) if run.eval_examples else 1
    every = run.eval_accumulation_steps
    peak, held, moment = eval_accumulation_peak(step_returned, step_held, transient, steps, every)
    held_steps = min(steps, every) if every else steps
    if step_held:
        per = step_held
        if run.eval_examples is None:
            notes.append(f"predictions stay on the GPU until the eval set ends: +{per / 2**30:.2f} GiB per eval "
                         "batch (planned for one batch; give the eval set size or eval_accumulation_steps)")
        else:
            notes.append(f"{held_steps} eval batches of predictions held on the GPU at once "
                         f"({per / 2**30:.2f} GiB each)" + ("" if every else "; eval_accumulation_steps=N moves "
                                                             "them to the host every N batches"))
    base = _resident(train, T)
    moments = {moment: replace(base, temporaries=peak - held, eval_predictions=held)}
    # The allocator's pool from training stays reserved; the evaluation's own logits add their share.
    frag = hw.fragmentation if hw.fragmentation is not None else fw.fragmentation
    f_logits = frag[1] if spec.gradient_checkpointing else frag[3]
    overhead = _align(f_logits * (4 * T * V if fw.logits == "dropped" or keeps else 0))
    return _phase("eval", rows, seq, moments, overhead, train.breakdown.cuda_context, train.paged_in_process_bytes,
                  tuple(notes))


def _eval_segments(shape: ModelShape, spec: QLoraSpec, fw: Framework, run: RunPhases, ev: PhasePeak,
                   train: PhasePeak) -> int:
    """What an evaluation reserves beside the training pool, in segments of its own (:mod:`.pool`).

    The evaluation's no-grad forward at ``per_device_eval_batch_size`` rows makes wider tensors than the step:
    those no block the step left cached can hold (best fit, counted by kind: the fused head's tile, the
    dequantized weights, the logits and their fp32 upcast, autocast's half lm_head) open segments of their own.
    HF's loss upcasts the full logits and takes their log-softmax (two fp32 ``[rows x seq, vocab]`` tensors);
    TRL's fused head makes one tile of ``min(rows x seq, 4096)`` tokens, and an MLP wider than the step's
    dequantized weights needs its intermediates placed anew. Logits kept for compute_metrics stay in their
    block and are concatenated into a new, larger tensor at every step (``EvalLoopContainer``)."""
    pr = precision(spec, fw)
    pool = train_blocks(shape, spec, fw, pr, train.rows, train.seq, region=loading_region(shape, spec, fw, pr))
    kept = run.eval_logits == "kept" and fw.logits != "score"
    held = returned_logit_bytes(fw, pr) * ev.rows * ev.seq * shape.vocab * run.world_size if kept else 0
    assert run.eval_batch is not None
    steps = math.ceil(run.eval_examples / (run.eval_batch * run.world_size)) if run.eval_examples else 1
    return eval_loop_segments(pool, eval_moments(shape, spec, fw, pr, ev.rows, ev.seq), held, steps,
                              run.eval_accumulation_steps)


def _beside_training_pool(phase: PhasePeak, train: PhasePeak, segments: int = 0) -> PhasePeak:
    """An evaluation in the middle of training runs in the allocator pool training left: neither HF Trainer nor
    TRL empties the cache before ``evaluate()`` (only ``torch_empty_cache_steps`` would), so the process holds at
    least what the training step reserved, plus the ``segments`` its own tensors could not take from that pool
    (:func:`_eval_segments`)."""
    floor = train.peak_reserved_bytes + segments
    if phase.peak_reserved_bytes >= floor:
        return phase
    lift = floor - phase.peak_reserved_bytes
    bd = replace(phase.breakdown, allocator_overhead=phase.breakdown.allocator_overhead + lift)
    return replace(phase, peak_reserved_bytes=phase.peak_reserved_bytes + lift,
                   process_bytes=phase.process_bytes + lift, device_bytes=phase.device_bytes + lift, breakdown=bd,
                   notes=(*phase.notes, "the training step's allocator pool stays reserved through the evaluation "
                                        f"({train.peak_reserved_bytes / 2**30:.2f} GiB)"
                          + (f", and its tensors wider than any block of that pool (the logits, the fused "
                             f"head's tile, the MLP's) open {segments / 2**30:.2f} GiB of segments beside it"
                             if segments else "")))


def kv_cache_bytes(shape: ModelShape, rows: int, tokens: int, dtype_bytes: int) -> int:
    """A DynamicCache of ``tokens`` positions: keys and values of every layer, [rows, kv_heads, tokens,
    head_dim] each."""
    return 2 * shape.layers * rows * shape.kv_heads * shape.head_dim * tokens * dtype_bytes


def generation_phase(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, train: Estimate, hw: Hardware,
                     run: RunPhases, name: str = "generation", framework: Framework | None = None) -> PhasePeak:
    """GRPO's generation without vLLM: ``model.generate`` on every row of the generation batch at once, with a
    DynamicCache, gradient checkpointing off and no grad; then the no-grad scoring passes. ``framework``
    overrides TRL's dtypes (a CPU replay without autocast)."""
    fw = framework or TRL_TRAINERS
    pr = precision(spec, fw)
    steps = run.steps_per_generation or run.grad_accum
    rows = batch * steps
    G = run.num_generations
    if (rows * run.world_size) % G:
        raise PlanInputError(f"GRPO generates {rows * run.world_size} completions per step "
                             f"(batch {batch} x steps_per_generation {steps} x {run.world_size} GPUs), not a multiple "
                             f"of num_generations {G}: change the batch or num_generations")
    P, C = _grpo_prompt(run, seq), _grpo_completion(run)
    kvb = attention_bytes(spec, pr)  # k and v come out of k_proj/v_proj in the attention dtype
    # The last token is sampled, not fed back: the cache ends at P + C - 1 positions.
    kv_full = kv_cache_bytes(shape, rows, P + C - 1, kvb)
    one_layer = kv_cache_bytes(shape, rows, P + C - 2, kvb) // (2 * shape.layers)  # torch.cat's old tensor
    ids = 8 * rows * (P + C) * 3  # prompt + completion ids, attention mask, the growing output
    V = shape.vocab
    # the last position's logits: the model's (fp32: under autocast accelerate's copy replaces the half ones),
    # generate's fp32 copy, the processed clone and the softmax probabilities (TRL's top_k=0, top_p=1: no warper)
    last_logits = rows * V * 16
    base = _resident(train, rows * P)
    prefill_layer = nograd_layer_bytes(shape, spec, rows, P, pr)
    moments = {
        "prefill": replace(base, kv_cache=kv_cache_bytes(shape, rows, P, kvb), temporaries=prefill_layer + ids),
        "decode (last token)": replace(base, kv_cache=kv_full, temporaries=one_layer + last_logits + ids
                                       + nograd_layer_bytes(shape, spec, rows, 1, pr)),
    }
    needs_old = run.grad_accum % (steps * 1) != 0
    beta = run.beta or 0.0
    if beta != 0.0 or needs_old:
        L = P + C
        # the old policy scores with its adapters; the reference (beta != 0) with them switched off
        scored = nograd_layer_bytes(shape, spec, batch, L, pr, adapters=needs_old)
        head = pr.stream * shape.hidden * batch * L + _fused_head_nograd(shape, pr, batch * C)
        moments["scoring"] = replace(base, temporaries=max(scored, head) + ids + 4 * rows * C * 2)
    notes = [f"generation: {rows} rows at once (batch {batch} x steps_per_generation {steps}; "
             f"{rows // G if rows >= G else rows / G:g} prompts x {G} generations per GPU), KV cache for "
             f"{P} prompt + {C} completion tokens: {kv_full / 2**30:.2f} GiB"]
    if beta == 0.0:
        notes.append("beta 0.0 (TRL 1.16's default): no reference model and no reference forward")
    else:
        notes.append(f"beta {beta:g}: the reference (adapter switched off) scores each {batch}-row chunk, no grad")
    return _phase(name, rows, P + C, moments, 0, train.breakdown.cuda_context, train.paged_in_process_bytes,
                  tuple(notes))


def precompute_phase(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, train: Estimate,
                     run: RunPhases) -> PhasePeak:
    """DPO/KTO ``precompute_ref_log_probs``: the reference over the dataset before training, no grad, before
    any optimizer state exists."""
    fw = TRL_TRAINERS
    pr = precision(spec, fw)
    b = run.precompute_batch or batch
    rows = 2 * b if run.trainer == "dpo" else b
    T = rows * seq
    base = replace(_resident(train, T), optimizer_states=0, optimizer_states_paged=0)
    transient = max(nograd_layer_bytes(shape, spec, rows, seq, pr, adapters=False),
                    pr.stream * shape.hidden * T + _fused_head_nograd(shape, pr, T))
    return _phase("precompute_ref", rows, seq, {"reference forward": replace(base, temporaries=transient)}, 0,
                  train.breakdown.cuda_context, 0)


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
    return _phase("load", 0, 0, load_moments(shape, spec, fw, est), 0, est.breakdown.cuda_context, 0)


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
    if run.trainer == "grpo":
        phases["generation"] = generation_phase(shape, spec, batch, seq, est, hw, run)
    if run.precompute_ref and run.trainer in ("dpo", "kto"):
        phases["precompute_ref"] = precompute_phase(shape, spec, batch, seq, est, run)
    if run.eval_batch is not None and run.trainer == "grpo":
        # GRPO's prediction_step generates for the eval batch (one generation per eval step) and scores it
        once = replace(run, steps_per_generation=1)
        phases["eval"] = generation_phase(shape, spec, run.eval_batch, seq, est, hw, once, "eval")
    elif run.eval_batch is not None:
        fw = framework or framework_for(spec)  # an unknown framework is the recipe's error, not planned as hf
        ev = eval_phase(shape, spec, est, hw, run, fw, run.eval_seq or train.seq)
        ev_fw = fw if run.trainer == "sft" else TRL_TRAINERS
        phases["eval"] = _beside_training_pool(ev, train, _eval_segments(shape, spec, ev_fw, run, ev, train))
    peak = max(phases, key=lambda k: phases[k].device_bytes)
    return RunPlan(trainer=run.trainer, phases=phases, peak_phase=peak, events=_events(shape, spec, est, run),
                   train=est, notes=tuple(notes))
