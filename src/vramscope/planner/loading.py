"""Loading as a phase: what the GPU holds from ``from_pretrained`` to the first step, moment by moment.

A run can die before it trains: transformers 5's loader holds a 16-bit source beside each quantized target
(twice a fused expert stack while it stacks the per-expert weights), peft's ``prepare_model_for_kbit_training``
holds each bf16 parameter beside its fp32 copy, and qlora.py casts the embedding back to bf16 while every fp32
tensor is still alive. Each moment here is one of those, as a :class:`~vramscope.planner.memory.Breakdown`;
:mod:`vramscope.planner.phases` makes them the ``load`` phase. Checked against the step log's start row of 40
fresh H200 runs (bench/results/whole-run/points.json, phase ``load``).

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from vramscope.planner.frameworks import Framework
from vramscope.planner.memory import Breakdown, Estimate, loading_transient_bytes, upcast_transient_bytes
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

# Loading's moments as a sentence says them ("loading sets it, once the adapters are added"); the moment itself,
# as plan --json gives it, stays its name. Any other moment reads "at <moment>".
FLATTEN_MOMENT = "FSDP flattens a unit"  # FSDP1's wrapping of a rank that loaded the whole model
_MOMENT_WORDS = {"adapters": "once the adapters are added", FLATTEN_MOMENT: "as FSDP flattens a unit"}


def at_moment(moment: str) -> str:
    """``moment`` (a phase's, loading's included) as the end of a sentence: "at from_pretrained", "once the adapters
    are added"."""
    return _MOMENT_WORDS.get(moment, f"at {moment}")


def kept_params(shape: ModelShape) -> int:
    """The parameters bitsandbytes leaves unquantized: embeddings, lm_head, norms, biases and fused experts."""
    return shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params + shape.expert_params


def load_moments(shape: ModelShape, spec: QLoraSpec, fw: Framework, step: Estimate) -> dict[str, Breakdown]:
    """The loading's moments, each with what is alive then (``step``: the training step's estimate, whose
    optimizer-step breakdown holds the weights and adapters as training has them)."""
    final = step.phase_breakdowns["optimizer step"]
    weights = Breakdown(quantized_weights=final.quantized_weights,
                        quantization_constants=final.quantization_constants)
    kept = kept_params(shape)
    load_dtype = 4 if spec.compute_dtype == "fp32" else 2  # TRL's --dtype, the recipe's torch_dtype
    moments = {
        # the loader's worst target, every earlier one loaded (memory.loading_transient_bytes)
        "from_pretrained": replace(weights, unquantized_params=load_dtype * kept,
                                   temporaries=loading_transient_bytes(shape, spec)),
    }
    quantized = spec.bits in (4, 8)
    if quantized and (fw.prepares_kbit or fw.build.casts_back):
        # prepare_model_for_kbit_training, before get_peft_model: each parameter's bf16 original beside its copy
        moments["prepare_model_for_kbit_training"] = replace(
            weights, unquantized_params=4 * kept, temporaries=upcast_transient_bytes(shape))
    if quantized and fw.build.casts_back:
        # qlora.py's cast loop after get_peft_model walks named_modules(): its first hit, embed_tokens, gets its
        # bf16 copy while the fp32 original, every other fp32 tensor and the fp32 adapters are alive (only under
        # --bf16: memory.validate_spec refuses such a framework with another compute dtype)
        moments["cast back to bf16"] = replace(weights, unquantized_params=4 * kept,
                                               lora_weights=4 * step.trainable_params,
                                               temporaries=2 * shape.embedding_params)
    moments["adapters"] = replace(weights, unquantized_params=final.unquantized_params,
                                  lora_weights=final.lora_weights)
    return moments
