"""The one set of names people read for the planner's breakdown components (plan, plan --gpus, plan --trace)."""

from __future__ import annotations

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
