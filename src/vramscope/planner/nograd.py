"""The no-grad phases of a run: evaluation in the middle of training, GRPO's generation and DPO/KTO's
precomputed reference, and the no-grad forwards they are made of (one decoder layer, the LM head, the KV cache).

Each runs beside what stays resident (:func:`~vramscope.planner.run_types.resident`: the weights, the adapters,
the optimizer states) and is planned by :func:`~vramscope.planner.phases.plan_run`. docs/planner.md ("The whole
run") gives each term's source.

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import replace

from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import TOKEN_TILE, TRL_TRAINERS, VOCAB_TILE, Framework, Precision, precision
from vramscope.planner.layer import attention_bytes, forward_temporaries, merged_expert_bytes
from vramscope.planner.memory import Estimate, Hardware
from vramscope.planner.pool import eval_loop_segments, eval_moments, loading_region, train_blocks
from vramscope.planner.run_types import (
    PhasePeak,
    RunPhases,
    align,
    grpo_completion,
    grpo_prompt,
    phase_peak,
    resident,
    trainer_of,
)
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec


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


def fused_head_nograd(shape: ModelShape, pr: Precision, tokens: int) -> int:
    """TRL's fused LM head without grad: the gathered hidden rows, one tile, ~40 bytes of statistics a token."""
    tile = 2 * min(tokens, TOKEN_TILE) * VOCAB_TILE
    if pr.params == 4:  # an fp32 lm_head: each tile's weight rows and hidden rows cast to half
        tile += 2 * min(shape.vocab, VOCAB_TILE) * shape.hidden + 2 * min(tokens, TOKEN_TILE) * shape.hidden
    return pr.stream * shape.hidden * tokens + tile + 40 * tokens


def full_logits_nograd(shape: ModelShape, fw: Framework, pr: Precision, tokens: int, with_loss: bool) -> int:
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
    trainer = trainer_of(run)
    rows = trainer.rows_per_example * b
    T = rows * seq
    fw = TRL_TRAINERS if trainer.trl_step else framework
    if trainer.score_head:
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
        head = fused_head_nograd(shape, pr, T)
        step_logits = 0
        if keeps:
            # trl 1.16 prediction_step: with compute_metrics a second no-grad forward returns the full logits
            head = max(head, full_logits_nograd(shape, fw, pr, T, with_loss=False))
            notes.append("TRL computes the loss through its fused head and, for compute_metrics, runs a second "
                         "no-grad forward for the full logits")
    else:
        # HF Trainer's prediction_step always asks compute_loss for the outputs: the full logits are built even
        # when only the loss is kept, and dropped afterwards.
        head = full_logits_nograd(shape, fw, pr, T, with_loss=True)
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
    base = resident(train, T)
    moments = {moment: replace(base, temporaries=peak - held, eval_predictions=held)}
    # The allocator's pool from training stays reserved; the evaluation's own logits add their share.
    frag = hw.fragmentation if hw.fragmentation is not None else fw.fragmentation
    f_logits = frag[1] if spec.gradient_checkpointing else frag[3]
    overhead = align(f_logits * (4 * T * V if fw.logits == "dropped" or keeps else 0))
    return phase_peak("eval", rows, seq, moments, overhead, train.breakdown.cuda_context, train.paged_in_process_bytes,
                  tuple(notes))


def eval_segments(shape: ModelShape, spec: QLoraSpec, fw: Framework, run: RunPhases, ev: PhasePeak,
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


def beside_training_pool(phase: PhasePeak, train: PhasePeak, segments: int = 0) -> PhasePeak:
    """An evaluation in the middle of training runs in the allocator pool training left: neither HF Trainer nor
    TRL empties the cache before ``evaluate()`` (only ``torch_empty_cache_steps`` would), so the process holds at
    least what the training step reserved, plus the ``segments`` its own tensors could not take from that pool
    (:func:`eval_segments`)."""
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
    P, C = grpo_prompt(run, seq), grpo_completion(run)
    kvb = attention_bytes(spec, pr)  # k and v come out of k_proj/v_proj in the attention dtype
    # The last token is sampled, not fed back: the cache ends at P + C - 1 positions.
    kv_full = kv_cache_bytes(shape, rows, P + C - 1, kvb)
    one_layer = kv_cache_bytes(shape, rows, P + C - 2, kvb) // (2 * shape.layers)  # torch.cat's old tensor
    ids = 8 * rows * (P + C) * 3  # prompt + completion ids, attention mask, the growing output
    V = shape.vocab
    # the last position's logits: the model's (fp32: under autocast accelerate's copy replaces the half ones),
    # generate's fp32 copy, the processed clone and the softmax probabilities (TRL's top_k=0, top_p=1: no warper)
    last_logits = rows * V * 16
    base = resident(train, rows * P)
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
        head = pr.stream * shape.hidden * batch * L + fused_head_nograd(shape, pr, batch * C)
        moments["scoring"] = replace(base, temporaries=max(scored, head) + ids + 4 * rows * C * 2)
    notes = [f"generation: {rows} rows at once (batch {batch} x steps_per_generation {steps}; "
             f"{rows // G if rows >= G else rows / G:g} prompts x {G} generations per GPU), KV cache for "
             f"{P} prompt + {C} completion tokens: {kv_full / 2**30:.2f} GiB"]
    if beta == 0.0:
        notes.append("beta 0.0 (TRL 1.16's default): no reference model and no reference forward")
    else:
        notes.append(f"beta {beta:g}: the reference (adapter switched off) scores each {batch}-row chunk, no grad")
    return phase_peak(name, rows, P + C, moments, 0, train.breakdown.cuda_context, train.paged_in_process_bytes,
                  tuple(notes))


def precompute_phase(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, train: Estimate,
                     run: RunPhases) -> PhasePeak:
    """DPO/KTO ``precompute_ref_log_probs``: the reference over the dataset before training, no grad, before
    any optimizer state exists."""
    fw = TRL_TRAINERS
    pr = precision(spec, fw)
    b = run.precompute_batch or batch
    rows = trainer_of(run).rows_per_example * b
    T = rows * seq
    base = replace(resident(train, T), optimizer_states=0, optimizer_states_paged=0)
    transient = max(nograd_layer_bytes(shape, spec, rows, seq, pr, adapters=False),
                    pr.stream * shape.hidden * T + fused_head_nograd(shape, pr, T))
    return phase_peak("precompute_ref", rows, seq, {"reference forward": replace(base, temporaries=transient)}, 0,
                  train.breakdown.cuda_context, 0)

