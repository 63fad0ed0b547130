"""The one set of names people read for the planner's breakdown components (plan, plan --gpus, plan --trace)."""

from __future__ import annotations

from typing import Protocol

from vramscope.units import gib

BREAKDOWN_LABELS = {
    "quantized_weights": "quantized weights",
    "quantization_constants": "  + quantization constants",
    "unquantized_params": "unquantized params",
    "lora_weights": "LoRA weights",
    "lora_gradients": "LoRA gradients",
    "optimizer_states": "optimizer states (torch)",
    "optimizer_states_paged": "optimizer states (paged, unified memory)",
    "activations": "activations",
    "logits_and_loss": "logits and cross-entropy",
    "temporaries": "temporaries",
    "cublas_workspaces": "cuBLAS workspaces",
    "calibration": "calibration",
    "kept_output": "kept model output (previous/current `out`)",
    "kv_cache": "KV cache (generation)",
    "eval_predictions": "eval predictions gathered on the GPU",
    "gathered_params": "gathered for compute (whole units)",
    "comm_buffers": "gradient buckets / reduce buffers",
    "allocator_overhead": "allocator overhead (reserved - allocated)",
    "cuda_context": "CUDA context and kernels",
    "nccl_buffers": "NCCL buffers (outside the allocator)",
}


def breakdown_labels(bits: int, dtype: str, moe: bool = False) -> dict[str, str]:
    """:data:`BREAKDOWN_LABELS` for a plan of ``bits``-bit weights loaded in ``dtype``: its weight lines say what
    they hold. A 16-bit plan has no "quantized" weights; an MoE model's fused experts are the bulk of what
    bitsandbytes leaves unquantized (the plan appends their dtype: "experts unquantized (fp32)")."""
    out = dict(BREAKDOWN_LABELS)
    if bits == 16:
        out["quantized_weights"] = f"weights ({dtype})"
        out["unquantized_params"] = f"embeddings, lm_head, norms{', experts' if moe else ''} ({dtype})"
        return out
    out["quantized_weights"] = f"{bits}-bit weights"
    if moe:
        out["unquantized_params"] = "experts unquantized"
    return out


class Totals(Protocol):
    """The three figures every plan ends with: a one-GPU plan, a traced step, one GPU of a distributed run."""

    @property
    def peak_allocated_bytes(self) -> int: ...
    @property
    def peak_reserved_bytes(self) -> int: ...
    @property
    def process_bytes(self) -> int: ...


def totals_lines(p: Totals) -> list[str]:
    """The totals block, each figure named by what measures it (``plan``, ``plan --gpus``, ``plan --trace``)."""
    return [f"  peak allocated (torch.cuda.max_memory_allocated) {gib(p.peak_allocated_bytes):>11}",
            f"  peak reserved  (torch.cuda.max_memory_reserved)  {gib(p.peak_reserved_bytes):>11}",
            f"  process memory (nvidia-smi)                      {gib(p.process_bytes):>11}"]
