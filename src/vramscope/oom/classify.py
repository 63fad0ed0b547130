"""Which exceptions are GPU out-of-memory errors, and of which kind.

Imports nothing of vramscope (the tuner and the training monitor use it too) and never imports torch.
"""

from __future__ import annotations

# (substring of the error message, kind). Exact texts as PyTorch and the NVIDIA libraries print them:
# torch's caching allocator raises torch.OutOfMemoryError("CUDA out of memory. Tried to allocate ...");
# TORCH_CUDABLAS_CHECK prints "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`";
# AT_CUDNN_CHECK prints "cuDNN error: " + cudnnGetErrorString(status), which is CUDNN_STATUS_ALLOC_FAILED
# up to cuDNN 8 and CUDNN_STATUS_INTERNAL_ERROR_{DEVICE,HOST}_ALLOCATION_FAILED from cuDNN 9; a raw
# cudaMalloc failure outside the allocator prints cudaGetErrorString's "out of memory".
_OOM_MESSAGES: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "cuda_allocator"),
    ("HIP out of memory", "cuda_allocator"),
    ("CUBLAS_STATUS_ALLOC_FAILED", "cublas"),
    ("CUBLASLT_STATUS_ALLOC_FAILED", "cublas"),
    ("CUDNN_STATUS_ALLOC_FAILED", "cudnn"),
    ("CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "cudnn"),
    ("CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED", "cudnn"),
    # cuDNN's answer when no algorithm's workspace fits; accelerate and Lightning count it as an OOM
    # too, so the tuner behaves like them here.
    ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input", "cudnn"),
    ("CUSOLVER_STATUS_ALLOC_FAILED", "cusolver"),
    ("CUFFT_ALLOC_FAILED", "cufft"),
    ("CUDA error: out of memory", "cuda_runtime"),
)

OOM_KINDS = ("cuda_allocator", "cublas", "cudnn", "cusolver", "cufft", "cuda_runtime")


def oom_kind(exc: BaseException) -> str | None:
    """Which kind of GPU out-of-memory ``exc`` is, or None when it is not one.

    ``torch.OutOfMemoryError`` is recognised by type (without importing torch); the library
    failures by their exact status names, so an unrelated ``RuntimeError`` that merely contains the
    words "out of memory" is not mistaken for one.
    """
    if any(cls.__name__ == "OutOfMemoryError" and cls.__module__.startswith("torch") for cls in type(exc).__mro__):
        return "cuda_allocator"
    if not isinstance(exc, RuntimeError):
        return None
    message = str(exc)
    for needle, kind in _OOM_MESSAGES:
        if needle in message:
            return kind
    return None


def is_oom(exc: BaseException) -> bool:
    """True when ``exc`` is any form of GPU out-of-memory (see :func:`oom_kind`)."""
    return oom_kind(exc) is not None
