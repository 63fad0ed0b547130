"""The analytic memory model of one QLoRA/LoRA training step, component by component.

Every term is derived from what the libraries allocate (transformers 5, peft 0.21, bitsandbytes 0.50,
torch 2.x on CUDA); docs/planner.md walks through each one with its source. The shapes of the model
come from :mod:`vramscope.planner.shapes`, the recipe from :class:`~vramscope.recipe.QLoraSpec`, and what the
training program changes (dtypes, autocast, the logits, what its output keeps alive) from
:mod:`vramscope.planner.frameworks`; one decoder layer's replay is :mod:`vramscope.planner.layer`.

A training step is followed through five phases; the peak is the largest of them:

``forward``
    end of the forward pass: logits and the log-softmax of the cross-entropy are alive.
``loss backward``
    the cross-entropy's backward: log-probabilities, their gradient and the logits' gradient.
``layer backward (last)`` / ``layer backward (first)``
    backward through a decoder layer (recomputed when gradient checkpointing is on), first and last
    layer processed; LoRA gradients pile up while checkpoints are released.
``optimizer step``
    all LoRA gradients plus the optimizer's temporaries.

Nothing here imports torch: the model is pure arithmetic over config.json fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import (
    OFFLOAD_MIN_SEQ,
    TOKEN_TILE,
    VOCAB_TILE,
    Framework,
    Precision,
    framework_for,
    precision,
)
from vramscope.planner.layer import (
    backward_temporaries,
    forward_temporaries,
    has_mask,
    layer_activation_bytes,
    lora_modules,
    lora_tensors,
    lora_weight_copies,
    merged_expert_pool,
    recompute_tail_temporaries,
)
from vramscope.planner.layer import uses_math_attention as _uses_math_attention
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec
from vramscope.units import MIB

__all__ = ["Breakdown", "Estimate", "Hardware", "estimate", "expert_upcast_holes", "has_mask",
           "layer_activation_bytes", "loading_transient_bytes", "lora_modules", "lora_tensors",
           "upcast_transient_bytes", "uses_math_attention", "validate_spec"]


# The caching allocator hands out blocks in multiples of 512 bytes.
ALIGN = 512
# bitsandbytes NF4/FP4: one absmax per 64 weights; double quantization stores it as uint8 with one fp32
# absmax (and a shared code book) per 256 of them.
NF4_BLOCK = 64
DQ_BLOCK = 256
# bitsandbytes optimizers: state tensors of fewer elements than this are not paged (get_state_buffer),
# and 8-bit states fall back to fp32 below min_8bit_size; blockwise 8-bit states keep one fp32 absmax per 256.
PAGED_MIN_NUMEL = 100_000
MIN_8BIT_SIZE = 4096
OPTIM_8BIT_BLOCK = 256
OPTIMIZERS = ("paged_adamw_32bit", "paged_adamw_8bit", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "sgd")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
# model types whose attention module's name sorts before "mlp" in a checkpoint (gpt_neox "attention", falcon
# "self_attention"); the others' "self_attn" sorts after it
_ATTENTION_SORTS_FIRST = {"gpt_neox", "falcon"}
PHASES = ("forward", "loss backward", "layer backward (last)", "layer backward (first)", "optimizer step")


@dataclass(frozen=True)
class Hardware:
    """What the device adds outside the model's own tensors.

    Attributes:
        cublas_workspace_bytes: torch's cuBLAS workspace per (handle, stream); allocated through the caching
            allocator, so it counts in ``max_memory_allocated``. 32 MiB on Hopper (CUBLAS_WORKSPACE_CONFIG
            default ``:4096:8``), 8 MiB + 128 KiB on older GPUs.
        cublas_handles: the forward runs on the Python thread, the backward on autograd's device thread, and
            each thread gets its own cuBLAS handle and workspace.
        cuda_context_bytes: CUDA context, kernels of torch and bitsandbytes, cuBLAS handles: memory the process
            holds on the GPU that torch's allocator never sees. None: the framework's H200 figure
            (:class:`~vramscope.planner.frameworks.Framework`; 742-758 MiB with torch 2.11, CUDA 13).
        fragmentation: reserved-but-unallocated bytes at the peak per byte of (one layer's saved activations,
            materialised logits), with and without checkpointing: the caching allocator splits the blocks the
            step frees for differently sized requests and opens new segments for the next large one. None: the
            framework's constants, fitted to its H200 measurements (see docs/planner.md); with
            ``cuda_context_bytes`` and MATH_EXTRA_SCORES the only fitted constants of the model.
        paged_in_process: whether NVML's per-process figure includes bitsandbytes' paged (unified memory)
            optimizer states. It does not on the H200: process minus reserved is the same with paged and
            unpaged optimizers.
        gqa_sdpa_math: whether SDPA runs grouped-query attention on fp32 inputs with its math kernel (torch 2.11:
            transformers passes ``enable_gqa=True`` when there is no mask, flash and cuDNN refuse fp32 and the
            mem-efficient kernel refuses GQA), which materialises the B x H x S x S scores.
        dynamic_scale, dynamic_offset_bytes, static_offset_bytes: a calibration (``vramscope plan --calibrate``):
            peak allocated = static + static offset + scale x (the model's step memory) + offset. Identity
            by default.
    """

    cublas_workspace_bytes: int = 32 * MIB
    cublas_handles: int = 2
    cuda_context_bytes: int | None = None
    fragmentation: tuple[float, float, float, float] | None = None
    paged_in_process: bool = False
    gqa_sdpa_math: bool = True
    dynamic_scale: float = 1.0
    dynamic_offset_bytes: int = 0
    static_offset_bytes: int = 0


@dataclass(frozen=True)
class Breakdown:
    """Bytes per component at the moment of the peak (``optimizer_states_paged`` and the last three are not
    part of peak allocated)."""

    quantized_weights: int = 0
    quantization_constants: int = 0
    unquantized_params: int = 0
    lora_weights: int = 0
    lora_gradients: int = 0
    optimizer_states: int = 0
    optimizer_states_paged: int = 0
    activations: int = 0
    logits_and_loss: int = 0
    temporaries: int = 0
    cublas_workspaces: int = 0
    kept_output: int = 0
    kv_cache: int = 0  # generation (GRPO): every layer's keys and values (planner/phases.py)
    eval_predictions: int = 0  # evaluation: logits (or argmax ids) and labels gathered on the GPU
    calibration: int = 0
    allocator_overhead: int = 0
    cuda_context: int = 0

    # Components that make up torch's peak allocated. ``calibration`` is what a --calibrate fit adds to (or
    # takes from) the analytic figure; 0 without calibration.
    ALLOCATED = ("quantized_weights", "quantization_constants", "unquantized_params", "lora_weights",
                 "lora_gradients", "optimizer_states", "activations", "logits_and_loss", "temporaries",
                 "cublas_workspaces", "kept_output", "kv_cache", "eval_predictions", "calibration")

    def allocated(self) -> int:
        return sum(getattr(self, name) for name in self.ALLOCATED)

    def to_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class Estimate:
    """The model's answer for one shape: totals, the breakdown at the peak and every phase's allocated bytes."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    peak_phase: str
    breakdown: Breakdown
    phases: dict[str, int] = field(default_factory=dict)
    trainable_params: int = 0
    per_layer_activation_bytes: int = 0
    paged_in_process_bytes: int = 0
    # Every phase's breakdown (the peak's is ``breakdown``): the distributed planner re-shards each phase's parts.
    phase_breakdowns: dict[str, Breakdown] = field(default_factory=dict)
    framework: str = "hf"
    kv_cache_bytes: int = 0
    logits_bytes: int = 0
    host_offload_bytes: int = 0  # pinned host memory holding offloaded checkpoints (Unsloth)

    @property
    def device_bytes(self) -> int:
        """What must fit on the GPU: process memory less any paged states in it, which unified memory can evict."""
        return self.process_bytes - self.paged_in_process_bytes


def _align(n: float) -> int:
    return int(math.ceil(n / ALIGN) * ALIGN) if n > 0 else 0


def validate_spec(spec: QLoraSpec) -> None:
    """Check a recipe's values; raises :class:`PlanInputError` with what to change."""
    if spec.bits not in (4, 8, 16):
        raise PlanInputError(f"bits must be 4, 8 or 16, got {spec.bits}")
    if spec.compute_dtype not in ("bf16", "fp16", "fp32"):
        raise PlanInputError(f"compute dtype must be bf16, fp16 or fp32, got {spec.compute_dtype!r}")
    if spec.attn not in ATTENTION:
        raise PlanInputError(f"attention must be one of {', '.join(ATTENTION)}, got {spec.attn!r}")
    if spec.optim not in OPTIMIZERS:
        raise PlanInputError(f"unknown optimizer {spec.optim!r}; choose one of {', '.join(OPTIMIZERS)}")
    if isinstance(spec.lora_r, bool) or not isinstance(spec.lora_r, int) or spec.lora_r <= 0:
        raise PlanInputError(f"LoRA rank must be a positive whole number, got {spec.lora_r!r}")
    if not 0.0 <= spec.lora_dropout < 1.0:
        raise PlanInputError(f"LoRA dropout must be in [0, 1), got {spec.lora_dropout}")
    if spec.quant_type not in ("nf4", "fp4"):
        raise PlanInputError(f"4-bit quant type must be nf4 or fp4, got {spec.quant_type!r}")
    fw = framework_for(spec)
    if fw.compute_dtype_only is not None and spec.compute_dtype != fw.compute_dtype_only:
        raise PlanInputError(fw.other_dtype_refusal.format(name=fw.name, only=fw.compute_dtype_only,
                                                         dtype=spec.compute_dtype))


def _weights(shape: ModelShape, spec: QLoraSpec, pr: Precision) -> tuple[int, int, int]:
    """(packed weights, quantization constants, unquantized parameters) in bytes."""
    packed = consts = 0
    for lin in shape.linears:
        n = lin.params
        if spec.bits == 4:
            blocks = math.ceil(n / NF4_BLOCK)
            packed += _align(math.ceil(n / 2))
            if spec.double_quant:
                # uint8 absmax + fp32 second-level absmax + fp32 offset + the 16-entry NF4 code
                consts += _align(blocks) + _align(math.ceil(blocks / DQ_BLOCK) * 4) + _align(4) + _align(64)
            else:
                consts += _align(blocks * 4) + _align(64)
        elif spec.bits == 8:
            packed += _align(n)
            consts += _align(lin.out_features * 4)  # LLM.int8 keeps one fp32 scale per output row
        else:
            packed += _align(pr.params * n)  # plain LoRA: the base as loaded
    packed *= shape.layers
    consts *= shape.layers
    # prepare_model_for_kbit_training casts every bf16/fp16 parameter that is not 4-bit to fp32: embeddings,
    # norms, lm_head, biases, and (transformers 5) fused MoE experts. Plain LoRA (16-bit), and TRL, which does
    # not prepare, leave them as loaded.
    unquant = pr.params * (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params
                           + shape.expert_params)
    return packed, consts, unquant


def _optimizer(spec: QLoraSpec, tensors: list[int], param_bytes: int = 4) -> tuple[int, int, int]:
    """(states in torch's allocator, states in unified memory, temporaries of the step) in bytes.

    torch's AdamW keeps its states like the parameters (bf16 LoRA under TRL: bf16 states); bitsandbytes'
    32-bit optimizers keep fp32 states whatever the parameters' dtype.
    """
    torch_b = paged_b = temp = 0
    optim = spec.optim
    paged = optim.startswith("paged_")
    for n in tensors:
        if optim in ("adamw_torch", "adamw_torch_fused"):
            torch_b += 2 * _align(param_bytes * n)
        elif optim in ("paged_adamw_32bit",):
            if n >= PAGED_MIN_NUMEL:
                paged_b += 2 * 4 * n
            else:
                torch_b += 2 * _align(4 * n)
        elif optim in ("paged_adamw_8bit", "adamw_8bit"):
            if n < MIN_8BIT_SIZE:
                torch_b += 2 * _align(4 * n)
                continue
            # two uint8 states plus two fp32 absmax vectors (blockwise quantization)
            torch_b += 2 * _align(math.ceil(n / OPTIM_8BIT_BLOCK) * 4)
            if paged and n >= PAGED_MIN_NUMEL:
                paged_b += 2 * n
            else:
                torch_b += 2 * _align(n)
    if optim == "adamw_torch":
        # torch's foreach AdamW (the CUDA default) builds sqrt(exp_avg_sq) for all parameters at once.
        temp = sum(_align(param_bytes * n) for n in tensors)
    return torch_b, paged_b, temp



def uses_math_attention(shape: ModelShape, spec: QLoraSpec, seq: int, hw: Hardware | None = None, *,
                        framework: Framework | None = None) -> bool:
    """Whether this run's attention goes through SDPA's math kernel (O(S^2) memory); see :class:`Hardware`."""
    hw = hw or Hardware()
    return _uses_math_attention(shape, spec, seq, precision(spec, framework), hw.gqa_sdpa_math)


def layer_bytes(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, mask_bytes: int = 1,
                math_attn: bool = False, *, framework: Framework | None = None) -> int:
    """Bytes one decoder layer keeps for its backward under ``framework`` (default: the recipe's)."""
    return layer_activation_bytes(shape, spec, batch, seq, precision(spec, framework), mask_bytes, math_attn)


@dataclass(frozen=True)
class _Logits:
    """What the loss side of a step holds, by phase: the end of the forward, the loss backward, and what the
    caller keeps alive afterwards (through backward, the optimizer step and the next forward)."""

    forward: int
    backward: int
    kept: int
    materialised: int  # bytes of full logits the step makes (the allocator-overhead feature)


def _logits(shape: ModelShape, fw: Framework, pr: Precision, batch: int, seq: int) -> _Logits:
    T, V, h = batch * seq, shape.vocab, shape.hidden
    if fw.logits == "score":
        # A sequence-classification head (TRL's RewardTrainer: ``score`` = Linear(h, 1)): one number per
        # position in the compute dtype, the last real token's picked; backward hands the hidden states a
        # half gradient that is cast back to the stream. No vocabulary-sized tensor at all.
        return _Logits(forward=2 * T + 4 * batch, backward=(2 + pr.stream) * h * T, kept=0, materialised=0)
    if fw.logits == "chunked":
        # TRL's fused LM head: the hidden states of the labelled positions are gathered (a copy, kept for
        # backward) and projected tile by tile into one reused [4096, 32768] buffer in the compute dtype; only
        # per-token statistics come out (log-prob, entropy, top-1: ~40 bytes a token). Backward recomputes the
        # tiles into a second buffer and accumulates the hidden states' gradient in fp32, then casts it and
        # scatters it back through the gather and the shift (two more stream-dtype copies, erring high).
        # The buffer is [min(T, 4096), 32768] even for a smaller vocabulary (trl 1.16 allocates ``chunk_size``
        # columns and views the vocabulary's part; 2x low on an 8000-word model before, tests/test_planner_trl_tile.py).
        tile = 2 * min(T, TOKEN_TILE) * VOCAB_TILE
        fwd_tile = bwd_tile = tile
        if pr.params == 4:
            # an fp32 lm_head and stream: each tile's weight rows and hidden rows are cast to half; backward
            # rebinds ``w_chunk`` only after the next tile's cast exists, so with more than one tile two weight
            # casts are alive at once (Llama-3's and Qwen2.5's vocabularies; not Llama-2's 32000 at <= 4096 tokens)
            rows = 2 * min(V, VOCAB_TILE) * h
            tiles = math.ceil(V / VOCAB_TILE) * math.ceil(T / TOKEN_TILE)
            fwd_tile += rows + 2 * min(T, TOKEN_TILE) * h
            bwd_tile += (2 if tiles > 1 else 1) * rows + 2 * min(T, TOKEN_TILE) * h
        stats = 40 * T
        return _Logits(forward=pr.stream * h * T + fwd_tile + stats,
                       backward=(2 * pr.stream + 4) * h * T + bwd_tile + stats, kept=0, materialised=0)
    if fw.autocast:
        # Autocast runs lm_head in half: a half copy of an fp32 lm_head weight is kept for its backward; the
        # loss upcasts the half logits (.float()) and keeps the log-softmax; accelerate's convert_outputs_to_fp32
        # then makes fp32 logits of the output once more: 2 + 4 + 4 bytes per logit at the end of the forward.
        weight = 2 * V * h if pr.params == 4 else 0
        logits_b = 2
        fwd = 10 * T * V + weight
    else:
        weight = 0
        logits_b = pr.params  # lm_head's dtype; the loss upcasts half logits to fp32 (a copy)
        fwd = (8 if logits_b == 4 else 10) * T * V
    # Backward: the log-softmax it saved, its gradient and the logits' gradient (fp32).
    bwd = 12 * T * V + weight
    # Gemma-2's final soft-cap (transformers' Gemma2ForCausalLM.forward: ``tanh(logits / cap) * cap``): tanh
    # saves its output for backward, so the logits exist twice, the capped ones the loss reads and tanh's, in
    # lm_head's output dtype, from the end of the forward until tanh's backward. (TRL's fused head caps inside
    # its kernel: nothing there.)
    softcap = logits_b * T * V if shape.logit_softcap else 0
    kept = (4 if logits_b == 4 or fw.autocast else logits_b) * T * V if fw.logits == "kept" else 0
    return _Logits(forward=fwd + softcap, backward=bwd + softcap, kept=kept, materialised=4 * T * V)


def estimate(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware | None = None, *,
             mask_bytes: int = 1, framework: Framework | None = None) -> Estimate:
    """Predict one training step's peak memory (steady state: optimizer states exist from the first step on).

    ``framework`` overrides the one the recipe names (the accuracy bench scores vramscope's own measurement
    step with :data:`~vramscope.planner.frameworks.HARNESS`). ``mask_bytes`` is the size of one dropout-mask
    element: 1 on CUDA (bool); the CPU's dropout keeps its mask in the input's dtype, which tests that replay
    the step on a CPU set to 4.
    """
    validate_spec(spec)
    if batch <= 0 or seq <= 0:
        raise PlanInputError(f"batch size and sequence length must be positive, got {batch} and {seq}")
    hw = hw or Hardware()
    fw = framework or framework_for(spec)
    pr = precision(spec, fw)
    T = batch * seq
    sd = pr.stream
    h, L = shape.hidden, shape.layers

    packed, consts, unquant = _weights(shape, spec, pr)
    tensors = lora_tensors(shape, spec)
    lora_params = sum(tensors)
    # peft keeps adapters in fp32 (autocast_adapter_dtype); TRL casts them to bf16 on quantized models.
    lora_b = sum(_align(pr.lora_param * n) for n in tensors)
    opt_torch, opt_paged, opt_temp = _optimizer(spec, tensors, pr.lora_param)
    workspaces = hw.cublas_workspace_bytes * hw.cublas_handles
    tokens = 4 * _align(8 * T)  # input ids, labels, padded and shifted labels (int64)

    math_attn = _uses_math_attention(shape, spec, seq, pr, hw.gqa_sdpa_math)
    S = layer_activation_bytes(shape, spec, batch, seq, pr, mask_bytes, math_attn)
    fwd_tmp = forward_temporaries(shape, spec, batch, seq, pr)
    bwd_tmp = backward_temporaries(shape, spec, batch, seq, pr, mask_bytes, math_attn)
    if spec.gradient_checkpointing:
        # The recomputed layer's output stays referenced through its backward; the recompute's own tail
        # can be the higher point.
        tail = recompute_tail_temporaries(shape, spec, batch, seq, pr, mask_bytes)
        bwd_tmp = max(bwd_tmp + sd * h * batch * seq, tail)
    hid = sd * h * T  # one hidden state
    final_norm = (4 * h + 4) * T  # the final norm keeps its fp32 input (or an fp32 copy of it) and rsqrt
    # One 4-D mask shared by all layers: float in the stream dtype for eager, bool for SDPA.
    eager_mask = (sd if spec.attn == "eager" else 1) * batch * seq * seq if has_mask(shape, spec, seq) else 0
    copies = L * lora_weight_copies(shape, spec, pr)
    offloaded = spec.gradient_checkpointing and fw.offloads_checkpoints and seq >= OFFLOAD_MIN_SEQ
    host_offload = L * hid if offloaded else 0
    if offloaded:
        # Unsloth: every checkpoint goes to pinned host memory; the GPU holds the one being copied out (forward)
        # or back in (backward) and the next one in flight.
        stash = min(L, 2) * hid
        forward_extra = copies
    elif spec.gradient_checkpointing:
        stash = L * hid  # checkpointing (either kind) keeps each layer's input
        # autocast's cache holds every layer's half LoRA weights until the forward returns
        forward_extra = copies
    else:
        stash = L * S  # (these include the half LoRA weight copies, saved for backward)
        forward_extra = 0
    stash += eager_mask
    lg = _logits(shape, fw, pr, batch, seq)
    # A loop that keeps ``out`` holds its logits and, with checkpointing off (use_cache stays on in train
    # mode), the DynamicCache of every layer's k (after rotary) and v until the next forward returns, so that
    # forward runs beside the previous step's output. The cache's first update stores the very k and v the
    # layer made (the H200 loop points are over by one cache if it copied them): where attention saves them
    # anyway the cache costs nothing until their layer's backward has run; the math kernel and a repeat_kv
    # mask save repeated copies, so the originals are extra from the start.
    kv_cache = 2 * shape.kv_dim * T * sd * L if fw.keeps_kv_cache and not spec.gradient_checkpointing else 0
    repeated = math_attn or (has_mask(shape, spec, seq) and shape.kv_heads < shape.heads)
    kv_extra = kv_cache if repeated or spec.attn == "flash_attention_2" else 0
    kept_before = lg.kept + kv_extra  # until the layers' backward frees what attention saved
    kept = lg.kept + kv_cache
    g_layer = sum(_align(pr.lora_param * n) for n in tensors) // max(L, 1)  # LoRA gradients of one layer

    phases: dict[str, tuple[int, Breakdown]] = {}
    base = Breakdown(quantized_weights=packed, quantization_constants=consts, unquantized_params=unquant,
                     lora_weights=lora_b, optimizer_states=opt_torch, optimizer_states_paged=opt_paged,
                     activations=tokens, cublas_workspaces=workspaces)

    def add(name: str, **parts: int) -> None:
        bd = Breakdown(**{**base.to_dict(), **{k: base.to_dict()[k] + v for k, v in parts.items()}})
        phases[name] = (bd.allocated(), bd)

    # End of the forward: every kept activation, the final norm's output (held by the model output) and the
    # logits with their log-softmax (and, for a loop, the previous step's output). A layer's own forward
    # temporaries are smaller than the logits in every registry model; they matter only when the logits are
    # tiny, so take the larger of the two.
    fwd_act = stash + final_norm + hid + forward_extra + kv_extra  # the new output's cache
    if lg.forward >= fwd_tmp:
        add("forward", activations=fwd_act, logits_and_loss=lg.forward, kept_output=kept)
    else:
        add("forward", activations=fwd_act, temporaries=fwd_tmp, kept_output=kept)
    add("loss backward", activations=stash + final_norm, logits_and_loss=lg.backward, kept_output=kept_before)
    grads_all = g_layer * L
    if spec.gradient_checkpointing:
        # Last layer processed first: every checkpoint still alive, plus that layer recomputed.
        # With an fp32 stream the checkpointed input is the very tensor the recomputed first norm keeps.
        dup = hid if sd == 4 else 0
        add("layer backward (last)", activations=stash + S - dup, temporaries=bwd_tmp, kept_output=kept_before)
        add("layer backward (first)", activations=hid - dup + eager_mask + S, temporaries=bwd_tmp,
            lora_gradients=grads_all - g_layer, kept_output=kept)
    else:
        add("layer backward (last)", activations=stash, temporaries=bwd_tmp, kept_output=kept_before)
        add("layer backward (first)", activations=S + eager_mask, temporaries=bwd_tmp,
            lora_gradients=grads_all - g_layer, kept_output=kept)
    add("optimizer step", lora_gradients=grads_all, temporaries=opt_temp, kept_output=kept)

    peak_phase = max(phases, key=lambda k: phases[k][0])
    peak_alloc, bd = phases[peak_phase]
    static = base.allocated()
    adjust = (hw.static_offset_bytes + round((hw.dynamic_scale - 1.0) * (peak_alloc - static))
              + hw.dynamic_offset_bytes)
    if adjust:
        peak_alloc += adjust
        bd = Breakdown(**{**bd.to_dict(), "calibration": adjust})
    frag = hw.fragmentation if hw.fragmentation is not None else fw.fragmentation
    f_layer, f_logits = frag[:2] if spec.gradient_checkpointing else frag[2:]
    # The fitted factors scale the activations' blocks; merged expert stacks are exact-fit blocks (their own term).
    merged_saved, merged_free = merged_expert_pool(shape, spec, pr)
    fragments = f_layer * (S - merged_saved) + f_logits * lg.materialised
    # the fits ran on dense models, whose loading segment keeps only the embedding's and lm_head's region free;
    # the holes an expert upcast leaves beside it take the activations' fragments before the pool grows
    fragments = max(0.0, fragments - expert_upcast_holes(shape, spec, fw))
    overhead = _align(fragments + merged_free)
    reserved = peak_alloc + overhead
    paged_counted = opt_paged if hw.paged_in_process else 0
    context = hw.cuda_context_bytes if hw.cuda_context_bytes is not None else fw.cuda_context_bytes
    process = reserved + context + paged_counted
    bd = Breakdown(**{**bd.to_dict(), "allocator_overhead": overhead, "cuda_context": context})
    return Estimate(
        peak_allocated_bytes=peak_alloc, peak_reserved_bytes=reserved, process_bytes=process, peak_phase=peak_phase,
        breakdown=bd, phases={k: v[0] for k, v in phases.items()}, trainable_params=lora_params,
        per_layer_activation_bytes=S, paged_in_process_bytes=paged_counted,
        phase_breakdowns={k: v[1] for k, v in phases.items()}, framework=fw.name,
        kv_cache_bytes=kv_cache, logits_bytes=lg.materialised, host_offload_bytes=host_offload,
    )



def loading_transient_bytes(shape: ModelShape, spec: QLoraSpec) -> int:
    """The most transformers 5's loader holds above the weights it has loaded so far, at its worst moment.

    With on-the-fly quantization (4- and 8-bit) transformers 5.17 loads synchronously (``core_model_loading.py``,
    ``convert_and_load_state_dict_in_model``: no thread pool, "to avoid worker threads loading full-precision
    tensors to GPU faster than the main thread can quantize them"), one target at a time in ``dot_natural_key``
    order of the checkpoint's names: each target's sources are copied to the GPU in the load dtype, converted, set,
    and freed before the next. A fused expert stack built from a per-expert checkpoint (what ``save_pretrained``
    writes: transformers 5 reverts its fusion on save) holds twice its size at its peak (``MergeModulelist``'s
    ``torch.stack`` beside its sources, then ``Concatenate``'s ``torch.cat`` beside both stacks); a 4- or 8-bit
    linear holds its 16-bit source beside its quantized result. Every earlier target is already loaded, every later
    one not yet, so the worst moment is a large target late in the order: in the last layer, where the MLP's names
    sort before ``self_attn`` (``experts`` before the router ``gate``; Mixtral's ``w1`` makes gate_up's target
    before ``w2`` makes down's, Qwen-MoE's ``down_proj`` sorts first). Returns that moment's bytes above the loaded
    weights (0 for 16-bit bases, which load through the asynchronous pool: not modelled)."""
    if spec.bits not in (4, 8):
        return 0
    src = 4 if spec.compute_dtype == "fp32" else 2  # the load dtype (TRL's --dtype, the recipe's torch_dtype)

    def quantized(n: int, out: int) -> int:
        return math.ceil(n / 2) + 4 * math.ceil(n / NF4_BLOCK) if spec.bits == 4 else n + 4 * out

    # (bytes held above the final ones while converting, final bytes) in load order
    attention = [(src * lin.params, quantized(lin.params, lin.out_features)) for lin in
                 sorted((x for x in shape.linears if x.source in ("norm_attn", "attn_out")), key=lambda x: x.name)]
    dense = [(src * lin.params, quantized(lin.params, lin.out_features)) for lin in
             sorted((x for x in shape.linears if x.source not in ("norm_attn", "attn_out")), key=lambda x: x.name)]
    mlp: list[tuple[int, int]] = []
    if shape.experts:
        one = src * shape.experts * shape.hidden * shape.intermediate
        stacks = [(2 * one, 2 * one), (one, one)]  # gate_up (w1 before w2), down
        mlp += stacks if shape.model_type == "mixtral" else stacks[::-1]
        mlp.append((0, src * shape.experts * shape.hidden))  # the router
    mlp += dense  # a shared expert (Qwen2-MoE) sorts after the router; a dense MLP is the whole MLP
    items = attention + mlp if shape.model_type in _ATTENTION_SORTS_FIRST else mlp + attention
    worst = after = 0
    for extra, final in reversed(items):
        worst = max(worst, extra - after)
        after += final
    return worst


def expert_upcast_holes(shape: ModelShape, spec: QLoraSpec, fw: Framework) -> int:
    """Bytes the upcast of fused expert stacks leaves free inside transformers 5's loading segment.

    ``prepare_model_for_kbit_training`` casts each layer's ``gate_up_proj`` and then its ``down_proj`` to fp32
    (``upcast_transient_bytes``): each fp32 copy takes the smallest free hole that holds it, or a segment of its
    own, and its 16-bit original is freed in place. gate_up's copy is twice its hole; down's copy fits the hole
    gate_up left (Mixtral: exactly, 1792 MiB), and what down frees stays free: one ``down_proj`` per layer in a
    bf16 load (Mixtral-8x7B-2L: 1792 MiB by this count; the H200 had 1402 MiB free in the loading segment after a
    step). 0 without fused experts, without the upcast, or in an fp32 load."""
    if not (shape.experts and fw.prepares_kbit and spec.bits in (4, 8)) or spec.compute_dtype == "fp32":
        return 0
    half = 2  # the load dtype
    stack = shape.experts * shape.hidden * shape.intermediate  # one layer's down_proj, in elements
    holes: list[int] = []
    for _ in range(max(shape.layers, 1)):
        for elements in (2 * stack, stack):  # gate_up_proj, then down_proj
            copy = 4 * elements
            fits = [h for h in holes if h >= copy]
            if fits:
                holes.remove(min(fits))
                if min(fits) > copy:
                    holes.append(min(fits) - copy)
            holes.append(half * elements)
    return sum(holes)


def upcast_transient_bytes(shape: ModelShape) -> int:
    """The most peft's ``prepare_model_for_kbit_training`` holds above the fp32 weights it ends with.

    It casts every 16-bit parameter that is not a ``Params4bit`` to fp32 one at a time (``param.data =
    param.data.to(torch.float32)``, peft ``utils/other.py``), in ``model.parameters()`` order: while one is cast its
    bf16 original (2 bytes a weight) is still alive beside the new fp32 tensor, and every parameter after it is still
    bf16 (2 bytes short of its fp32 size). The worst moment is a large parameter late in the order: an untied
    ``lm_head``, which comes last (2 x vocab x hidden bytes over the fp32 weights); with tied embeddings the
    embedding, cast first while everything else is still bf16."""
    # model.parameters() order: the embedding, each layer (its fused experts: gate_up_proj then down_proj, two
    # parameters cast one after the other; router, norms, biases), the final norm, then an untied lm_head; only the
    # large ones matter
    layers = max(shape.layers, 1)
    small = (shape.norm_params - shape.hidden * (2 if shape.norm_bias else 1) + shape.router_params
             + shape.bias_params) // layers
    stack = shape.experts * shape.hidden * shape.intermediate if shape.experts else 0  # one layer's down_proj
    per_layer = [n for n in (2 * stack, stack, small) if n]
    order = [shape.embedding_params] + per_layer * shape.layers + [shape.hidden, shape.lm_head_params]
    worst = after = 0
    for n in reversed(order):
        worst = max(worst, 2 * n - 2 * after)
        after += n
    return worst
