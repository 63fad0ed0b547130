"""``vramscope plan --trace``: run the real training step on fake tensors and count its live bytes.

The analytic planner (:mod:`vramscope.planner.memory`) models a step; this traces one. The model is built from
its config with transformers (on the meta device, no weights), 4-bit linears become stand-ins that hold what
bitsandbytes holds, peft wraps it, the framework prepares it as its own code does (``hf``: peft's
``prepare_model_for_kbit_training``, the HF Trainer's checkpointing and ``use_cache=False``, its forward under
the Trainer's bf16 autocast (:mod:`vramscope.planner.trace.autocast`); ``trl``: TRL's SFTTrainer: no kbit
preparation, bf16 LoRA, input grads, TRL's own fused LM head with entropy and accuracy; ``loop``: a
hand-written loop that keeps the output until the next forward), and then two real steps (forward,
backward, gradient clipping where the Trainer clips, optimizer step) run under ``FakeTensorMode`` while
:class:`~vramscope.planner.trace.counter.LiveBytes` counts every storage in 512-byte blocks. The second step
is the steady state (optimizer states exist), as ``torch.cuda.max_memory_allocated`` after two steps.

What is not traced is modelled and listed in the result: the cuBLAS workspaces, the allocator's
fragmentation and the CUDA context (the analytic planner's :class:`~vramscope.planner.memory.Hardware`),
bitsandbytes' paged optimizer states (unified memory, outside the allocator). The fake tensors are CPU
tensors (a CPU-only torch cannot run autograd on fake CUDA tensors); the device-dependent choices CUDA makes
are made explicitly (:func:`~vramscope.planner.trace.standins.cuda_kernels`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vramscope.planner.api import ModelRef, capacity_of, resolve_model
from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import framework_for
from vramscope.planner.frameworks import traced as traced_frameworks
from vramscope.planner.memory import Hardware, estimate, validate_spec
from vramscope.planner.registry import get_config
from vramscope.planner.trace.autocast import cuda_autocast, outputs_to_fp32
from vramscope.planner.trace.counter import LiveBytes
from vramscope.planner.trace.standins import KERNELS_USED, BnbOptimizerStandIn, cuda_kernels, quantize_linears
from vramscope.recipe import QLoraSpec

INSTALL = "pip install 'vramscope[hf]'"
# The breakdown's order (the analytic plan's): what the model holds, then what the step makes.
CATEGORY_ORDER = ("quantized_weights", "quantization_constants", "unquantized_params", "buffers", "lora_weights",
                  "lora_gradients", "optimizer_states", "activations", "logits_and_loss", "temporaries", "other")
# Hears what the trace is doing, one short phrase at a time (the CLI's progress line).
Progress = Callable[[str], None]
# Tokens each step sees: random ids over the whole vocabulary, every position a label (packed full rows).
STEPS = 2


class TraceError(PlanInputError):
    """The step cannot be traced (a library missing, an architecture transformers cannot build)."""


def require_trace_libraries(bits: int = 4) -> None:
    """Raise :class:`TraceError` naming the install command when torch/transformers/peft are missing."""
    mods = ["torch", "transformers", "peft"] + (["bitsandbytes"] if bits == 4 else [])
    missing = [m for m in mods if importlib.util.find_spec(m) is None]
    if missing:
        raise TraceError(f"plan --trace needs {', '.join(missing)}; run: {INSTALL}")


@dataclass(frozen=True)
class TracePlan:
    """The traced step's memory, in the :class:`~vramscope.planner.api.Plan` vocabulary."""

    model: str
    batch_size: int
    seq_len: int
    spec: QLoraSpec
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    phases: dict[str, int]
    traced_peak_bytes: int
    optimizer_states_paged_bytes: int
    trainable_params: int
    total_params: int
    trace_seconds: float
    traced: tuple[str, ...] = ()
    modelled: tuple[str, ...] = ()
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": "trace", "model": self.model, "batch_size": self.batch_size, "seq_len": self.seq_len,
            "spec": self.spec.to_dict(), "framework": self.spec.framework,
            "peak_allocated_bytes": self.peak_allocated_bytes, "peak_reserved_bytes": self.peak_reserved_bytes,
            "process_bytes": self.process_bytes, "peak_phase": self.peak_phase, "breakdown": dict(self.breakdown),
            "phases": dict(self.phases), "traced_peak_bytes": self.traced_peak_bytes,
            "optimizer_states_paged_bytes": self.optimizer_states_paged_bytes,
            "trainable_params": self.trainable_params, "total_params": self.total_params,
            "trace_seconds": round(self.trace_seconds, 3), "traced": list(self.traced),
            "modelled": list(self.modelled),
        }
        if self.gpu_memory_bytes is not None:
            out.update(gpu_memory_bytes=self.gpu_memory_bytes, fits=self.fits)
        out["notes"] = list(self.notes)
        return out


@dataclass
class TraceResult:
    """What one traced (or real) run of the steps counted: the raw figures before the modelled parts."""

    peak_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    phases: dict[str, int]
    paged_bytes: int
    trainable_params: int
    seconds: float
    sdpa_kernels: dict[str, int] = field(default_factory=dict)
    attn: str = "sdpa"
    attn_note: str | None = None


# ---------------------------------------------------------------------------------------------------------------
# Building the model the way the framework does


def _dtype(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _build_on_meta(config: Mapping[str, Any], spec: QLoraSpec) -> tuple[Any, str, str | None]:
    """The model on the meta device with the attention the run gets, that attention's name, and a note when
    it is not the recipe's.

    A run that names no attention gets transformers' default for the architecture, and the recipe cannot say
    "none" (its default is ``sdpa``): where transformers refuses ``sdpa`` for the architecture (Gemma-2 in
    transformers 5) the run gets the architecture's own (eager), and so does the trace. flash-attn's kernels
    cannot run on fake tensors; SDPA's flash kernel, which saves the same output and log-sum-exp, stands in.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    asked = "sdpa" if spec.attn == "flash_attention_2" else spec.attn
    note = ("flash_attention_2 traced as SDPA's flash kernel (flash-attn cannot run on fake tensors; both save "
            "the output and the log-sum-exp)") if asked != spec.attn else None
    try:
        cfg = AutoConfig.for_model(**dict(config))
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(cfg, dtype=_dtype(spec.compute_dtype),
                                                         attn_implementation=asked)
        except ValueError as exc:
            if "attention implementation" not in str(exc):
                raise
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**dict(config)),
                                                         dtype=_dtype(spec.compute_dtype))
            used = str(model.config._attn_implementation)
            note = (f"{type(model).__name__} has no {asked} attention in this transformers; traced with its "
                    f"own ({used}), which a run that names none gets")
            return model, used, note
    except (ValueError, KeyError, TypeError, ImportError, AttributeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TraceError(f"transformers cannot build this model from its config ({first}); "
                         "plan without --trace uses the analytic model") from None
    return model, asked, note


def _materialize(model: nn.Module, device: str) -> None:
    """Give every parameter and buffer a tensor of its shape on ``device`` (fake under FakeTensorMode),
    keeping shared ones shared (tied embeddings stay one parameter)."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                           requires_grad=p.requires_grad)
            module._parameters[name] = memo[id(p)]
        for name, b in list(module._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                memo[id(b)] = torch.zeros(b.shape, dtype=b.dtype, device=device)
            module._buffers[name] = memo[id(b)]


def _lora_config(spec: QLoraSpec) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=spec.lora_r, lora_alpha=spec.lora_alpha, lora_dropout=spec.lora_dropout,
                      target_modules=list(spec.lora_targets) if spec.lora_targets else "all-linear",
                      task_type="CAUSAL_LM")


def _trainer_checkpointing(model: Any) -> None:
    """What transformers' Trainer calls when ``gradient_checkpointing=True`` (kwargs left to the library)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=None)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=None)


@contextlib.contextmanager
def _fake_safe_module_to() -> Iterator[None]:
    """``Module.to`` swaps a fake parameter with its converted copy, which torch refuses while FakeTensorMode
    holds a weak reference to it (peft calls ``.to`` on every new adapter); set its data instead, as
    ``Module._apply`` does for an ordinary parameter."""
    import torch.utils as tutils

    original = tutils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        try:
            original(t1, t2)
        except RuntimeError:
            t1.data = t2.data  # what _apply does for ordinary parameters: same object, converted data

    tutils.swap_tensors = swap
    try:
        yield
    finally:
        tutils.swap_tensors = original


def prepare_model(model: Any, spec: QLoraSpec) -> Any:
    """Apply the framework's own preparation and peft's LoRA; returns the peft model in train mode (the trace
    and ``bench/trace_vs_real.py``'s real step share it)."""
    with _fake_safe_module_to():
        return _prepare_as_framework(model, spec)


def _prepare_as_framework(model: Any, spec: QLoraSpec) -> Any:
    from peft import get_peft_model, prepare_model_for_kbit_training

    fw = framework_for(spec)
    quantized = spec.bits == 4
    ckpt = spec.gradient_checkpointing
    if fw.build.peft_kbit:  # tune.qlora.load_model, then (hf) the Trainer
        if quantized:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt)
        elif ckpt:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
        if ckpt:
            model.config.use_cache = False
        model = get_peft_model(model, _lora_config(spec))
        if ckpt and fw.build.trainer:
            _trainer_checkpointing(model)
        if fw.build.trainer:
            # the Trainer's last word in __init__ (transformers 5): config.use_cache = args.use_cache, False by
            # default, so a step without checkpointing builds no KV cache in its forward either
            model.config.use_cache = False
    else:  # trl: SFTTrainer.__init__ (TRL 1.16), then the Trainer's checkpointing
        model = get_peft_model(model, _lora_config(spec))
        if ckpt:
            model.enable_input_require_grads()
        if quantized and fw.adapters_half:  # TRL casts the adapters of a quantized model to bf16
            for name, p in model.named_parameters():
                if p.requires_grad and "lora_magnitude_vector" not in name:
                    p.data = p.data.to(torch.bfloat16)
        if fw.logits == "chunked":
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(model.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
        if ckpt and fw.build.trainer:
            _trainer_checkpointing(model)
    model.train()
    return model


def _optimizer(params: list[nn.Parameter], spec: QLoraSpec) -> torch.optim.Optimizer:
    """The optimizer the recipe names, as it behaves on CUDA (foreach for torch's)."""
    if spec.optim in ("adamw_torch", "adamw_torch_fused"):
        return torch.optim.AdamW(params, lr=spec.learning_rate, foreach=True)
    if spec.optim == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate, foreach=True)
    bits = 8 if "8bit" in spec.optim else 32
    return BnbOptimizerStandIn(params, bits=bits, paged=spec.optim.startswith("paged"), lr=spec.learning_rate)


@contextlib.contextmanager
def _unpacked_rows() -> Iterator[None]:
    """transformers looks for packed sequences in the position ids and, when it cannot read the values (a fake
    tensor counts as tracing), builds a 4-D mask that a real run never has; every traced row is one sequence."""
    import importlib

    masking: Any = importlib.import_module("transformers.masking_utils")
    saved = getattr(masking, "find_packed_sequence_indices", None)
    if saved is None:
        yield
        return
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = saved


@contextlib.contextmanager
def _trl_cuda_logprob() -> Iterator[None]:
    """TRL's chunked log-prob kernel as CUDA runs it: Triton folds each tile in place and cuBLAS accumulates
    the gradient into fp32 in place, so the torch fallback's tile copies are replaced by nothing."""
    import importlib

    ck: Any = importlib.import_module("trl.kernels.chunked_logprob")
    tu: Any = importlib.import_module("trl.trainer.utils")

    saved = ck._use_triton, ck._forward_tile, ck._backward_tile, ck._addmm_fp32, tu._use_triton

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    ck._use_triton = tu._use_triton = lambda device: False
    ck._forward_tile = ck._backward_tile = ck._addmm_fp32 = nothing
    try:
        yield
    finally:
        ck._use_triton, ck._forward_tile, ck._backward_tile, ck._addmm_fp32, tu._use_triton = saved


# ---------------------------------------------------------------------------------------------------------------
# The step


def _label(counter: LiveBytes, model: Any, standins: list[Any]) -> None:
    """Put what exists after preparation into its category (it was counted when it was created)."""
    quant_ids: set[int] = set()
    for s in standins:
        for i, t in enumerate(s.quant_tensors()):
            counter.track(t, "quantized_weights" if i == 0 else "quantization_constants")
            quant_ids.add(id(t))
    for p in model.parameters():
        if id(p) in quant_ids:
            continue
        counter.track(p, "lora_weights" if p.requires_grad else "unquantized_params")
    for b in model.buffers():
        if id(b) not in quant_ids:
            counter.track(b, "buffers")


def run_steps(model: Any, spec: QLoraSpec, batch: int, seq: int, vocab: int, device: Any,
              optimizer: torch.optim.Optimizer, *, steps: int = STEPS, counter: LiveBytes | None = None,
              before_last_step: Any = None, autocast: Callable[[], AbstractContextManager[Any]] | None = None,
              progress: Progress | None = None) -> None:
    """The framework's training steps on random full rows: forward, backward, (clip,) optimizer step.

    ``counter`` (a trace) gets the phases and categories; ``before_last_step`` is called when the steady-state
    step starts (a real run resets torch's peak there); ``autocast`` makes the context the ``hf`` forward runs
    in (the HF Trainer's ``bf16=True``); ``progress`` hears each phase as it starts. The same code drives the
    trace and the real GPU step of ``bench/trace_vs_real.py``.
    """
    fw = framework_for(spec)
    params = [p for p in model.parameters() if p.requires_grad]
    hooks: list[Any] = []
    if counter is not None:
        c = counter
        hooks = [p.register_post_accumulate_grad_hook(lambda p: c.track(p.grad, "lora_gradients")) for p in params]
        lm_head = model.get_output_embeddings()
        hooks.append(lm_head.register_forward_pre_hook(lambda m, a: setattr(c, "category", "logits_and_loss")))
        hooks.append(nn.modules.module.register_module_forward_pre_hook(lambda m, a: c.enter_forward()))
        hooks.append(nn.modules.module.register_module_forward_hook(lambda m, a, o: c.exit_forward(),
                                                                   always_call=True))

    now = [""]  # the step and phase, for the progress line

    def phase(name: str, category: str) -> Any:
        if progress is not None and name != "inputs":
            now[0] = f"step {step + 1}/{steps}: {name}"
            progress(now[0])
        return counter.phase(name, category) if counter is not None else contextlib.nullcontext()

    if progress is not None:
        hooks += _layer_progress(model, progress, lambda: now[0])
    held: Any = None  # the loop's output, alive until the next forward returns
    try:
        for step in range(steps):
            if step == steps - 1:
                gc.collect()
                if counter is not None:
                    counter.reset_peak()
                if before_last_step is not None:
                    before_last_step()
            with phase("inputs", "activations"):
                ids = torch.randint(0, vocab, (batch, seq), device=device)
                labels = ids.clone() if fw.build.trainer else ids  # the Trainer's collator copies the ids
            with phase("forward", "activations"):
                if fw.logits == "chunked":  # TRL's fused LM head
                    out = model(input_ids=ids, labels=labels, fused_lm_head=True, use_cache=False)
                    loss = -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)
                    # compute_loss's metrics: entropy and token accuracy over the valid positions
                    metrics = (out.entropy.detach().sum(), out.is_top1.sum(), out.label_mask.sum())
                    del out, metrics
                elif fw.logits == "kept":  # the loop holds `out` until the next forward returns
                    held = model(input_ids=ids, labels=labels)
                    loss = held.loss
                elif autocast is not None:  # hf: accelerate's autocast, then its fp32 copies of the outputs
                    with autocast():
                        out = model(input_ids=ids, labels=labels)
                    loss = outputs_to_fp32(out).loss
                    del out  # the Trainer drops the output before backward
                else:  # hf without autocast and loop-loss
                    loss = model(input_ids=ids, labels=labels).loss
            with phase("backward", "temporaries"):
                loss.backward()
                del loss
            with phase("optimizer step", "optimizer_states"):
                if fw.build.trainer:  # the Trainer clips at max_grad_norm=1.0
                    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            del ids, labels
        del held
    finally:
        for h in hooks:
            h.remove()


def _layer_progress(model: nn.Module, progress: Progress, where: Callable[[], str]) -> list[Any]:
    """Hooks that tell ``progress`` which decoder layer (the longest ``ModuleList``) runs, the slow part of a
    trace of a deep model: ``where()`` names the step and phase (a checkpoint's recompute shows in backward)."""
    layers = max((m for m in model.modules() if isinstance(m, nn.ModuleList)), key=len, default=None)
    if layers is None or len(layers) < 2:
        return []
    count = len(layers)

    def tell(i: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            progress(f"{where()}, layer {i + 1}/{count}")
        return hook

    return [layer.register_forward_pre_hook(tell(i)) for i, layer in enumerate(layers)]


def trace_step(config: Mapping[str, Any], batch_size: int, seq_len: int, spec: QLoraSpec, *, fake: bool = True,
               steps: int = STEPS, cuda_sdpa: bool = True, progress: Progress | None = None) -> TraceResult:
    """Build, prepare and step the model; count live bytes (fake tensors by default, real CPU ones with
    ``fake=False``, which is how the tests check the fake trace against a real step); ``progress`` hears what
    it is doing (building, preparing, each step's phases)."""
    require_trace_libraries(spec.bits)
    if spec.bits == 8:
        raise TraceError("8-bit (LLM.int8) bases are not traced yet; plan without --trace models them")
    vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0)
    if vocab <= 0:
        raise TraceError("the config has no vocab_size; plan --trace needs it to make token ids")
    start = time.perf_counter()
    with _quiet():
        return _trace_step(config, batch_size, seq_len, spec, fake, steps, cuda_sdpa, vocab, start,
                           progress or (lambda what: None))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The libraries' deprecation warnings and bitsandbytes' import notices are not the user's business here."""
    import logging
    import warnings

    loggers = [logging.getLogger(n) for n in ("bitsandbytes", "transformers", "peft", "trl")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def _autocast_for(spec: QLoraSpec) -> Callable[[], AbstractContextManager[Any]] | None:
    """The HF Trainer's ``bf16=True`` (``fp16=True`` for an fp16 compute dtype): CUDA's autocast on the
    trace's CPU tensors. TRL's step is traced without it (its bf16 model and adapters leave autocast nothing
    to cast but its Triton kernels' inputs, which the trace stands in for); the loops run none."""
    if not framework_for(spec).build.trace_autocast:
        return None
    half = torch.float16 if spec.compute_dtype == "fp16" else torch.bfloat16
    return lambda: cuda_autocast(half)


def _trace_step(config: Mapping[str, Any], batch_size: int, seq_len: int, spec: QLoraSpec, fake: bool, steps: int,
                cuda_sdpa: bool, vocab: int, start: float, progress: Progress) -> TraceResult:
    from torch._subclasses.fake_tensor import FakeTensorMode

    progress("building the model on the meta device")
    model, attn, attn_note = _build_on_meta(config, spec)
    standins: list[Any] = []
    if spec.bits == 4:
        standins = quantize_linears(model, _dtype(spec.compute_dtype), spec.quant_type, spec.double_quant,
                                    skip=[model.get_output_embeddings()])
        model.is_loaded_in_4bit = True
        model.quantization_method = "bitsandbytes"
    device = "cpu"
    counter = LiveBytes()
    fake_mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with fake_mode, counter, cuda_kernels(sdpa=cuda_sdpa):
        _materialize(model, device)
        for s in standins:
            s.finish()
        progress(f"preparing it as {spec.framework} does (peft LoRA)")
        with counter.phase("setup", "other"):
            model = prepare_model(model, spec)
        gc.collect()
        _label(counter, model, standins)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        ctx = _trl_cuda_logprob() if framework_for(spec).logits == "chunked" else contextlib.nullcontext()
        opt = _optimizer([p for p in model.parameters() if p.requires_grad], spec)
        with ctx, _unpacked_rows():
            run_steps(model, spec, batch_size, seq_len, vocab, device, opt, steps=steps, counter=counter,
                      autocast=_autocast_for(spec), progress=progress)
        kernels = dict(KERNELS_USED)
    paged = opt.paged_bytes if isinstance(opt, BnbOptimizerStandIn) else 0
    seconds = time.perf_counter() - start
    phases = {k: v for k, v in counter.phase_peaks.items() if k != "setup"}
    return TraceResult(peak_bytes=counter.peak, peak_phase=counter.peak_phase, breakdown=dict(counter.peak_breakdown),
                       phases=phases, paged_bytes=paged, trainable_params=trainable, seconds=seconds,
                       sdpa_kernels=kernels, attn=attn, attn_note=attn_note)


def trace_plan(model: ModelRef, batch_size: int, seq_len: int, spec: QLoraSpec | None = None, *,
               gpu_memory: int | str | None = None, gpu: str | None = None,
               hardware: Hardware | None = None, progress: Progress | None = None) -> TracePlan:
    """Trace one QLoRA/LoRA step of ``model`` and return its memory as a :class:`TracePlan`.

    Peak allocated is the traced peak plus the cuBLAS workspaces; reserved and process memory add the
    analytic planner's fragmentation and CUDA context for the same shapes. The plan's ``spec`` names the
    attention that was traced (the architecture's own where transformers refuses the recipe's; see the notes).

    Raises:
        PlanInputError: bad model, sizes or recipe (as :func:`~vramscope.planner.plan`).
        TraceError: a library is missing or the step cannot be traced.
    """
    spec = spec or QLoraSpec()
    validate_spec(spec)
    if not framework_for(spec).build.traced:  # an unknown framework is refused there, naming the known ones
        # qlora.py's bf16 casts and Unsloth's offloaded checkpoints are not reproduced on fake tensors
        raise PlanInputError(f"--trace runs {', '.join(traced_frameworks())} steps, not {spec.framework}'s: plan it "
                             "without --trace (the analytic plan models it)")
    for what, value in (("batch size", batch_size), ("sequence length", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PlanInputError(f"{what} must be a positive whole number, got {value!r}")
    name, shape = resolve_model(model)
    config: Mapping[str, Any] = get_config(name) if isinstance(model, str) else model  # type: ignore[assignment]
    if not isinstance(config, Mapping):
        raise PlanInputError("plan --trace needs a registry name or a config.json, not a ModelShape")
    cap, hw = capacity_of(gpu_memory, gpu)
    hw = hardware or hw
    result = trace_step(config, batch_size, seq_len, spec, progress=progress)
    spec = dataclasses.replace(spec, attn=result.attn)
    analytic = estimate(shape, spec, batch_size, seq_len, hw)
    workspaces = hw.cublas_workspace_bytes * hw.cublas_handles
    peak_alloc = result.peak_bytes + workspaces
    overhead = analytic.breakdown.allocator_overhead
    reserved = peak_alloc + overhead
    paged_counted = result.paged_bytes if hw.paged_in_process else 0
    context = analytic.breakdown.cuda_context  # the analytic planner's, for this framework and hardware
    process = reserved + context + paged_counted
    order = {name: i for i, name in enumerate(CATEGORY_ORDER)}
    breakdown = dict(sorted(result.breakdown.items(), key=lambda kv: order.get(kv[0], len(order))))
    breakdown.update(cublas_workspaces=workspaces, optimizer_states_paged=result.paged_bytes,
                     allocator_overhead=overhead, cuda_context=context)
    modelled = ["cuBLAS workspaces (2 handles x the GPU's workspace)",
                "allocator overhead (reserved - allocated): the analytic planner's fragmentation fit",
                "CUDA context and kernels (the analytic planner's constant)"]
    if result.sdpa_kernels.get("math"):
        modelled.append("the math SDPA kernel's extra scores-sized tensor in backward (seen on the H200, "
                        "MATH_EXTRA_SCORES)")
    if result.paged_bytes:
        modelled.append("paged optimizer states: bitsandbytes' allocation rule, in unified memory")
    traced = ["model build (transformers, meta device)", "framework preparation and peft LoRA",
              f"{STEPS} steps: forward, backward, optimizer (steady state = the last step)"]
    if result.sdpa_kernels:
        traced.append("SDPA kernels as CUDA picks them: " + ", ".join(f"{k} x{v}" for k, v in
                                                                    sorted(result.sdpa_kernels.items())))
    if _autocast_for(spec) is not None:
        traced.append(f"the HF Trainer's {spec.compute_dtype if spec.compute_dtype != 'fp32' else 'bf16'} "
                      "autocast (CUDA's policy) and accelerate's fp32 outputs")
    if spec.bits == 4:
        traced.append("4-bit linears as stand-ins holding bitsandbytes' bytes and dequantized transients")
    notes = ["fake CPU tensors with CUDA's kernel choices (SDPA backend, fused dropout), 512-byte blocks",
             "bitsandbytes' fused 4-bit GEMM (up to 1536 tokens, shape-dependent) needs no dequantized weight; "
             "the trace always allocates it, which errs high"]
    if result.attn_note:
        notes.insert(0, result.attn_note)
    fits = None
    if cap is not None:
        fits = process - paged_counted <= cap
    return TracePlan(
        model=name, batch_size=batch_size, seq_len=seq_len, spec=spec, peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=reserved, process_bytes=process, peak_phase=result.peak_phase, breakdown=breakdown,
        phases=result.phases, traced_peak_bytes=result.peak_bytes, optimizer_states_paged_bytes=result.paged_bytes,
        trainable_params=result.trainable_params, total_params=shape.total_params(), trace_seconds=result.seconds,
        traced=tuple(traced), modelled=tuple(modelled), gpu_memory_bytes=cap, fits=fits, notes=tuple(notes),
    )
