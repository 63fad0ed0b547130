"""What a traced step uses where the real library cannot run on fake tensors, each holding and allocating
what the real one does on CUDA.

- :class:`Linear4bitStandIn`: bitsandbytes' ``Params4bit`` cannot wrap a FakeTensor, so a 4-bit linear is a
  subclass of ``bnb.nn.Linear4bit`` (so that peft wraps it with its own 4-bit LoRA layer) holding the packed
  weight and the quantization state's tensors, and allocating in forward and backward what
  ``MatMul4Bit`` (bitsandbytes 0.50.2) allocates: the dequantized absmax and the dequantized weight.
- :class:`BnbOptimizerStandIn`: bitsandbytes' 32- and 8-bit (paged) AdamW: its state tensors, with the
  paged ones (unified memory, outside torch's allocator) counted apart; the update runs in place.
- :func:`cuda_kernels`: on fake CPU tensors, make the device-dependent choices torch makes on CUDA: which
  SDPA kernel runs (flash, memory-efficient or math) and the fused dropout with its bool mask.

Imports torch and bitsandbytes: only :mod:`vramscope.planner.trace.engine` uses it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from vramscope.planner.layer import MATH_EXTRA_SCORES

BNB_BLOCKSIZE = 64  # 4-bit weights per absmax (bitsandbytes' default for NF4/FP4)
NESTED_BLOCKSIZE = 256  # absmax values per fp32 scale under double quantization
PAGED_MIN_NUMEL = 100_000  # bitsandbytes pages a state only from this many elements (get_state_buffer)
MIN_8BIT_SIZE = 4096  # smaller tensors keep fp32 states in the 8-bit optimizers
STATE_BLOCK = 256  # 8-bit blockwise optimizer states: one fp32 absmax per 256 values
EFFICIENT_MASK_PAD = 16  # the memory-efficient kernel pads an additive mask's last dimension to 16


def quant_state_shapes(out_features: int, in_features: int, double_quant: bool) -> dict[str, tuple[tuple[int, ...],
                                                                                                  torch.dtype]]:
    """The tensors bitsandbytes keeps for one 4-bit weight (packed data and QuantState), by name."""
    n = out_features * in_features
    blocks = math.ceil(n / BNB_BLOCKSIZE)
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        "weight": (((n + 1) // 2, 1), torch.uint8),
        "code": ((16,), torch.float32),  # the 16-value NF4/FP4 code, one copy per weight
    }
    if double_quant:
        shapes["absmax"] = ((blocks,), torch.uint8)
        shapes["absmax2"] = ((math.ceil(blocks / NESTED_BLOCKSIZE),), torch.float32)
        shapes["code2"] = ((256,), torch.float32)  # the 8-bit dynamic map, copied per weight
        shapes["offset"] = ((), torch.float32)
    else:
        shapes["absmax"] = ((blocks,), torch.float32)
    return shapes


def _linear4bit_base() -> type[nn.Linear]:
    import importlib

    # bitsandbytes' modules are untyped for mypy's purposes; the class is what peft dispatches on
    base: type[nn.Linear] = importlib.import_module("bitsandbytes.nn").Linear4bit
    return base


class _QuantStateView:
    """What peft and bitsandbytes read off ``weight.quant_state``/``weight`` (shape, dtype, quant type)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype, quant_type: str, nested: bool) -> None:
        self.shape, self.dtype, self.quant_type, self.nested = shape, dtype, quant_type, nested
        self.blocksize = BNB_BLOCKSIZE


class _MatMul4BitStandIn(torch.autograd.Function):
    """``bnb.MatMul4Bit`` as CUDA runs it past its fused-kernel range: dequantize, F.linear; saves nothing
    but the packed weight; backward dequantizes again for the input gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, layer: Any) -> torch.Tensor:
        ctx.layer = layer
        weight = layer.dequantize_for_matmul(x.dtype)
        return torch.nn.functional.linear(x, weight, layer.bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        weight = ctx.layer.dequantize_for_matmul(grad.dtype)
        return torch.matmul(grad, weight), None


def make_linear4bit_standin(linear: nn.Linear, compute_dtype: torch.dtype, quant_type: str,
                            double_quant: bool) -> nn.Module:
    """A module holding what ``bnb.nn.Linear4bit`` holds for ``linear`` (on ``linear``'s device, e.g. meta)."""
    base = _linear4bit_base()

    class Linear4bitStandIn(base):  # type: ignore[misc, valid-type]
        """A 4-bit linear whose tensors and transients match bitsandbytes'; it computes nothing useful."""

        def __init__(self) -> None:
            nn.Module.__init__(self)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.compute_dtype = compute_dtype
            self.compute_type_is_set = True
            self.quant_type, self.double_quant = quant_type, double_quant
            dev = linear.weight.device
            shapes = quant_state_shapes(self.out_features, self.in_features, double_quant)
            w_shape, w_dtype = shapes.pop("weight")
            self.weight = nn.Parameter(torch.empty(w_shape, dtype=w_dtype, device=dev), requires_grad=False)
            for name, (shape, dtype) in shapes.items():
                self.register_buffer(f"qs_{name}", torch.empty(shape, dtype=dtype, device=dev), persistent=False)
            self.bias = linear.bias

        def finish(self) -> None:
            """Attributes peft reads off a ``Params4bit`` (call after the tensors are materialised)."""
            w: Any = self.weight
            w.compress_statistics, w.quant_type = self.double_quant, self.quant_type
            w.quant_state = _QuantStateView(torch.Size((self.out_features, self.in_features)), self.compute_dtype,
                                            self.quant_type, self.double_quant)
            w.bnb_quantized = True

        def quant_tensors(self) -> list[torch.Tensor]:
            return [self.weight, *(b for n, b in self.named_buffers(recurse=False) if n.startswith("qs_"))]

        def dequantize_for_matmul(self, dtype: torch.dtype) -> torch.Tensor:
            absmax: Any = self.qs_absmax
            if self.double_quant:
                # dequantize_blockwise into a fresh fp32 buffer, then + offset: two fp32 copies, one alive after
                absmax = torch.empty(absmax.shape, dtype=torch.float32, device=absmax.device) + self.qs_offset
            w = torch.empty((self.out_features, self.in_features), dtype=dtype, device=self.weight.device)
            del absmax
            return w

        def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            inp_dtype = x.dtype
            x = x.to(self.compute_dtype)
            if self.bias is not None and self.bias.dtype != x.dtype:
                self.bias.data = self.bias.data.to(x.dtype)  # Linear4bit casts a bias for good
            if torch.is_grad_enabled() and x.requires_grad:
                out: torch.Tensor = _MatMul4BitStandIn.apply(x, self)
            else:  # no autograd node: the same dequantize + linear, nothing saved
                out = torch.nn.functional.linear(x, self.dequantize_for_matmul(x.dtype), self.bias)
            return out.to(inp_dtype)

    module = Linear4bitStandIn()
    return module


def quantize_linears(model: nn.Module, compute_dtype: torch.dtype, quant_type: str, double_quant: bool,
                     skip: Iterable[nn.Module]) -> list[nn.Module]:
    """Replace every ``nn.Linear`` but those in ``skip`` (the output embedding) the way transformers'
    bitsandbytes integration does; returns the stand-ins."""
    skipped = {id(m) for m in skip}
    out = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and id(child) not in skipped:
                standin = make_linear4bit_standin(child, compute_dtype, quant_type, double_quant)
                setattr(parent, name, standin)
                out.append(standin)
    return out


class BnbOptimizerStandIn(torch.optim.Optimizer):
    """bitsandbytes' AdamW (32- or 8-bit, paged or not): the states it allocates, an in-place update.

    Paged states live in CUDA unified memory, outside torch's allocator: they are not allocated here but
    added to ``paged_bytes``.
    """

    def __init__(self, params: Iterable[torch.Tensor], bits: int, paged: bool, lr: float = 2e-4) -> None:
        super().__init__(params, {"lr": lr})
        self.bits, self.paged = bits, paged
        self.paged_bytes = 0

    def _buffer(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        if self.paged and p.numel() >= PAGED_MIN_NUMEL:
            self.paged_bytes += p.numel() * torch.empty((), dtype=dtype).element_size()
            return None
        return torch.zeros(p.shape, dtype=dtype, device=p.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    if self.bits == 32 or p.numel() < MIN_8BIT_SIZE:
                        state["state1"] = self._buffer(p, torch.float32)
                        state["state2"] = self._buffer(p, torch.float32)
                    else:
                        state["state1"] = self._buffer(p, torch.uint8)
                        state["state2"] = self._buffer(p, torch.uint8)
                        blocks = math.ceil(p.numel() / STATE_BLOCK)
                        state["absmax1"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros((blocks,), dtype=torch.float32, device=p.device)
                state["step"] += 1  # the update itself is one in-place CUDA kernel


# Which SDPA kernel each traced attention call took (reset by cuda_kernels); the trace reports it.
KERNELS_USED: dict[str, int] = {}


def _flash_ok(q: torch.Tensor, k: torch.Tensor, mask: Any) -> bool:
    return (q.dtype in (torch.float16, torch.bfloat16) and mask is None and q.shape[-1] <= 256
            and q.shape[-1] % 8 == 0 and k.shape[-1] == q.shape[-1])


def _efficient_ok(q: torch.Tensor, k: torch.Tensor, enable_gqa: bool) -> bool:
    gqa = enable_gqa and q.shape[-3] != k.shape[-3]
    align = 8 if q.dtype in (torch.float16, torch.bfloat16) else 4
    return not gqa and q.shape[-1] % align == 0 and q.shape[-1] <= 512


def cuda_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the kernel CUDA's dispatcher picks (flash, then memory-efficient,
    then math), called directly so that a fake CPU tensor saves what the CUDA kernel saves."""
    aten = torch.ops.aten
    if torch.is_autocast_enabled("cpu"):  # CUDA autocast casts SDPA's float inputs (the trace's cuda_autocast)
        half = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(half) if t.is_floating_point() else t for t in (query, key, value))
        if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(half)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    math_extra_scores = MATH_EXTRA_SCORES
    if _flash_ok(query, key, attn_mask):
        KERNELS_USED["flash"] = KERNELS_USED.get("flash", 0) + 1
        out = aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)
        result: torch.Tensor = out[0]
        return result
    if _efficient_ok(query, key, enable_gqa):
        KERNELS_USED["efficient"] = KERNELS_USED.get("efficient", 0) + 1
        bias = None
        if attn_mask is not None:
            # a bool mask becomes an additive one in the query dtype, its last dimension padded to 16
            last = attn_mask.shape[-1]
            padded = math.ceil(last / EFFICIENT_MASK_PAD) * EFFICIENT_MASK_PAD
            full = torch.empty((*attn_mask.shape[:-1], padded), dtype=query.dtype, device=query.device)
            bias = full[..., :last]
        out = aten._scaled_dot_product_efficient_attention(query, key, value, bias, grad, dropout_p, is_causal,
                                                           scale=scale)
        result = out[0]
        return result
    KERNELS_USED["math"] = KERNELS_USED.get("math", 0) + 1
    holder: list[torch.Tensor] = []
    scores = (*query.shape[:-1], key.shape[-2])
    if grad and math_extra_scores > 0:
        query = _ReleaseExtra.apply(query, holder)
    math_out = aten._scaled_dot_product_attention_math(query, key, value, attn_mask, dropout_p, is_causal, None,
                                                       scale=scale, enable_gqa=enable_gqa)
    result = math_out[0]
    if grad and math_extra_scores > 0:
        result = _HoldExtra.apply(result, holder, (math_extra_scores * scores[0], *scores[1:]))
    return result


# On the H200 the math kernel's backward held one more B x heads x S x S tensor than its decomposition shows on
# a CPU (planner/layer.py's MATH_EXTRA_SCORES, seen in all 9 affected measured points); the trace models it for
# the duration of the attention's backward: allocated when the output's gradient arrives, freed when the query's
# gradient leaves.


class _HoldExtra(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, holder: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
        ctx.holder, ctx.shape = holder, shape
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.holder.append(torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device))
        return grad, None, None


class _ReleaseExtra(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, holder: list[torch.Tensor]) -> torch.Tensor:
        ctx.holder = holder
        return query.view_as(query)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.holder.clear()
        return grad, None


def cuda_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """``F.dropout`` as CUDA runs it: the fused kernel, which keeps a bool mask (the CPU keeps a float one)."""
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0
    out: torch.Tensor = torch.native_dropout(input, p, True)[0]
    return out


@contextmanager
def cuda_kernels(sdpa: bool = True) -> Iterator[None]:
    """Within: SDPA and dropout choose what they would on CUDA. ``sdpa=False`` keeps torch's own SDPA
    (a real CPU step cannot run the CUDA kernels)."""
    functional: Any = torch.nn.functional
    saved = functional.scaled_dot_product_attention, functional.dropout
    KERNELS_USED.clear()
    if sdpa:
        functional.scaled_dot_product_attention = cuda_sdpa
    functional.dropout = cuda_dropout
    try:
        yield
    finally:
        functional.scaled_dot_product_attention, functional.dropout = saved
