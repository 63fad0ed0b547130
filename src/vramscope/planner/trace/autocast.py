"""CUDA's autocast on the trace's fake CPU tensors (the HF Trainer's ``bf16=True``, through accelerate).

``torch.autocast("cuda")`` casts only CUDA tensors, and the trace's fake tensors are CPU tensors (see
:mod:`vramscope.planner.trace.engine`), so :func:`cuda_autocast` assembles CUDA's policy from three parts:

- torch's own CPU autocast, which casts the same matmuls to half precision as CUDA's (``linear``, ``mm``,
  ``bmm``, ``matmul``, ``addmm``, ``baddbmm``, SDPA) with the same cast cache (an fp32 leaf parameter is cast
  once per forward); it runs in the dispatcher above autograd, so autograd saves the half copies as on CUDA;
- a ``TorchFunctionMode`` for the ops CUDA runs in fp32 and the CPU does not (``torch.testing``'s
  ``AutocastTestLists``: ``exp``, ``log``, ``pow``, ``rsqrt``, ``layer_norm``, ``rms_norm``, ... are cast to
  fp32; ``softmax``, ``log_softmax``, ``sum``, ``cumsum``, ``prod`` get ``dtype=torch.float32``), active only
  while CPU autocast is (transformers' ``torch.autocast(device_type=x.device.type, enabled=False)`` around the
  rotary embedding then switches it off, as it switches CUDA's off in the real run);
- CUDA's autocast flag itself, so that ``torch.is_autocast_enabled()`` answers as on CUDA (peft skips its
  own casts of the LoRA input when autocast is on).

:func:`outputs_to_fp32` is accelerate's ``convert_outputs_to_fp32`` wrapper: the model's half outputs (the
logits) come back as fp32 copies.

Imports torch: only :mod:`vramscope.planner.trace.engine` uses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

HALF = (torch.float16, torch.bfloat16)
# CUDA's fp32 list (autocast_mode.cpp, as torch.testing._internal.autocast_test_lists states it) minus what CPU
# autocast already casts to fp32 (the losses): half inputs are cast to fp32.
CUDA_FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "rms_norm", "group_norm", "norm",
    "cosine_similarity", "dist", "pdist", "cdist", "renorm", "logsumexp", "cross_entropy",
})
# CUDA's fp32_set_opt_dtype ops: a half first argument without an explicit dtype runs with dtype=float32.
CUDA_FP32_OUTPUT = frozenset({"softmax", "log_softmax", "cumprod", "cumsum", "prod", "sum"})


def _is_half(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in HALF


def _to_fp32(x: Any) -> Any:
    return x.to(torch.float32) if _is_half(x) else x


class _CudaFp32Ops(TorchFunctionMode):
    """The part of CUDA's autocast policy that CPU autocast lacks: ops that run in fp32 on CUDA."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in CUDA_FP32 or name in CUDA_FP32_OUTPUT) and torch.is_autocast_enabled("cpu"):
            if name in CUDA_FP32:
                args, kwargs = tree_map(_to_fp32, args), tree_map(_to_fp32, kwargs)
            elif args and _is_half(args[0]) and kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)


@contextmanager
def cuda_autocast(dtype: torch.dtype = torch.bfloat16) -> Iterator[None]:
    """Within: the trace's CPU tensors are cast as ``torch.autocast("cuda", dtype)`` casts CUDA tensors."""
    saved = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        with torch.autocast("cpu", dtype=dtype), _CudaFp32Ops():
            yield
    finally:
        torch.set_autocast_enabled("cuda", saved[0])
        torch.set_autocast_dtype("cuda", saved[1])


def outputs_to_fp32(outputs: Any) -> Any:
    """accelerate's ``convert_outputs_to_fp32``: every half tensor in the outputs becomes an fp32 copy."""
    from collections.abc import MutableMapping

    if isinstance(outputs, torch.Tensor):
        return _to_fp32(outputs)
    if isinstance(outputs, MutableMapping):  # a ModelOutput is an OrderedDict; set each field on the same object
        for key in list(outputs.keys()):
            outputs[key] = outputs_to_fp32(outputs[key])
        return outputs
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(outputs_to_fp32(o) for o in outputs)
    return outputs
