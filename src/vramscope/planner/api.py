"""The planner's public functions: :func:`plan` and :func:`recommend`.

Both take the model as a registry name, a config.json dict or a :class:`ModelShape`, the recipe as a
:class:`~vramscope.recipe.QLoraSpec` and the batch shape, and return plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from vramscope.planner import gpus, hub_cache, registry, rules
from vramscope.planner.batching import largest_divisor as _largest_divisor
from vramscope.planner.errors import PlanInputError, UnknownModelError
from vramscope.planner.frameworks import TRL_TRAINERS, component_notes, framework_for, style_named
from vramscope.planner.layer import expert_dropout_refusal
from vramscope.planner.memory import Breakdown, Estimate, Hardware, estimate
from vramscope.planner.nofit import explain
from vramscope.planner.phase_advice import load_reason, phase_reason, phase_recommendations
from vramscope.planner.phases import RunPhases, RunPlan, load_phase, plan_run, trainer_of
from vramscope.planner.recommendation import Recommendation as Recommendation  # re-exported: its old home
from vramscope.planner.rules import Candidate, Situation
from vramscope.planner.search import MAX_BATCH, MAX_SEQ, largest_fitting
from vramscope.planner.search import max_batch_size as max_batch_size  # re-exported: its old home
from vramscope.planner.search import max_seq_len as max_seq_len  # re-exported: its old home
from vramscope.planner.settings import offered, written_as
from vramscope.planner.shapes import ModelShape, shape_from_config
from vramscope.planner.totals import PlanTotals
from vramscope.recipe import QLoraSpec
from vramscope.units import GIB, MAX_BYTES

ModelRef = str | Mapping[str, Any] | ModelShape


@dataclass(frozen=True, kw_only=True)
class Plan(PlanTotals):
    """A prediction of one QLoRA/LoRA run's GPU memory (the shared fields: :class:`PlanTotals`)."""

    breakdown: Breakdown
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    target_batch: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    recommendations: tuple[Recommendation, ...] = ()
    # Given a GPU memory: why the plan does not fit (None when it does), and whether the longest sequence
    # stopped at the model's context (max_position_embeddings) rather than at the memory.
    cannot_fit_reason: str | None = None
    max_seq_len_at_context: bool = False
    moe: bool = False  # a mixture of experts: its fused experts are among the unquantized parameters
    framework: str = "hf"
    framework_title: str = ""
    # breakdown line -> why its size depends on the framework (the lines the framework decides)
    from_framework: dict[str, str] = field(default_factory=dict)
    # The whole run (planner/phases.py): every phase's peak, the one that sets the totals above, the events
    # between steps. ``phases`` and ``peak_phase`` above stay the training step's own moments.
    run: RunPlan | None = None
    host_offload_bytes: int = 0  # pinned host memory for offloaded checkpoints (--framework unsloth)
    run_phases: RunPhases = field(default_factory=RunPhases)
    # What the user must know before anything else (MoE experts that 4-bit loading leaves 16-bit).
    warnings: tuple[str, ...] = ()

    def _repr_html_(self) -> str:
        """How a notebook shows a plan (the last value of a cell)."""
        from vramscope.planner.notebook import plan_html

        return plan_html(self)

    @property
    def run_peak_phase(self) -> str:
        """The phase of the run that sets its peak (``train``, ``eval``, ``generation``, ``precompute_ref``)."""
        return self.run.peak_phase if self.run is not None else "train"

    @property
    def max_allocated_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated()`` reads after the run: the largest allocated of any phase (the
        totals are the phase that needs the most memory on the GPU, which can allocate less: an evaluation beside
        the training step's reserved pool)."""
        if self.run is None:
            return self.peak_allocated_bytes
        return max(self.peak_allocated_bytes, *(ph.peak_allocated_bytes for ph in self.run.phases.values()))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.totals_dict(), "max_allocated_bytes": self.max_allocated_bytes, "peak_phase": self.run_peak_phase,
            "step_peak_phase": self.peak_phase, "breakdown": self.breakdown.to_dict(),
            "phases": {k: v.to_dict() for k, v in self.run.phases.items()} if self.run is not None else {},
            "step_phases": dict(self.phases), "trainer": self.run_phases.trainer,
            "run": self.run_phases.to_dict(), "warnings": list(self.warnings),
            "events": {e.name: e.to_dict() for e in self.run.events} if self.run is not None else {},
            "trainable_params": self.trainable_params, "total_params": self.total_params,
            "framework": self.framework, "framework_title": self.framework_title,
            "host_offload_bytes": self.host_offload_bytes,
            "from_framework": dict(self.from_framework),
        }
        if self.gpu_memory_bytes is not None:
            out.update(gpu_memory_bytes=self.gpu_memory_bytes, fits=self.fits, max_batch_size=self.max_batch_size,
                       max_seq_len=self.max_seq_len, max_seq_len_at_context=self.max_seq_len_at_context,
                       cannot_fit_reason=self.cannot_fit_reason)
        if self.target_batch is not None:
            out.update(target_batch=self.target_batch, micro_batch_size=self.micro_batch_size,
                       grad_accum_steps=self.grad_accum_steps)
        out["recommendations"] = [r.to_dict() for r in self.recommendations]
        out["notes"] = list(self.notes)
        return out


def resolve_model(model: ModelRef) -> tuple[str, ModelShape]:
    """(display name, shape) for a registry name, a config.json dict or a shape."""
    if isinstance(model, ModelShape):
        return model.model_type, model
    if isinstance(model, str):
        try:
            name = registry.resolve(model)
        except UnknownModelError:
            # Any hub id whose config.json this machine has already downloaded plans offline.
            cached = hub_cache.cached_config(model)
            if cached is None:
                raise
            return model.strip(), shape_from_config(cached)
        return name, shape_from_config(registry.get_config(name))
    if isinstance(model, Mapping):
        shape = shape_from_config(model)
        raw = model.get("_name_or_path") or model.get("name_or_path")
        return (str(raw) if raw else f"{shape.model_type} ({shape.total_params() / 1e9:.2f}B)"), shape
    raise PlanInputError(f"model must be a registry name or a config dict, got {type(model).__name__}")


# Batch sizes, lengths and targets above a trillion are refused: no run has them, and below it every search
# here is bounded (the divisor search takes at most a million steps).
MAX_COUNT = 10**12


def _positive(name: str, value: Any, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanInputError(f"{name} must be a positive whole number, got {value!r}"[:200])
    if most is not None and value > most:
        raise PlanInputError(f"{name} must be at most {most:,}, got {value:.3g}")
    return value


# The cards people fine-tune on, smallest first: what a plan without --gpu names as fitting or not.
COMMON_CARDS = ("T4", "RTX-4080", "L4", "RTX-4090", "RTX-5090", "A100-40GB", "L40S", "A6000", "A100-80GB",
                "H100-80GB", "H200")


def _cards_note(device_bytes: int) -> str:
    """Without a GPU given: the common cards this step fits, so that the plan says what it fits on."""
    fitting = [name for name in COMMON_CARDS if device_bytes <= gpus.get_gpu(name).memory_bytes]
    if not fitting:
        return (f"fits none of the common cards at this batch ({', '.join(COMMON_CARDS)}): see the ways to use less "
                "memory, or plan several GPUs with --gpus N")
    smallest = gpus.get_gpu(fitting[0])
    too_small = [name for name in COMMON_CARDS if name not in fitting]
    where = f"{smallest.name} ({smallest.memory_bytes / 2**30:.1f} GiB) and every larger common card"
    if too_small:
        where += f", not on {', '.join(too_small)}"
    return f"fits at this batch on {where}; give --gpu NAME for the largest batch and sequence there"


def capacity_of(gpu_memory: int | str | None = None, gpu: str | None = None) -> tuple[int | None, Hardware]:
    """GPU memory in bytes (from ``--gpu-memory`` or ``--gpu``) and the matching :class:`Hardware`."""
    hw = Hardware()
    cap: int | None = None
    if gpu is not None:
        g = gpus.get_gpu(gpu)
        cap = g.memory_bytes
        hw = Hardware(cublas_workspace_bytes=g.cublas_workspace_bytes)
    if gpu_memory is not None:
        if isinstance(gpu_memory, str):
            cap = gpus.parse_gpu_memory(gpu_memory)  # a number without a unit is refused, with its readings
        else:
            cap = _positive("GPU memory", gpu_memory, MAX_BYTES)
    return cap, hw


MIN_SAVING_SHARE = 0.01  # the smallest saving worth offering, as a share of the planned step


def _recommendations(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, current: Estimate,
                     peak: int, capacity: int | None, style: str | None = None, grad_accum: int = 1,
                     trainer: str = "sft", loading: bool = False, trl_step: bool = False) -> list[Recommendation]:
    """Alternatives ranked by predicted saving: what each rule of :data:`~vramscope.planner.rules.RULES` proposes,
    kept where it saves enough. Each saving is a difference of two model predictions, so it stays meaningful when
    ``peak`` is a measurement rather than the model's own figure. ``style`` says in whose keys ``how`` is written
    (default: the recipe's framework); with ``trl_step`` (the step is a TRL trainer's own) the changes that are
    its phases' own are left out.

    With ``loading`` (a plan, whose run loads the model first) each side is the larger of the step and the
    loading (:func:`~vramscope.planner.phases.load_phase`): a change to the step's batch or length saves only
    down to what loading holds, and is not enough where loading alone overflows the capacity."""
    fw = framework_for(spec)
    loaded = load_phase(shape, spec, current, fw).device_bytes if loading else 0
    base = max(current.device_bytes, loaded)
    situation = Situation(
        shape=shape, spec=spec, batch=batch, seq=seq, hw=hw, current=current, peak=peak, capacity=capacity,
        loaded=loaded, base=base, deficit=max(peak, base) - capacity if capacity is not None else None,
        framework=fw, style=style or fw.style,  # qlora.py takes HF TrainingArguments flags: its framework's is hf
        trainer=trainer, grad_accum=grad_accum)
    out: list[Recommendation] = []
    for rule in rules.RULES:  # read at each call: a rule added to the tuple is walked at once
        for candidate in rule(situation):
            if candidate.under_trl_step or not trl_step:
                out += _judged(candidate, situation, loading)
    out.sort(key=lambda r: r.saving_bytes, reverse=True)
    return out


def _judged(c: Candidate, s: Situation, loading: bool) -> list[Recommendation]:
    """The candidate as a recommendation, when its style can say it and it saves enough (else none)."""
    if not offered(c.change, s.style):  # a change the user's program has no key for (axolotl's own trainer)
        return []
    saving = c.saving
    if saving is None:
        new_spec = c.spec or s.spec
        after = estimate(s.shape, new_spec, s.batch if c.batch is None else c.batch,
                         s.seq if c.seq is None else c.seq, s.hw, framework=c.framework)
        framework = c.framework or framework_for(new_spec)
        held = load_phase(s.shape, new_spec, after, framework).device_bytes if loading else 0
        saving = s.base - max(after.device_bytes, held)
    # A change that saves less than 1% of the step is noise, not advice ("saves 0.01 GiB").
    if saving <= 0 or (c.noise_floor and saving < MIN_SAVING_SHARE * s.base):
        return []
    return [Recommendation(c.name, saving, c.text.format(saving=saving / GIB), c.change,
                           None if s.deficit is None else saving >= s.deficit,
                           written_as(c.change, s.style, s.trainer))]


def recommend(
    model: ModelRef,
    batch_size: int,
    seq_len: int,
    spec: QLoraSpec | None = None,
    *,
    peak_bytes: int | None = None,
    capacity_bytes: int | None = None,
    gpu: str | None = None,
    style: str | None = None,
    grad_accum: int = 1,
) -> list[Recommendation]:
    """Ways to cut a run's GPU memory, ranked by predicted saving (largest first).

    Args:
        model: registry name (``"Llama-2-7B"``), config.json dict, or :class:`ModelShape`.
        batch_size: the micro-batch of the run.
        seq_len: its (maximum) sequence length.
        spec: the recipe; default the QLoRA reference recipe.
        peak_bytes: the run's measured peak GPU memory (e.g. from an OOM post-mortem); default the
            planner's own prediction. Used to judge whether one change is enough.
        capacity_bytes: the GPU's memory; with ``peak_bytes`` it marks each recommendation ``sufficient``.
        gpu: a GPU registry name, for its capacity (when ``capacity_bytes`` is not given) and its cuBLAS workspace.
        style: whose keys ``how`` is written in (``hf``, ``trl``, ``loop``, ``axolotl``); default the
            recipe's framework.
        grad_accum: the run's gradient accumulation steps (a smaller micro-batch keeps micro x accumulation).

    Returns:
        Recommendations with ``name``, ``saving_bytes`` (predicted), ``text`` (one line), ``change``,
        ``sufficient`` and ``how``; only those predicted to save something.

    Raises:
        PlanInputError: unknown model or GPU, malformed config, non-positive sizes, bad recipe values.
    """
    spec = spec or QLoraSpec()
    _, shape = resolve_model(model)
    batch_size = _positive("batch size", batch_size, MAX_COUNT)
    seq_len = _positive("sequence length", seq_len, MAX_COUNT)
    cap, hw = capacity_of(None, gpu)
    if capacity_bytes is not None:
        cap = _positive("capacity", capacity_bytes, MAX_BYTES)
    current = estimate(shape, spec, batch_size, seq_len, hw)
    peak = current.device_bytes if peak_bytes is None else _positive("peak", peak_bytes, MAX_BYTES)
    if style is not None:
        style_named(style)  # an unknown style is refused, naming the known ones
    grad_accum = _positive("gradient accumulation", grad_accum, MAX_COUNT)
    return _recommendations(shape, spec, batch_size, seq_len, hw, current, peak, cap, style, grad_accum)


def plan(
    model: ModelRef,
    batch_size: int,
    seq_len: int,
    spec: QLoraSpec | None = None,
    *,
    gpu_memory: int | str | None = None,
    gpu: str | None = None,
    target_batch: int | None = None,
    hardware: Hardware | None = None,
    read_from_command: bool = False,
    run: RunPhases | None = None,
    style: str | None = None,
    grad_accum: int = 1,
) -> Plan:
    """Predict the GPU memory of a QLoRA/LoRA run before it starts.

    Args:
        model: registry name (case-insensitive), config.json dict, or :class:`ModelShape`.
        batch_size: micro-batch size.
        seq_len: tokens per sequence.
        spec: the recipe (bits, LoRA, optimizer, checkpointing, attention); default the QLoRA reference recipe.
        gpu_memory: the GPU's memory as bytes or text (``"24GiB"``); enables ``fits`` and the maxima.
        gpu: a GPU registry name instead of ``gpu_memory`` (``"RTX-4090"``, ``"A100-80GB"``).
        target_batch: an effective batch to reach with gradient accumulation (needs a GPU memory).
        hardware: override the device constants (context size, workspaces, fragmentation), e.g. from calibration.
        read_from_command: the recipe was read from the training command itself (``plan -- CMD``), so hints on
            how to spell that program's defaults as flags are left out.
        run: the trainer and the phases besides the training step (:class:`~vramscope.planner.phases.RunPhases`:
            DPO, GRPO, reward, KTO; evaluation); default one SFT step, as before. The totals are then the run's
            peak over its phases, ``run`` has every phase.
        style: whose keys the recommendations are written in (``hf``, ``trl``, ``loop``, ``axolotl``: see
            :func:`vramscope.planner.settings.style_of`); default the recipe's framework.
        grad_accum: the run's own gradient accumulation steps: a smaller micro-batch keeps the effective batch
            ``batch_size x grad_accum``.

    Returns:
        A :class:`Plan` with the three totals (peak allocated, peak reserved, process memory), the breakdown at
        the peak, and, given a GPU memory, whether it fits, the largest batch and sequence length, and the
        recommendations.

    Raises:
        PlanInputError: unknown model or GPU, malformed config, non-positive sizes, unparsable memory, bad recipe.
    """
    spec = spec or QLoraSpec()
    name, shape = resolve_model(model)
    batch_size = _positive("batch size", batch_size, MAX_COUNT)
    seq_len = _positive("sequence length", seq_len, MAX_COUNT)
    cap, hw = capacity_of(gpu_memory, gpu)
    if hardware is not None:
        hw = hardware
    if target_batch is not None:
        _positive("target batch", target_batch, MAX_COUNT)
    run = run or RunPhases()
    notes: list[str] = []
    if isinstance(model, str) and registry.representative(model) == name:
        notes.insert(0, f"--model {model.strip()} is a size, not a model: planned as {name}, a representative "
                        f"{model.strip()} ({shape.model_type}, vocabulary {shape.vocab:,}); name the model for "
                        "its own figures (the vocabulary and the layer shapes change them)")
    if gpu is not None and spec.compute_dtype == "bf16" and not gpus.supports_bf16(gpu):
        # A T4 or V100 has no bf16 arithmetic: people train there in fp16 (bf16=True fails or is emulated).
        spec = spec.with_(compute_dtype="fp16")
        notes.append(f"{gpus.get_gpu(gpu).name} has no bf16 arithmetic (before Ampere): planned in fp16, as runs "
                     "there train (--fp16 / fp16=True; bf16=True is refused or emulated, slowly)")
    trainer = trainer_of(run)
    if trainer.trl_step and spec.framework != TRL_TRAINERS.name:
        # DPO, GRPO, KTO and the reward trainer are TRL's: its dtypes (no kbit preparation, bf16 adapters) and
        # its fused LM head, whatever framework the recipe named
        notes.append(f"trainer {run.trainer} is TRL's: planned with TRL's dtypes and fused LM head")
        spec = spec.with_(framework=TRL_TRAINERS.name)
    whole = plan_run(shape, spec, batch_size, seq_len, hw, run)
    top = whole.peak
    step_rows, step_len = whole.phases["train"].rows, whole.phases["train"].seq
    est = whole.train if trainer.trl_step else estimate(shape, spec, batch_size, seq_len, hw)
    capacity = gpus.capacity_note(gpu, gpu_memory)  # which capacity, in which unit (GB vs GiB)
    if capacity is not None:
        notes.append(capacity)
    if est.breakdown.optimizer_states_paged:
        notes.append("paged optimizer states live in CUDA unified memory: outside torch's counters, paged to the "
                     "host under memory pressure")
    if shape.max_positions is not None and seq_len > shape.max_positions:
        notes.append(f"sequence length {seq_len} exceeds the model's max_position_embeddings {shape.max_positions}")
    defaults_note = framework_for(spec).defaults_note
    if (defaults_note and spec.bits in (4, 8) and spec.compute_dtype != "fp32" and not read_from_command
            and not trainer.trl_step):
        notes.append(defaults_note)
    refusal = expert_dropout_refusal(shape, spec)
    warnings = (*((refusal,) if refusal else ()), *moe_warnings(shape, spec, whole.train))
    if cap is None:
        notes.append(_cards_note(top.device_bytes))
    fits = mb = ms = micro = accum = None
    at_context = False
    if cap is not None:
        fits = top.device_bytes <= cap
        if whole.phases.keys() - {"load"} == {"train"} and not trainer.trl_step:
            # loading holds the same at every batch and length: where it alone overflows, nothing fits
            loads = whole.phases["load"].device_bytes <= cap if "load" in whole.phases else True
            mb = max_batch_size(shape, spec, seq_len, cap, hw) if loads else 0
            ms = max_seq_len(shape, spec, batch_size, cap, hw, limit=shape.max_positions) if loads else 0
        else:
            # the whole run must fit: every phase at the searched batch or length (any batch divides G here)
            search = replace(run, num_generations=1)
            mb = largest_fitting(lambda b: plan_run(shape, spec, b, seq_len, hw, search).peak.device_bytes <= cap,
                                 MAX_BATCH)
            top_seq = min(MAX_SEQ, shape.max_positions) if shape.max_positions else MAX_SEQ
            ms = largest_fitting(
                lambda s: plan_run(shape, spec, batch_size, s, hw, search).peak.device_bytes <= cap, top_seq)
        at_context = shape.max_positions is not None and ms == shape.max_positions
        if target_batch is not None:
            if mb:
                # The largest micro-batch that fits and divides the target keeps the effective batch exact.
                micro = _largest_divisor(target_batch, min(mb, target_batch))
                accum = target_batch // micro
            else:
                notes.append(f"no batch fits in {cap / GIB:.1f} GiB at {seq_len} tokens, so target batch "
                             f"{target_batch} cannot be reached by accumulation")
    elif target_batch is not None:
        raise PlanInputError("--target-batch needs a GPU memory: add --gpu-memory 24GiB or --gpu NAME")
    grad_accum = _positive("gradient accumulation", grad_accum, MAX_COUNT)
    recs = _recommendations(shape, spec, step_rows, step_len, hw, est, est.device_bytes, cap, style, grad_accum,
                            run.trainer, loading=True, trl_step=trainer.trl_step)
    reason = None
    if cap is not None and not fits:
        reason = phase_reason(whole, cap)
        if reason is None:
            reason, recs = _cannot_fit(shape, spec, step_rows, step_len, hw, est, cap, name, recs, style,
                                       grad_accum)
            loading = load_reason(whole, cap)
            if loading is not None:  # the step overflows, and loading would have before it
                reason = f"{reason}; and {loading}"
    run_recs = phase_recommendations(shape, spec, batch_size, seq_len, hw, run, whole, cap)
    if whole.peak_phase not in ("train", "load"):
        # the training step's savings do not lower a peak set by evaluation or generation: that phase's first
        # (loading's peak is in the step's savings already: each is what the larger of the two drops by)
        recs = [*run_recs, *(recs if reason is None else [])]
    elif run_recs:
        recs = sorted([*run_recs, *recs], key=lambda r: r.saving_bytes, reverse=True)
    step = whole.train
    return Plan(
        model=name, batch_size=batch_size, seq_len=seq_len, spec=spec, peak_allocated_bytes=top.peak_allocated_bytes,
        peak_reserved_bytes=top.peak_reserved_bytes, process_bytes=top.process_bytes, peak_phase=step.peak_phase,
        breakdown=top.breakdown, phases=step.phases, trainable_params=est.trainable_params,
        total_params=shape.total_params(), gpu_memory_bytes=cap, fits=fits, max_batch_size=mb, max_seq_len=ms,
        target_batch=target_batch, micro_batch_size=micro, grad_accum_steps=accum, recommendations=tuple(recs),
        notes=tuple(notes), cannot_fit_reason=reason, max_seq_len_at_context=at_context,
        framework=spec.framework, from_framework=component_notes(spec), moe=bool(shape.experts),
        framework_title=framework_for(spec).title.replace("bf16 autocast", f"{spec.compute_dtype} autocast"),
        run=whole, run_phases=run, warnings=warnings, host_offload_bytes=whole.train.host_offload_bytes,
    )


def moe_warnings(shape: ModelShape, spec: QLoraSpec, est: Estimate) -> tuple[str, ...]:
    """What a quantized mixture-of-experts plan must say first: transformers 5 keeps the experts as fused 3-D
    parameters and bitsandbytes replaces only ``nn.Linear``, so the experts are loaded as they are stored."""
    if not shape.experts or spec.bits not in (4, 8):
        return ()
    bytes_per = est.breakdown.unquantized_params / max(1, shape.embedding_params + shape.lm_head_params
                                                        + shape.norm_params + shape.bias_params + shape.expert_params)
    experts = round(bytes_per * shape.expert_params)
    dtype = "fp32" if bytes_per > 3 else "bf16"
    why = (" (prepare_model_for_kbit_training upcasts every non-4-bit parameter to fp32)" if dtype == "fp32" else "")
    return (f"the {shape.experts} experts of each of the {shape.layers} layers stay {dtype}: transformers 5 stores "
            f"them as fused 3-D parameters and bitsandbytes {spec.bits}-bit quantizes only nn.Linear (attention"
            f"{', the shared expert' if shape.shared_expert_intermediate else ''}), so {experts / GIB:.1f} GiB "
            f"of expert weights are not quantized{why}. Ways out: "
            "LoRA on the attention only with the model in bf16 on a bigger card or several GPUs (plan --gpus), "
            "a quantization with fused-experts support (FP8, mxfp4, compressed-tensors), or transformers 4.x, "
            "whose experts are nn.Linear",)


def _cannot_fit(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware, est: Estimate, cap: int,
                name: str, recs: list[Recommendation], style: str | None = None,
                grad_accum: int = 1) -> tuple[str, list[Recommendation]]:
    """Why the plan does not fit and what would: more GPUs, offload, a smaller model or fewer bits first; the
    usual recommendations only when the weights leave room for them to matter."""
    why = explain(shape, spec, batch, seq, hw, est, cap, name, grad_accum)
    style = style or framework_for(spec).style
    ways = [replace(a, how=written_as(a.change, style)) for a in why.alternatives]
    if why.replaces_others:
        return why.reason, ways
    # Room for the usual changes: a smaller model only when none of them is enough on its own.
    enough = any(r.sufficient for r in recs)
    return why.reason, [*recs, *(w for w in ways if w.name != "smaller_model" or not enough)]
