"""One decoder layer's memory: what it keeps for backward and what its forward, recompute and backward hold
on top, replayed event by event. The dtypes come from :class:`~vramscope.planner.frameworks.Precision`, so
the same replay serves every framework.

Pure arithmetic over config.json fields; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import Precision
from vramscope.planner.shapes import Linear, ModelShape
from vramscope.recipe import QLoraSpec

# mem-efficient SDPA pads its log-sum-exp to a multiple of 32 query positions, an additive mask's last dim to 16.
LSE_PAD = 32
MASK_PAD = 16
# Calibrated from the H200 measurements: at the softmax backward of SDPA's math kernel the GPU holds one more
# B x H x S x S fp32 tensor than a CPU replay of the same kernel (saved probabilities + their gradient + the
# softmax gradient). Seen identically in 9 points of 3 architectures, with and without checkpointing.
MATH_EXTRA_SCORES = 1


# peft 0.21 (utils/transformers_weight_conversion.py, ``_convert_peft_config_moe``) rewrites a LoRA config for the
# model types whose experts transformers 5 fused: the transformers 4 names of the experts' linears and of the router
# become ``target_parameters`` (peft's ``ParamWrapper`` over the 3-D ``gate_up_proj`` / ``down_proj`` and the
# router's ``gate.weight``), and ``all-linear`` takes every one of them. Mixtral is peft's own entry; qwen3_moe maps
# to the qwen2_moe pattern in transformers' ``_MODEL_TO_CONVERSION_PATTERN`` (5.17 and 5.24), qwen2_moe itself is
# not a key there, so its experts stay untouched (the H200 Qwen1.5-MoE runs: 32 LoRA layers, q/k/v/o and the
# shared expert's). Names: the router's, the two fused into gate_up_proj, down_proj's.
_EXPERT_LORA_NAMES = {"mixtral": ("gate", ("w1", "w3"), "w2"),
                      "qwen3_moe": ("gate", ("gate_proj", "up_proj"), "down_proj")}


@dataclass(frozen=True)
class ExpertLora:
    """What peft's ``ParamWrapper`` adapts in one MoE layer (see ``_EXPERT_LORA_NAMES``)."""

    router: bool
    gate_up: bool
    down: bool

    @property
    def experts(self) -> bool:
        return self.gate_up or self.down


def expert_lora(shape: ModelShape, spec: QLoraSpec) -> ExpertLora:
    """Which expert and router parameters peft wraps with LoRA for this run (none: ``ExpertLora(False, ...)``).

    ``ParamWrapper`` refuses ``lora_dropout != 0`` (the run stops in ``get_peft_model``: the H200's Mixtral under
    HF Trainer's qlora recipe), so with dropout there is no such adapter to plan."""
    if spec.lora_dropout > 0:
        return ExpertLora(False, False, False)
    return _expert_targets(shape, spec)


def _expert_targets(shape: ModelShape, spec: QLoraSpec) -> ExpertLora:
    """Which expert and router parameters the run's LoRA targets name, whatever the dropout."""
    names = _EXPERT_LORA_NAMES.get(shape.model_type)
    if not shape.experts or names is None:
        return ExpertLora(False, False, False)
    targets = spec.lora_targets
    if not targets or tuple(targets) == ("all-linear",):
        return ExpertLora(True, True, True)
    leaves = {t.strip().split(".")[-1] for t in targets}
    router, fused, down = names
    return ExpertLora(router in leaves, set(fused) <= leaves, down in leaves)


def expert_dropout_refusal(shape: ModelShape, spec: QLoraSpec) -> str | None:
    """The line a plan must start with when peft will refuse the run: the targets reach the fused experts or the
    router (``ParamWrapper``) and ``lora_dropout`` is not 0 (``get_peft_model`` raises; seen on the H200 with
    Mixtral under an HF Trainer recipe's 0.05)."""
    named = _expert_targets(shape, spec)
    if spec.lora_dropout <= 0 or not (named.router or named.experts):
        return None
    return (f"peft will refuse this run: on {shape.model_type} its LoRA targets reach the fused experts and the "
            f"router, which peft wraps as ParamWrapper, and ParamWrapper takes no dropout (\"lora.ParamWrapper does "
            f"not work with lora_dropout != 0\"). Set lora_dropout to 0, or name the attention's linears only "
            f"(q_proj,k_proj,v_proj,o_proj); planned here without expert adapters")


def expert_lora_names(shape: ModelShape) -> set[str]:
    """The target names peft turns into expert or router adapters on this model type (none for the others)."""
    names = _EXPERT_LORA_NAMES.get(shape.model_type)
    return set() if names is None or not shape.experts else {names[0], *names[1], names[2]}


def expert_lora_tensors(shape: ModelShape, spec: QLoraSpec) -> list[int]:
    """Element counts of one layer's expert and router LoRA tensors (``ParamWrapper``: lora_A is
    ``[r * E, in]``, lora_B ``[out, r * E]``; the fused gate_up_proj gets rank and alpha doubled, the 2-D router
    one expert)."""
    el = expert_lora(shape, spec)
    r, e, h, i = spec.lora_r, shape.experts, shape.hidden, shape.intermediate
    out: list[int] = []
    if el.router:
        out += [r * h, e * r]
    if el.gate_up:
        out += [2 * r * e * h, 2 * i * 2 * r * e]
    if el.down:
        out += [r * e * i, h * r * e]
    return out


def merged_expert_bytes(shape: ModelShape, spec: QLoraSpec, pr: Precision) -> tuple[int, int]:
    """(gate_up_proj, down_proj) bytes of the merged weights ``W + s * B @ A`` one layer's adapted experts make.

    ``ParamWrapper`` parametrizes the 3-D weight (``_LoraFactorsProxy``: one ``torch.baddbmm`` over the frozen
    weight and the two factors), so each forward materialises a new tensor the size of the whole expert stack in
    the weight's dtype; being a function of trainable factors it requires grad, so ``grouped_mm`` keeps it (and
    its input) for backward, and backward makes its gradient, the same size again."""
    el = expert_lora(shape, spec)
    one = pr.params * shape.experts * shape.hidden * shape.intermediate
    return (2 * one if el.gate_up else 0), (one if el.down else 0)


def merged_expert_pool(shape: ModelShape, spec: QLoraSpec, pr: Precision) -> tuple[int, int]:
    """(bytes of merged expert stacks among a layer's saved tensors, bytes of their cached blocks free at the peak).

    The merged stacks and their gradients are made and freed at the same four sizes in every layer's forward
    and backward, so the allocator keeps one block of each (the merged gate_up and down, and a gradient of
    each) and hands them back by exact fit layer after layer: they fragment nothing, unlike the activations the
    frameworks' fragmentation factors were fitted on. What they add to the reserved pool is the blocks not live
    at the backward's fullest moment. The backward replay (``backward_temporaries``) holds at most gate_up and
    down with down's gradient (down's backward), or gate_up with its gradient (gate_up's backward)."""
    gate_up, down = merged_expert_bytes(shape, spec, pr)
    if not (gate_up or down):
        return 0, 0
    live = max(gate_up + 2 * down, 2 * gate_up)
    return gate_up + down, 2 * (gate_up + down) - live


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
        if not hits and leaf in expert_lora_names(shape):
            continue  # an expert or the router: a ParamWrapper (expert_lora), not a linear module
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
    return (out + expert_lora_tensors(shape, spec)) * shape.layers


def has_mask(shape: ModelShape, spec: QLoraSpec, seq: int) -> bool:
    """Whether transformers builds a 4-D attention mask instead of relying on ``is_causal``.

    Eager attention always does; SDPA does once the sequence reaches the sliding window
    (``_ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size``), e.g. Mistral at 4096 tokens.
    """
    if spec.attn == "eager":
        return True
    return spec.attn == "sdpa" and shape.sliding_window is not None and seq >= shape.sliding_window


def attention_bytes(spec: QLoraSpec, pr: Precision) -> int:
    """Bytes per element of q, k, v and the attention output: flash-attn always runs in half precision."""
    return 2 if spec.attn == "flash_attention_2" else pr.attention


def uses_math_attention(shape: ModelShape, spec: QLoraSpec, seq: int, pr: Precision, gqa_sdpa_math: bool) -> bool:
    """Whether this run's attention goes through SDPA's math kernel (O(S^2) memory); see ``Hardware``.

    Only fp32 q/k/v of a grouped-query model take it: flash and cuDNN refuse fp32, torch 2.11's mem-efficient
    kernel refuses GQA. Half inputs (autocast, or a bf16 stream) go to flash, which accepts GQA. transformers
    asks SDPA for grouped-query attention (``enable_gqa``) only when there is no mask; with a mask it repeats
    K/V itself and the mem-efficient kernel takes the mask.
    """
    return (spec.attn == "sdpa" and attention_bytes(spec, pr) == 4 and shape.kv_heads < shape.heads
            and gqa_sdpa_math and not has_mask(shape, spec, seq))


def softcap_score_bytes(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, pr: Precision) -> int:
    """What Gemma-2's attention soft-capping keeps per layer for backward (eager attention only).

    transformers' ``eager_attention_forward`` (gemma2) caps the scores as ``tanh(scores / cap) * cap`` before
    the mask and the fp32 softmax. Of the three ops only ``tanh`` saves a tensor for its backward (its own
    output: d tanh = 1 - tanh^2), one ``[B, heads, S, S]`` in the scores' dtype (the query's: autocast leaves
    ``tanh`` in half); the division and multiplication by a constant save nothing. Flash-attention caps inside
    its kernel, and SDPA is refused for Gemma-2 (``_supports_sdpa = False``): nothing there."""
    if not shape.attn_softcap or spec.attn != "eager":
        return 0
    return attention_bytes(spec, pr) * batch * shape.heads * seq * seq


def _input_bytes(lin: Linear, spec: QLoraSpec, pr: Precision) -> int:
    """dtype size of a linear module's input: the attention output for o_proj, the stream otherwise."""
    return attention_bytes(spec, pr) if lin.source == "attn_out" else pr.stream


def lora_weight_copies(shape: ModelShape, spec: QLoraSpec, pr: Precision) -> int:
    """Half copies of one layer's fp32 LoRA weights that autocast makes for the matmuls (and keeps for backward)."""
    if not (pr.autocast_copies and pr.lora_param == 4):
        return 0
    return sum(2 * spec.lora_r * (lin.in_features + lin.out_features) for lin in lora_modules(shape, spec))


def layer_activation_bytes(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, pr: Precision,
                           mask_bytes: int = 1, math_attn: bool = False) -> int:
    """Bytes one decoder layer keeps for its backward (what a recomputed layer holds under checkpointing)."""
    T = batch * seq
    sd, la, ad = pr.stream, pr.lora_compute, attention_bytes(spec, pr)
    h, i, r = shape.hidden, shape.intermediate, spec.lora_r
    q, kv = shape.q_dim, shape.kv_dim
    total = 0
    # Norms keep their fp32 input (the residual itself when the stream is fp32; a .float() copy otherwise)
    # and one fp32 rsqrt (RMSNorm) or mean+rstd (LayerNorm) per row.
    per_row = 8 if shape.norm_bias else 4
    norm_in = 4 * h if not shape.norm_bias else sd * h
    total += shape.norms_per_layer * (norm_in + per_row) * T

    # LoRA: dropout keeps a bool mask and lora_A keeps its input in the LoRA compute dtype (the dropout
    # output, or autocast's half copy of it, the fp32 output then being freed); lora_B keeps lora_A's output.
    # Without dropout lora_A keeps its input, which the modules reading one tensor share when no cast is needed.
    shared: dict[str, int] = {}
    for lin in lora_modules(shape, spec):
        if spec.lora_dropout > 0:
            total += (la + mask_bytes) * lin.in_features * T
        elif _input_bytes(lin, spec, pr) != la:
            total += la * lin.in_features * T
        elif lin.source != "attn_out":  # the attention output is kept by SDPA already
            shared[lin.source] = lin.in_features
        total += la * r * T
    total += la * sum(shared.values()) * T
    total += lora_weight_copies(shape, spec, pr)

    # Attention. Fused q/k/v projections: v is a view of the fused output, which then stays alive whole
    # (unless autocast casts it, and the cast copy is what SDPA keeps).
    fused = any(lin.name in ("qkv_proj", "query_key_value") for lin in shape.linears)
    v_keep = (q + 2 * kv) if fused and ad == sd else kv
    if math_attn:
        # SDPA's math kernel: keeps the scaled query, the repeated and scaled keys, the repeated values and
        # the fp32 softmax probabilities (B x H x S x S).
        total += 3 * ad * q * T + 4 * batch * shape.heads * seq * seq
    elif spec.attn == "sdpa" and has_mask(shape, spec, seq):
        # A materialised mask: transformers repeats K/V per query head; the mem-efficient kernel keeps q, the
        # repeated k and v, its output, the log-sum-exp and the additive mask (query dtype) made from the bool one.
        k_rep = q if shape.kv_heads < shape.heads else kv
        lse = 4 * batch * shape.heads * math.ceil(seq / LSE_PAD) * LSE_PAD
        bias = ad * batch * seq * math.ceil(seq / MASK_PAD) * MASK_PAD
        total += ad * (2 * q + 2 * k_rep) * T + lse + bias
    elif spec.attn == "sdpa":
        # fp32 q/k/v: mem-efficient SDPA; half q/k/v: flash (GQA without repeat_kv). Either keeps q, k, v,
        # its output and an fp32 log-sum-exp (padded to 32 rows, which errs high for flash). Its output is
        # already [B, S, H*D], so no copy for o_proj.
        lse = 4 * batch * shape.heads * math.ceil(seq / LSE_PAD) * LSE_PAD
        total += ad * (q + kv + v_keep + q) * T + lse
    elif spec.attn == "flash_attention_2":
        lse = 4 * batch * shape.heads * seq
        # flash-attn runs in half precision; transformers casts fp32 q/k/v down and keeps the copies
        total += 2 * (2 * q + 2 * kv) * T + lse
    else:  # eager: repeat_kv copies, fp32 softmax probabilities (plus the half copy when q/k are half)
        k_rep = q if shape.kv_heads < shape.heads else kv
        total += ad * (q + 2 * k_rep) * T
        total += (4 if ad == 4 else 6) * batch * shape.heads * seq * seq
        total += softcap_score_bytes(shape, spec, batch, seq, pr)

    # MLP.
    if shape.experts:
        k = shape.experts_per_token
        # transformers 5's grouped_mm experts (integrations/moe.py): router logits and softmax (fp32) per token;
        # per routed (token, expert) pair, in the experts' own dtype (grouped_mm is not autocast-enabled and
        # casts its input to the weight's): the gate/up output [2I] (the activation's input and the product's
        # operand), the activation [I], the down output [h] (for the routing weight's gradient); plus the pair's
        # weight and index. The experts are frozen under LoRA, so neither grouped matmul keeps its input
        # (only a weight's gradient needs it): a CPU replay of Mixtral and Qwen2-MoE layers keeps exactly this.
        wd = pr.params
        total += 2 * 4 * shape.experts * T + k * ((h + 3 * i) * wd + 16) * T
        el = expert_lora(shape, spec)
        if el.router:
            total += sd * h * T  # F.linear over the router's merged (trainable) weight keeps its input
        gate_up, down = merged_expert_bytes(shape, spec, pr)
        # adapted experts (peft's ParamWrapper): the merged weights require grad, so each grouped_mm keeps its
        # merged weight and its input (the routed tokens [k T, h]; the activation's product [k T, I])
        total += gate_up + down + (k * h * T * wd if gate_up else 0) + (k * i * T * wd if down else 0)
        if shape.shared_expert_intermediate:
            # the shared expert (a gated MLP of nn.Linear), its output kept by the sigmoid gate's product, the gate
            total += 3 * sd * shape.shared_expert_intermediate * T + sd * h * T + sd * T
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


def _module_backward(live: _Live, lin: Linear, lora: bool, spec: QLoraSpec, pr: Precision, T: int, first: bool,
                     mask_bytes: int = 1) -> None:
    """Replay the backward of one (LoRA-wrapped) frozen linear; its input gradient stays alive afterwards.

    autograd runs the LoRA branch first (its nodes were created after the base layer's), then the base:
    bitsandbytes' MatMul4Bit dequantizes the weight to bf16 again and computes the input gradient in bf16,
    which the surrounding casts bring back to the input's dtype. ``first`` says whether this module creates
    its input's gradient buffer (later modules reading the same input accumulate into it in place).
    """
    la, lp = pr.lora_compute, pr.lora_param
    xb = _input_bytes(lin, spec, pr)
    r, n_in, n_out = spec.lora_r, lin.in_features * T, lin.out_features * T
    if lora:
        live.alloc(la * n_out)  # grad * scaling
        live.alloc(la * r * T)  # grad of lora_A's output
        live.alloc(lp * r * lin.out_features)  # lora_B.weight.grad (kept until the optimizer step)
        live.free(la * n_out)
        live.free(la * r * T)  # lora_B's saved input
        live.alloc(la * n_in)  # grad of lora_A's input
        live.alloc(lp * r * lin.in_features)  # lora_A.weight.grad
        live.free(la * r * T)
        g = la
        if spec.lora_dropout > 0:
            live.free(la * n_in)  # lora_A's saved input (the dropout output or its half copy)
            if pr.autocast_copies and xb != la:  # autocast's cast backward, before the dropout's
                live.alloc(xb * n_in)
                live.free(la * n_in)
                g = xb
            live.alloc(g * n_in)  # dropout backward: grad * mask
            live.free(g * n_in)
            live.free(mask_bytes * n_in)
        if g != xb:
            live.alloc(xb * n_in)
            live.free(g * n_in)
            if spec.lora_dropout == 0:
                live.free(la * n_in)  # the module's own copy of its input
        if not first:
            live.free(xb * n_in)  # accumulated into the existing buffer in place
        first = False
    if spec.bits in (4, 8):
        cb = pr.compute
        dequant = cb * lin.params  # 4-bit: dequantized to the compute dtype; 8-bit: int8 weights cast to it
        # the output gradient is cast to the compute dtype (under autocast an fp32 compute dtype's output is half)
        cast_out = xb != cb or (pr.autocast and cb == 4)
        if cast_out:
            live.alloc(cb * n_out)
        live.alloc(dequant)
        live.alloc(cb * n_in)  # input gradient in the compute dtype
        live.free(dequant)
        if cast_out:
            live.free(cb * n_out)
        if xb != cb:
            live.alloc(xb * n_in)
            live.free(cb * n_in)
    else:
        live.alloc(xb * n_in)
    if not first:
        live.free(xb * n_in)


def backward_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, pr: Precision,
                         mask_bytes: int = 1, math_attn: bool = False) -> int:
    """The most a decoder layer's backward holds on top of the tensors it saved, found by replaying it.

    Starts with the layer's saved tensors and the incoming gradient, then walks the nodes in the order
    autograd runs them (MLP before attention, within each the last-created branch first), adding each
    gradient when it is produced and dropping saved tensors when their node has run.
    """
    T = batch * seq
    sd, la, ad = pr.stream, pr.lora_compute, attention_bytes(spec, pr)
    h, i = shape.hidden, shape.intermediate * (shape.experts_per_token if shape.experts else 1)
    q, kv = shape.q_dim, shape.kv_dim
    targets = {m.name for m in lora_modules(shape, spec)}
    lins = {lin.name: lin for lin in shape.linears}
    shared_input_free = spec.lora_dropout == 0 and sd == la
    live = _Live(sd * h * T)  # the gradient arriving from the layer above

    # The routed experts stay 16-bit 3-D parameters whatever the recipe's bits (bitsandbytes quantizes only
    # nn.Linear), so their grouped_mm backward dequantizes nothing: replayed as 16-bit linears k wide.
    expert_spec = replace(spec, bits=16)

    def module(lin: Linear, first: bool, expert: bool = False) -> None:
        _module_backward(live, lin, lin.name in targets, expert_spec if expert else spec, pr, T, first, mask_bytes)

    def norm_backward() -> None:
        live.alloc(3 * 4 * h * T)  # grad * weight, grad * rsqrt, grad through pow
        live.free(3 * 4 * h * T)
        live.alloc(sd * h * T)  # gradient of the norm's input, added to the residual's gradient
        live.free(4 * h * T + 4 * T)  # the norm's saved input and rsqrt

    # MLP, last module first.
    if shape.experts:
        # the routed experts are 3-D parameters, not LoRA-wrapped modules (a shared expert's nn.Linear of the
        # same leaf names must not stand in for them); their backward is replayed as one gated MLP k wide
        lins = {}
    merged_gu, merged_down = merged_expert_bytes(shape, spec, pr)
    wd, k, e, r = pr.params, shape.experts_per_token, shape.experts, spec.lora_r

    def merged_backward(merged: int, saved_input: int, factors: tuple[int, int]) -> None:
        """After an adapted expert grouped_mm's backward (its merged weight's gradient made beside its input's):
        its saved merged weight and input go; baddbmm's backward turns the gradient into each factor's (a bmm,
        then the product scaled by alpha: kept as the LoRA gradient) and the merged gradient goes."""
        live.free(merged + saved_input)
        for n in factors:
            live.alloc(2 * pr.lora_param * n)
            live.free(pr.lora_param * n)
        live.free(merged)

    if shape.experts or shape.gated_mlp:
        down = lins.get("down_proj") or Linear("down_proj", i, h)
        live.alloc(merged_down)
        module(down, True, bool(shape.experts))
        if merged_down:
            merged_backward(merged_down, wd * i * T, (h * r * e, r * e * shape.intermediate))
        if shared_input_free and down.name in targets:
            live.free(la * i * T)  # the product was kept only for lora_A
        live.alloc(2 * sd * i * T)  # gradients of the activation output and of the up projection
        live.free(sd * i * T)  # the product's gradient
        live.free(2 * sd * i * T)  # the multiplication's saved operands
        ups = [lins[n] for n in ("up_proj", "gate_up_proj") if n in lins] or [Linear("up_proj", h, i)]
        live.alloc(merged_gu)
        module(ups[0], True, bool(shape.experts))
        if merged_gu:
            merged_backward(merged_gu, wd * h * k * T, (2 * shape.intermediate * 2 * r * e, 2 * r * e * h))
        live.free(sd * i * T)  # up's gradient
        live.alloc(sd * i * T)  # activation backward
        live.free(sd * i * T)
        live.free(sd * i * T)  # the activation's saved input
        gate = lins.get("gate_proj")
        if gate is not None:
            module(gate, False)
        live.free(sd * i * T)
    else:
        down = lins.get("dense_4h_to_h") or Linear("down", i, h)
        module(down, True)
        live.alloc(sd * i * T)  # GELU backward
        live.free(sd * i * T)
        live.free(sd * i * T)  # GELU's saved input
        up = lins.get("dense_h_to_4h") or Linear("up", h, i)
        module(up, True)
        live.free(sd * i * T)
    if shared_input_free:
        live.free(la * h * T)
    norm_backward()

    # Attention.
    o = next(lin for lin in shape.linears if lin.source == "attn_out")
    module(o, True)
    if math_attn:
        scores = 4 * batch * shape.heads * seq * seq
        live.alloc(scores + ad * q * T)  # probs @ v backward: gradients of the probabilities and of v
        live.free(ad * q * T)  # the attention output's gradient
        live.free(ad * q * T)  # saved repeated v
        # Softmax backward. The H200 measurements hold one more scores-sized fp32 tensor here than a replay
        # of the math kernel on a CPU shows (2 beside the saved probabilities); MATH_EXTRA_SCORES carries it.
        live.alloc((1 + MATH_EXTRA_SCORES) * scores)
        live.free((1 + MATH_EXTRA_SCORES) * scores)  # gradient of the probabilities and the unexplained copy
        live.free(scores)  # saved probabilities
        live.alloc(2 * ad * q * T)  # q @ k^T backward
        live.free(scores)
        live.free(2 * ad * q * T)  # saved scaled q and repeated k
        live.alloc(ad * (q + 2 * kv) * T)  # scale and repeat backward: gradients of q, k, v
        live.free(3 * ad * q * T)
    else:
        live.alloc(ad * (q + 2 * kv) * T)  # SDPA backward: gradients of q, k, v
        if shape.kv_heads < shape.heads:
            live.alloc(2 * ad * q * T)  # k/v gradients per query head before the group sum
            live.free(2 * ad * q * T)
        live.free(ad * q * T)  # the attention output's gradient
        live.free(ad * (q + kv) * T)  # saved q, k after rotary
    if ad != sd:  # autocast's cast backward brings the q, k, v gradients to the stream dtype
        live.alloc(sd * (q + 2 * kv) * T)
        live.free(ad * (q + 2 * kv) * T)
    live.alloc(sd * (q + kv) * T)  # rotary backward
    live.free(sd * (q + kv) * T)
    firsts = True
    for lin in [x for x in shape.linears if x.source == "norm_attn"][::-1]:
        module(lin, firsts)
        firsts = False
    live.free(sd * (q + 2 * kv) * T)
    norm_backward()
    return live.peak


def recompute_tail_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, pr: Precision,
                               mask_bytes: int = 1) -> int:
    """The most the end of a layer's forward holds on top of its saved tensors (replayed).

    Under checkpointing each layer's forward is rerun with grad just before its backward, so its last
    module's forward runs with the whole layer's saved set alive: the MLP input, the 4-bit matmul's bf16
    casts and dequantized weight, then the base output, its clone, LoRA's scaled output and their sum.
    """
    T = batch * seq
    sd, la = pr.stream, pr.lora_compute
    h, r = shape.hidden, spec.lora_r
    last = shape.linears[-1]
    xb = _input_bytes(last, spec, pr)
    targets = {m.name for m in lora_modules(shape, spec)}
    lora = last.name in targets
    n_in, n_out = last.in_features * T, last.out_features * T
    own = (la + mask_bytes) * n_in + la * r * T if lora and spec.lora_dropout > 0 else 0
    live = _Live(-own)  # the last module's own saved tensors do not exist yet
    # Still referenced while the last module runs: the gradient that arrived for this layer's output, the
    # MLP's input and the last module's own input (unless LoRA without dropout keeps them anyway).
    kept_anyway = lora and spec.lora_dropout == 0 and xb == la
    live.alloc(sd * h * T + (0 if kept_anyway else sd * h * T + xb * n_in))
    if spec.bits in (4, 8):
        cb = pr.compute
        # fp32 compute under autocast: F.linear inside the 4-bit matmul makes half copies of input and weight
        extra = 2 * (n_in + last.params) if pr.autocast and cb == 4 else 0
        ob = 2 if pr.autocast else cb  # the matmul's output dtype
        if xb != cb:
            live.alloc(cb * n_in)
        live.alloc(cb * last.params)
        live.alloc(extra)
        live.alloc(ob * n_out)
        live.free(cb * last.params + extra)
        if xb != cb:
            live.free(cb * n_in)
        if xb != ob:
            live.alloc(xb * n_out)
            live.free(ob * n_out)
        live.alloc(xb * n_out)  # peft's defensive clone of the 4-bit result
        live.free(xb * n_out)
    else:
        live.alloc(xb * n_out)
    if lora:
        live.alloc(own)
        live.alloc(la * n_out)  # lora_B output
        live.alloc(la * n_out)  # * scaling
        live.free(la * n_out)
        live.alloc(sd * n_out)  # result + lora output
        live.free(xb * n_out)
        live.free(la * n_out)
    live.alloc(sd * h * T)  # the residual sum: the layer's output
    return live.peak


def forward_temporaries(shape: ModelShape, spec: QLoraSpec, batch: int, seq: int, pr: Precision) -> int:
    """Short-lived forward tensors of one layer: the MLP product and the matmul's casts, the dequantized weight."""
    T = batch * seq
    n_max = max(lin.params for lin in shape.linears)
    cb = pr.compute
    dequant = cb * n_max if spec.bits in (4, 8) else 0
    if spec.bits in (4, 8) and pr.autocast and cb == 4:
        dequant += 2 * n_max + 2 * shape.intermediate * T  # autocast's half copies inside the fp32 matmul
    gate_up, down = merged_expert_bytes(shape, spec, pr)  # both merged expert stacks live through the experts
    return (pr.stream + cb) * shape.intermediate * T + dequant + gate_up + down
