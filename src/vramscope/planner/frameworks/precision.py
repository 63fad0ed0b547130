"""The dtypes a framework's step makes (:class:`Precision`) and why each framework-set breakdown line is the
size it is (:func:`component_notes`): what the memory model (:mod:`vramscope.planner.memory`,
:mod:`vramscope.planner.layer`) reads of a framework. docs/planner.md lists the source lines each fact was
checked against (transformers 5.24, peft 0.21, trl 1.16, accelerate, torch).

Pure data: nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.planner.frameworks.record import Framework
from vramscope.planner.frameworks.registry import framework_for
from vramscope.recipe import QLoraSpec


@dataclass(frozen=True)
class Precision:
    """Bytes per element of the tensors a step makes, as a framework and recipe decide them.

    Attributes:
        stream: the residual stream, norm outputs and MLP activations (fp32 once embeddings are fp32).
        params: embeddings, norms, lm_head and biases (the parameters that are not quantized).
        lora_param: LoRA weights and their gradients.
        lora_compute: LoRA's matmul inputs and outputs (what lora_A and lora_B save): the adapter dtype, or the
            autocast dtype under autocast.
        attention: q, k, v as SDPA sees them (autocast casts them to half).
        autocast_copies: autocast keeps half copies of fp32 weights that a matmul reads (LoRA weights in its
            cache for the forward; lm_head for its backward).
        compute: bitsandbytes' compute dtype: what a 4-bit weight is dequantized to and its matmul's input
            and gradient are cast to (``bnb_4bit_compute_dtype``; trl.scripts.sft passes its ``--dtype``, fp32
            by default).
        autocast: the forward runs under half autocast (an fp32 compute dtype then costs a half copy more).
    """

    stream: int
    params: int
    lora_param: int
    lora_compute: int
    attention: int
    autocast_copies: bool
    compute: int = 2
    autocast: bool = False


def precision(spec: QLoraSpec, fw: Framework | None = None) -> Precision:
    """The dtypes of a step of ``spec`` under ``fw`` (default: the framework the recipe names)."""
    fw = fw or framework_for(spec)
    half = 2  # bf16 and fp16
    compute = 4 if spec.compute_dtype == "fp32" else half
    quantized = spec.bits in (4, 8)
    upcast = quantized and fw.prepares_kbit
    # The model loads in the compute dtype (transformers' dtype=..., TRL's --dtype); kbit preparation upcasts.
    params = 4 if upcast else compute
    stream = params
    lora_param = half if (fw.adapters_half and quantized) else 4
    lora_compute = half if (fw.autocast or lora_param == half) else lora_param
    attention = half if fw.autocast else stream
    return Precision(stream=stream, params=params, lora_param=lora_param, lora_compute=lora_compute,
                     attention=attention, autocast_copies=fw.autocast and (lora_param == 4 or params == 4),
                     compute=compute, autocast=fw.autocast)


def component_notes(spec: QLoraSpec, fw: Framework | None = None) -> dict[str, str]:
    """For each breakdown line whose size the framework decides, why (one short phrase)."""
    fw = fw or framework_for(spec)
    pr = precision(spec, fw)
    dtype = {4: "fp32", 2: spec.compute_dtype if spec.compute_dtype != "fp32" else "bf16"}
    notes: dict[str, str] = {}
    if spec.bits in (4, 8):
        notes["unquantized_params"] = (f"{dtype[pr.params]}: prepare_model_for_kbit_training upcasts them"
                                       if fw.prepares_kbit else f"{dtype[pr.params]}: {fw.name} does not upcast them")
    lora_why = "TRL casts the adapters" if pr.lora_param == 2 else "peft's autocast_adapter_dtype"
    notes["lora_weights"] = f"{dtype[pr.lora_param]} ({lora_why})"
    notes["lora_gradients"] = notes["lora_weights"]
    stream = f"{dtype[pr.stream]} residual stream"
    if fw.autocast:
        attn = "half LoRA inputs and SDPA inputs under autocast (flash, linear in tokens)"
    elif pr.attention == 4:
        attn = "fp32 SDPA inputs (mem-efficient kernel; math kernel, S x S scores, for GQA)"
    else:
        attn = "half SDPA inputs (flash)"
    notes["activations"] = f"{stream}, {attn}"
    notes["logits_and_loss"] = {
        "dropped": "full logits; the model output is dropped before backward"
                   + (" (half logits under autocast, fp32 copies for the loss and the output)" if fw.autocast else ""),
        "kept": "full fp32 logits and log-softmax",
        "chunked": "TRL's fused LM head: tiles of 4096 tokens x 32768 vocabulary, no full logits",
        "score": "a scalar score head (reward model): no vocabulary-sized logits",
    }[fw.logits]
    if fw.logits == "kept":
        notes["kept_output"] = ("the loop's `out` (logits" + (", KV cache" if not spec.gradient_checkpointing
                                                               and fw.keeps_kv_cache else "")
                                + ") lives until the next forward returns")
    return notes
