"""The analytic memory model of one QLoRA/LoRA training step, component by component.

Every term is derived from what the libraries allocate (transformers 5, peft 0.21, bitsandbytes 0.50,
torch 2.x on CUDA); docs/planner.md walks through each one with its source. The shapes of the model
come from :mod:`vramscope.planner.shapes`, the recipe from :class:`~vramscope.integrations.qlora.QLoraSpec`.

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
from typing import Any

from vramscope.planner.errors import PlanInputError
from vramscope.planner.shapes import Linear, ModelShape
from vramscope.recipe import QLoraSpec

MIB = 1024**2

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
# mem-efficient SDPA pads its log-sum-exp to a multiple of 32 query positions, an additive mask's last dim to 16.
LSE_PAD = 32
MASK_PAD = 16
# Calibrated from the H200 measurements: at the softmax backward of SDPA's math kernel the GPU holds one more
# B x H x S x S fp32 tensor than a CPU replay of the same kernel (saved probabilities + their gradient + the
# softmax gradient). Seen identically in 9 points of 3 architectures, with and without checkpointing.
MATH_EXTRA_SCORES = 1

OPTIMIZERS = ("paged_adamw_32bit", "paged_adamw_8bit", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "sgd")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
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
            holds on the GPU that torch's allocator never sees. 745 MiB on the H200 (torch 2.11, CUDA 13): NVML's
            process figure minus peak reserved was 742-746 MiB in all 60 measured points.
        fragmentation: reserved-but-unallocated bytes at the peak per byte of (one layer's saved activations,
            logits), with and without checkpointing: the caching allocator splits the blocks the step frees
            for differently sized requests and opens new segments for the next large one. Fitted to the
            H200 measurements (see docs/planner.md); the only fitted constants of the model besides
            ``cuda_context_bytes`` and MATH_EXTRA_SCORES.
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
    cuda_context_bytes: int = 745 * MIB
    fragmentation: tuple[float, float, float, float] = (0.615, 0.269, 1.037, 0.026)
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
    calibration: int = 0
    allocator_overhead: int = 0
    cuda_context: int = 0

    # Components that make up torch's peak allocated. ``calibration`` is what a --calibrate fit adds to (or
    # takes from) the analytic figure; 0 without calibration.
    ALLOCATED = ("quantized_weights", "quantization_constants", "unquantized_params", "lora_weights",
                 "lora_gradients", "optimizer_states", "activations", "logits_and_loss", "temporaries",
                 "cublas_workspaces", "calibration")

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
    if spec.compute_dtype not in ("bf16", "fp16"):
        raise PlanInputError(f"compute dtype must be bf16 or fp16, got {spec.compute_dtype!r}")
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


def lora_modules(shape: ModelShape, spec: QLoraSpec) -> list[Linear]:
    """The per-layer linear modules LoRA wraps. ``None`` or ``all-linear`` means every linear but lm_head.

    Raises:
        PlanInputError: a target that matches no linear layer of this model.
    """
    targets = spec.lora_targets
    if not targets or tuple(targets) == ("all-linear",):
        return list(shape.linears)
    names = shape.linear_names()
    chosen: list[Linear] = []
    for target in targets:
        # peft matches a target by the module name's last component (or a suffix of the dotted name).
        leaf = target.strip().split(".")[-1]
        hits = [lin for lin in shape.linears if lin.name == leaf]
        if not hits:
            raise PlanInputError(
                f"LoRA target {target!r} matches no linear layer of this {shape.model_type} model; "
                f"its linear layers are {', '.join(names)} (or use all-linear)"
            )
        chosen += [h for h in hits if h not in chosen]
    return chosen


def lora_tensors(shape: ModelShape, spec: QLoraSpec) -> list[int]:
    """Element counts of every LoRA tensor (A is r x in, B is out x r), one entry per tensor."""
    out: list[int] = []
    for lin in lora_modules(shape, spec):
        out += [spec.lora_r * lin.in_features, lin.out_features * spec.lora_r]
    return out * shape.layers


def _weights(shape: ModelShape, spec: QLoraSpec) -> tuple[int, int, int]:
    """(packed weights, quantization constants, unquantized parameters) in bytes."""
    packed = consts = 0
    half = 2  # bf16 and fp16
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
            packed += _align(half * n)
    packed *= shape.layers
    consts *= shape.layers
    # prepare_model_for_kbit_training casts every bf16/fp16 parameter that is not 4-bit to fp32: embeddings,
    # norms, lm_head, biases, and (transformers 5) fused MoE experts. Plain LoRA (16-bit) leaves them as loaded.
    unq_bytes = 4 if spec.bits in (4, 8) else half
    unquant = unq_bytes * (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params
                           + shape.expert_params)
    return packed, consts, unquant


def _optimizer(spec: QLoraSpec, tensors: list[int]) -> tuple[int, int, int]:
    """(states in torch's allocator, states in unified memory, temporaries of the step) in bytes."""
    torch_b = paged_b = temp = 0
    optim = spec.optim
    paged = optim.startswith("paged_")
    for n in tensors:
        if optim in ("adamw_torch", "adamw_torch_fused"):
            torch_b += 2 * _align(4 * n)
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
        temp = sum(_align(4 * n) for n in tensors)
    return torch_b, paged_b, temp


def _stream_bytes(spec: QLoraSpec) -> int:
    """Bytes per element of the hidden states between layers.

    With 4/8-bit bases, prepare_model_for_kbit_training leaves the embedding in fp32, so the residual
    stream, the norms' outputs and every activation the layer keeps are fp32; bitsandbytes casts to the
    compute dtype only inside its matmul and casts the result back.
    """
    return 4 if spec.bits in (4, 8) else 2


def has_mask(shape: ModelShape, spec: QLoraSpec, seq: int) -> bool:
    """Whether transformers builds a 4-D attention mask instead of relying on ``is_causal``.

    Eager attention always does; SDPA does once the sequence reaches the sliding window
    (``_ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size``), e.g. Mistral at 4096 tokens.
    """
    if spec.attn == "eager":
        return True
    return spec.attn == "sdpa" and shape.sliding_window is not None and seq >= shape.sliding_window


def uses_math_attention(shape: ModelShape, spec: QLoraSpec, seq: int, hw: Hardware | None = None) -> bool:
    """Whether this run's attention goes through SDPA's math kernel (O(S^2) memory); see :class:`Hardware`.

    transformers asks SDPA for grouped-query attention (``enable_gqa``) only when there is no mask; with a
    mask it repeats K/V itself and the mem-efficient kernel takes the mask.
    """
    hw = hw or Hardware()
    return (spec.attn == "sdpa" and _stream_bytes(spec) == 4 and shape.kv_heads < shape.heads
            and hw.gqa_sdpa_math and not has_mask(shape, spec, seq))


def layer_activation_bytes(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, mask_bytes: int = 1,
                           math_attn: bool = False) -> int:
    """Bytes one decoder layer keeps for its backward (what a recomputed layer holds under checkpointing)."""
    T = batch * seq
    sd = _stream_bytes(spec)
    h, i, r = shape.hidden, shape.intermediate, spec.lora_r
    q, kv = shape.q_dim, shape.kv_dim
    total = 0
    # Norms keep their fp32 input (the residual itself when the stream is fp32; a .float() copy otherwise)
    # and one fp32 rsqrt (RMSNorm) or mean+rstd (LayerNorm) per row.
    per_row = 8 if shape.norm_bias else 4
    norm_in = 4 * h if not shape.norm_bias else sd * h
    total += shape.norms_per_layer * (norm_in + per_row) * T

    # LoRA: dropout keeps its output (fp32, the adapter dtype) and a bool mask; lora_B keeps lora_A's output.
    # Without dropout lora_A keeps its input, which the modules reading one tensor share when no cast is needed.
    shared: dict[str, int] = {}
    attn_out_fp32 = sd == 4 and spec.attn != "flash_attention_2"
    for lin in lora_modules(shape, spec):
        if spec.lora_dropout > 0:
            total += (4 + mask_bytes) * lin.in_features * T
        elif sd != 4 or (lin.source == "attn_out" and not attn_out_fp32):
            total += 4 * lin.in_features * T
        elif lin.source != "attn_out":  # the attention output is kept by SDPA already
            shared[lin.source] = lin.in_features
        total += 4 * r * T
    total += 4 * sum(shared.values()) * T

    # Attention. Fused q/k/v projections: v is a view of the fused output, which then stays alive whole.
    fused = any(lin.name in ("qkv_proj", "query_key_value") for lin in shape.linears)
    v_keep = (q + 2 * kv) if fused else kv
    if math_attn:
        # SDPA's math kernel: keeps the scaled query, the repeated and scaled keys, the repeated values and
        # the fp32 softmax probabilities (B x H x S x S).
        total += 3 * sd * q * T + 4 * batch * shape.heads * seq * seq
    elif spec.attn == "sdpa" and has_mask(shape, spec, seq):
        # A materialised mask: transformers repeats K/V per query head; the mem-efficient kernel keeps q, the
        # repeated k and v, its output, the log-sum-exp and the additive fp32 mask it made from the bool one.
        k_rep = q if shape.kv_heads < shape.heads else kv
        lse = 4 * batch * shape.heads * math.ceil(seq / LSE_PAD) * LSE_PAD
        bias = 4 * batch * seq * math.ceil(seq / MASK_PAD) * MASK_PAD
        total += sd * (2 * q + 2 * k_rep) * T + lse + bias
    elif spec.attn == "sdpa":
        # fp32 q/k/v rule out flash and cuDNN; mem-efficient SDPA (no repeat_kv) keeps q, k, v,
        # its output and a padded fp32 log-sum-exp. Its output is already [B, S, H*D], so no copy for o_proj.
        lse = 4 * batch * shape.heads * math.ceil(seq / LSE_PAD) * LSE_PAD
        total += sd * (q + kv + v_keep + q) * T + lse
    elif spec.attn == "flash_attention_2":
        lse = 4 * batch * shape.heads * seq
        cast = 2  # flash-attn runs in half precision; transformers casts fp32 q/k/v down and keeps the copies
        total += cast * (2 * q + 2 * kv) * T + lse
    else:  # eager: repeat_kv copies, fp32 softmax probabilities (plus the half copy when the stream is half)
        k_rep = q if shape.kv_heads < shape.heads else kv
        total += sd * (q + 2 * k_rep) * T
        total += (4 if sd == 4 else 6) * batch * shape.heads * seq * seq

    # MLP.
    if shape.experts:
        k = shape.experts_per_token
        # router logits and softmax (fp32) per token, then per routed token: gate/up output, activation, the
        # weighted expert output.
        total += 2 * 4 * shape.experts * T + k * (3 * sd * i + sd * h + 16) * T
    elif shape.gated_mlp:
        total += 3 * sd * i * T  # activation input, activation output, up projection
    else:
        total += sd * i * T  # GELU input
    return total


class _Live:
    """A running total of live bytes and its maximum: replays a backward pass event by event."""

    def __init__(self, start: int) -> None:
        self.now = start
        self.peak = start

    def alloc(self, n: float) -> None:
        self.now += int(n)
        self.peak = max(self.peak, self.now)

    def free(self, n: float) -> None:
        self.now -= int(n)


def _module_backward(live: _Live, lin: Linear, lora: bool, spec: QLoraSpec, T: int, first: bool,
                     mask_bytes: int = 1) -> None:
    """Replay the backward of one (LoRA-wrapped) frozen linear; its input gradient stays alive afterwards.

    autograd runs the LoRA branch first (its nodes were created after the base layer's), then the base:
    bitsandbytes' MatMul4Bit dequantizes the weight to bf16 again and computes the input gradient in bf16,
    which the surrounding casts bring back to the stream dtype. ``first`` says whether this module creates
    its input's gradient buffer (later modules reading the same input accumulate into it in place).
    """
    sd = _stream_bytes(spec)
    r, n_in, n_out = spec.lora_r, lin.in_features * T, lin.out_features * T
    if lora:
        live.alloc(4 * n_out)  # grad * scaling (fp32 adapter dtype)
        live.alloc(4 * r * T)  # grad of lora_A's output
        live.alloc(4 * r * lin.out_features)  # lora_B.weight.grad (kept until the optimizer step)
        live.free(4 * n_out)
        live.free(4 * r * T)  # lora_B's saved input
        live.alloc(4 * n_in)  # grad of the dropout output
        live.alloc(4 * r * lin.in_features)  # lora_A.weight.grad
        live.free(4 * r * T)
        if spec.lora_dropout > 0:
            live.free(4 * n_in)  # lora_A's saved input (the dropout output)
            live.alloc(4 * n_in)  # dropout backward: grad * mask
            live.free(4 * n_in)
            live.free(mask_bytes * n_in)
        if sd != 4:
            live.alloc(sd * n_in)
            live.free(4 * n_in)
            if spec.lora_dropout == 0:
                live.free(4 * n_in)  # the module's own fp32 copy of its input
        if not first:
            live.free(sd * n_in)  # accumulated into the existing buffer in place
        first = False
    if spec.bits in (4, 8):
        dequant = 2 * lin.params  # 4-bit: dequantized to bf16; 8-bit: int8 weights cast to the compute dtype
        live.alloc(2 * n_out)  # output gradient cast to the compute dtype
        live.alloc(dequant)
        live.alloc(2 * n_in)  # input gradient in the compute dtype
        live.free(dequant)
        live.free(2 * n_out)
        if sd != 2:
            live.alloc(sd * n_in)
            live.free(2 * n_in)
    else:
        live.alloc(sd * n_in)
    if not first:
        live.free(sd * n_in)


def _backward_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, mask_bytes: int = 1,
                          math_attn: bool = False) -> int:
    """The most a decoder layer's backward holds on top of the tensors it saved, found by replaying it.

    Starts with the layer's saved tensors and the incoming gradient, then walks the nodes in the order
    autograd runs them (MLP before attention, within each the last-created branch first), adding each
    gradient when it is produced and dropping saved tensors when their node has run.
    """
    T = batch * seq
    sd = _stream_bytes(spec)
    h, i = shape.hidden, shape.intermediate * (shape.experts_per_token if shape.experts else 1)
    q, kv = shape.q_dim, shape.kv_dim
    targets = {m.name for m in lora_modules(shape, spec)}
    lins = {lin.name: lin for lin in shape.linears}
    shared_input_free = spec.lora_dropout == 0 and sd == 4
    live = _Live(sd * h * T)  # the gradient arriving from the layer above

    def norm_backward() -> None:
        live.alloc(3 * 4 * h * T)  # grad * weight, grad * rsqrt, grad through pow
        live.free(3 * 4 * h * T)
        live.alloc(sd * h * T)  # gradient of the norm's input, added to the residual's gradient
        live.free(4 * h * T + 4 * T)  # the norm's saved input and rsqrt

    # MLP, last module first.
    if shape.experts or shape.gated_mlp:
        down = lins.get("down_proj") or Linear("down_proj", i, h)
        _module_backward(live, down, down.name in targets, spec, T, True, mask_bytes)
        if shared_input_free and down.name in targets:
            live.free(4 * i * T)  # the product was kept only for lora_A
        live.alloc(2 * sd * i * T)  # gradients of the activation output and of the up projection
        live.free(sd * i * T)  # the product's gradient
        live.free(2 * sd * i * T)  # the multiplication's saved operands
        ups = [lins[n] for n in ("up_proj", "gate_up_proj") if n in lins] or [Linear("up_proj", h, i)]
        _module_backward(live, ups[0], ups[0].name in targets, spec, T, True, mask_bytes)
        live.free(sd * i * T)  # up's gradient
        live.alloc(sd * i * T)  # activation backward
        live.free(sd * i * T)
        live.free(sd * i * T)  # the activation's saved input
        gate = lins.get("gate_proj")
        if gate is not None:
            _module_backward(live, gate, gate.name in targets, spec, T, False, mask_bytes)
        live.free(sd * i * T)
    else:
        down = lins.get("dense_4h_to_h") or Linear("down", i, h)
        _module_backward(live, down, down.name in targets, spec, T, True, mask_bytes)
        live.alloc(sd * i * T)  # GELU backward
        live.free(sd * i * T)
        live.free(sd * i * T)  # GELU's saved input
        up = lins.get("dense_h_to_4h") or Linear("up", h, i)
        _module_backward(live, up, up.name in targets, spec, T, True, mask_bytes)
        live.free(sd * i * T)
    if shared_input_free:
        live.free(4 * h * T)
    norm_backward()

    # Attention.
    o = next(lin for lin in shape.linears if lin.source == "attn_out")
    _module_backward(live, o, o.name in targets, spec, T, True, mask_bytes)
    if math_attn:
        scores = 4 * batch * shape.heads * seq * seq
        live.alloc(scores + sd * q * T)  # probs @ v backward: gradients of the probabilities and of v
        live.free(sd * q * T)  # the attention output's gradient
        live.free(sd * q * T)  # saved repeated v
        # Softmax backward. The H200 measurements hold one more scores-sized fp32 tensor here than a replay
        # of the math kernel on a CPU shows (2 beside the saved probabilities); MATH_EXTRA_SCORES carries it.
        live.alloc((1 + MATH_EXTRA_SCORES) * scores)
        live.free((1 + MATH_EXTRA_SCORES) * scores)  # gradient of the probabilities and the unexplained copy
        live.free(scores)  # saved probabilities
        live.alloc(2 * sd * q * T)  # q @ k^T backward
        live.free(scores)
        live.free(2 * sd * q * T)  # saved scaled q and repeated k
        live.alloc(sd * (q + 2 * kv) * T)  # scale and repeat backward: gradients of q, k, v
        live.free(3 * sd * q * T)
    else:
        live.alloc(sd * (q + 2 * kv) * T)  # SDPA backward: gradients of q, k, v
        if shape.kv_heads < shape.heads:
            live.alloc(2 * sd * q * T)  # k/v gradients per query head before the group sum
            live.free(2 * sd * q * T)
        live.free(sd * q * T)  # the attention output's gradient
        live.free(sd * (q + kv) * T)  # saved q, k after rotary
    live.alloc(sd * (q + kv) * T)  # rotary backward
    live.free(sd * (q + kv) * T)
    firsts = True
    for lin in [x for x in shape.linears if x.source == "norm_attn"][::-1]:
        _module_backward(live, lin, lin.name in targets, spec, T, firsts, mask_bytes)
        firsts = False
    live.free(sd * (q + 2 * kv) * T)
    norm_backward()
    return live.peak - 0


def _recompute_tail_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, mask_bytes: int = 1) -> int:
    """The most the end of a layer's forward holds on top of its saved tensors (replayed).

    Under checkpointing each layer's forward is rerun with grad just before its backward, so its last
    module's forward runs with the whole layer's saved set alive: the MLP input, the 4-bit matmul's bf16
    casts and dequantized weight, then the base output, its clone, LoRA's scaled output and their sum.
    """
    T = batch * seq
    sd = _stream_bytes(spec)
    h, r = shape.hidden, spec.lora_r
    last = shape.linears[-1]
    targets = {m.name for m in lora_modules(shape, spec)}
    lora = last.name in targets
    n_in, n_out = last.in_features * T, last.out_features * T
    own = (4 + mask_bytes) * n_in + 4 * r * T if lora and spec.lora_dropout > 0 else 0
    live = _Live(-own)  # the last module's own saved tensors do not exist yet
    # Still referenced while the last module runs: the gradient that arrived for this layer's output, the
    # MLP's input and the last module's own input (unless LoRA without dropout keeps them anyway).
    kept_anyway = lora and spec.lora_dropout == 0 and sd == 4
    live.alloc(sd * h * T + (0 if kept_anyway else sd * h * T + sd * n_in))
    if spec.bits in (4, 8):
        live.alloc(2 * n_in)
        live.alloc(2 * last.params)
        live.alloc(2 * n_out)
        live.free(2 * last.params)
        live.free(2 * n_in)
        live.alloc(sd * n_out)
        live.free(2 * n_out)
        live.alloc(sd * n_out)  # peft's defensive clone of the 4-bit result
        live.free(sd * n_out)
    else:
        live.alloc(sd * n_out)
    if lora:
        live.alloc(own)
        live.alloc(4 * n_out)  # lora_B output
        live.alloc(4 * n_out)  # * scaling
        live.free(4 * n_out)
        live.alloc(sd * n_out)  # result + lora output
        live.free(sd * n_out)
        live.free(4 * n_out)
    live.alloc(sd * h * T)  # the residual sum: the layer's output
    return live.peak


def _forward_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int) -> int:
    """Short-lived forward tensors of one layer: the MLP product and the matmul's casts, the dequantized weight."""
    T = batch * seq
    sd = _stream_bytes(spec)
    n_max = max(lin.params for lin in shape.linears)
    dequant = 2 * n_max if spec.bits in (4, 8) else 0
    return (sd + 2) * shape.intermediate * T + dequant


def estimate(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, hw: Hardware | None = None, *,
             mask_bytes: int = 1) -> Estimate:
    """Predict one training step's peak memory (steady state: optimizer states exist from the first step on).

    ``mask_bytes`` is the size of one dropout-mask element: 1 on CUDA (bool); the CPU's dropout keeps its
    mask in the input's dtype, which tests that replay the step on a CPU set to 4.
    """
    validate_spec(spec)
    if batch <= 0 or seq <= 0:
        raise PlanInputError(f"batch size and sequence length must be positive, got {batch} and {seq}")
    hw = hw or Hardware()
    T = batch * seq
    sd = _stream_bytes(spec)
    h, V, L = shape.hidden, shape.vocab, shape.layers

    packed, consts, unquant = _weights(shape, spec)
    tensors = lora_tensors(shape, spec)
    lora_params = sum(tensors)
    lora_b = sum(_align(4 * n) for n in tensors)  # peft keeps adapters in fp32 (autocast_adapter_dtype)
    opt_torch, opt_paged, opt_temp = _optimizer(spec, tensors)
    workspaces = hw.cublas_workspace_bytes * hw.cublas_handles
    tokens = 4 * _align(8 * T)  # input ids, labels, padded and shifted labels (int64)

    math_attn = uses_math_attention(shape, spec, seq, hw)
    S = layer_activation_bytes(shape, spec, batch, seq, mask_bytes, math_attn)
    fwd_tmp = _forward_temporaries(shape, spec, batch, seq)
    bwd_tmp = _backward_temporaries(shape, spec, batch, seq, mask_bytes, math_attn)
    if spec.gradient_checkpointing:
        # The recomputed layer's output stays referenced through its backward; the recompute's own tail
        # can be the higher point.
        bwd_tmp = max(bwd_tmp + sd * h * batch * seq, _recompute_tail_temporaries(shape, spec, batch, seq, mask_bytes))
    hid = sd * h * T  # one hidden state
    final_norm = (4 * h + 4) * T  # the final norm keeps its fp32 input and rsqrt
    # One 4-D mask shared by all layers: float in the stream dtype for eager, bool for SDPA.
    eager_mask = (sd if spec.attn == "eager" else 1) * batch * seq * seq if has_mask(shape, spec, seq) else 0
    if spec.gradient_checkpointing:
        stash = L * hid  # reentrant checkpointing keeps each layer's input
    else:
        stash = L * S
    stash += eager_mask
    # Logits come out of the fp32 lm_head in fp32 (a half lm_head's logits get a .float() copy), the
    # cross-entropy keeps log-softmax; HF drops the model output before backward, so the backward holds
    # log-probs, their gradient and the logits' gradient.
    softcap = 4 * T * V if shape.logit_softcap else 0
    loss_fwd = (8 if sd == 4 else 10) * T * V + softcap
    loss_bwd = 12 * T * V + softcap
    g_layer = sum(_align(4 * n) for n in tensors) // max(L, 1)  # LoRA gradients of one layer

    phases: dict[str, tuple[int, Breakdown]] = {}
    base = Breakdown(quantized_weights=packed, quantization_constants=consts, unquantized_params=unquant,
                     lora_weights=lora_b, optimizer_states=opt_torch, optimizer_states_paged=opt_paged,
                     activations=tokens, cublas_workspaces=workspaces)

    def add(name: str, **parts: int) -> None:
        bd = Breakdown(**{**base.to_dict(), **{k: base.to_dict()[k] + v for k, v in parts.items()}})
        phases[name] = (bd.allocated(), bd)

    # End of the forward: every kept activation, the final norm's output (held by the model output) and the
    # logits with their log-softmax. A layer's own forward temporaries are smaller than the logits in every
    # registry model; they matter only when the logits are tiny, so take the larger of the two.
    fwd_act = stash + final_norm + hid
    if loss_fwd >= fwd_tmp:
        add("forward", activations=fwd_act, logits_and_loss=loss_fwd)
    else:
        add("forward", activations=fwd_act, temporaries=fwd_tmp)
    add("loss backward", activations=stash + final_norm, logits_and_loss=loss_bwd)
    grads_all = g_layer * L
    if spec.gradient_checkpointing:
        # Last layer processed first: every checkpoint still alive, plus that layer recomputed.
        # With an fp32 stream the checkpointed input is the very tensor the recomputed first norm keeps.
        dup = hid if sd == 4 else 0
        add("layer backward (last)", activations=stash + S - dup, temporaries=bwd_tmp)
        add("layer backward (first)", activations=hid - dup + eager_mask + S, temporaries=bwd_tmp,
            lora_gradients=grads_all - g_layer)
    else:
        add("layer backward (last)", activations=stash, temporaries=bwd_tmp)
        add("layer backward (first)", activations=S + eager_mask, temporaries=bwd_tmp,
            lora_gradients=grads_all - g_layer)
    add("optimizer step", lora_gradients=grads_all, temporaries=opt_temp)

    peak_phase = max(phases, key=lambda k: phases[k][0])
    peak_alloc, bd = phases[peak_phase]
    static = base.allocated()
    adjust = (hw.static_offset_bytes + round((hw.dynamic_scale - 1.0) * (peak_alloc - static))
              + hw.dynamic_offset_bytes)
    if adjust:
        peak_alloc += adjust
        bd = Breakdown(**{**bd.to_dict(), "calibration": adjust})
    f_layer, f_logits = hw.fragmentation[:2] if spec.gradient_checkpointing else hw.fragmentation[2:]
    overhead = _align(f_layer * S + f_logits * 4 * T * V)
    reserved = peak_alloc + overhead
    paged_counted = opt_paged if hw.paged_in_process else 0
    process = reserved + hw.cuda_context_bytes + paged_counted
    bd = Breakdown(**{**bd.to_dict(), "allocator_overhead": overhead, "cuda_context": hw.cuda_context_bytes})
    return Estimate(
        peak_allocated_bytes=peak_alloc, peak_reserved_bytes=reserved, process_bytes=process, peak_phase=peak_phase,
        breakdown=bd, phases={k: v[0] for k, v in phases.items()}, trainable_params=lora_params,
        per_layer_activation_bytes=S, paged_in_process_bytes=paged_counted,
        phase_breakdowns={k: v[1] for k, v in phases.items()},
    )


def describe_inputs(shape: ModelShape, spec: QLoraSpec) -> dict[str, Any]:
    """The shape and recipe facts a report prints next to the numbers."""
    return {
        "model_type": shape.model_type, "parameters": shape.total_params(), "layers": shape.layers,
        "hidden_size": shape.hidden, "vocab_size": shape.vocab,
        "lora_modules": [m.name for m in lora_modules(shape, spec)],
    }
