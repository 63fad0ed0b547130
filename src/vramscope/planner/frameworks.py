"""What each training framework keeps and casts during a QLoRA step.

The same model and shapes take different memory under different training programs, because the program
decides the dtypes (peft's ``prepare_model_for_kbit_training``, autocast, TRL's adapter cast), how the loss
meets the logits (dropped before backward, kept by the caller, or never materialised) and what the output
keeps alive (a KV cache). :func:`framework_for` turns a recipe into those facts; the memory model
(:mod:`vramscope.planner.memory`, :mod:`vramscope.planner.layer`) reads only them. docs/planner.md lists
the source lines each fact was checked against (transformers 5.24, peft 0.21, trl 1.16, accelerate, torch).

Pure data: nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from vramscope.planner.errors import PlanInputError
from vramscope.recipe import FRAMEWORKS, QLoraSpec

# TRL's fused LM head (trl/kernels/chunked_logprob.py) projects TOKEN_TILE tokens x VOCAB_TILE vocabulary
# entries at a time into one reused buffer in the compute dtype, in forward and again in backward.
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# Unsloth offloads checkpoints only for runs of at least this many tokens (below it, ordinary checkpointing).
OFFLOAD_MIN_SEQ = 512

# The breakdown lines whose size depends on the framework (``Plan.framework_components``).
FRAMEWORK_COMPONENTS = ("unquantized_params", "lora_weights", "lora_gradients", "activations", "logits_and_loss",
                        "temporaries")


@dataclass(frozen=True)
class Framework:
    """One training program's memory-relevant behaviour.

    Attributes:
        name: ``hf``, ``trl``, ``qlora`` (qlora.py with --bf16), ``unsloth``, ``loop`` or ``loop-loss``.
        title: one line for people.
        prepares_kbit: calls ``prepare_model_for_kbit_training``: every bf16/fp16 parameter that is not
            4-bit (embeddings, norms, lm_head) becomes fp32, so the residual stream is fp32.
        autocast: the forward runs under bf16/fp16 autocast (HF Trainer with ``bf16=True`` through accelerate's
            mixed precision), so every matmul and SDPA sees half-precision inputs (copies of fp32 tensors).
        adapters_half: LoRA weights (and their gradients) are cast to the compute dtype (TRL does for quantized
            models); otherwise peft's ``autocast_adapter_dtype`` keeps them fp32.
        logits: ``dropped`` (the model's output is released before backward: HF Trainer's compute_loss),
            ``kept`` (the caller holds ``out`` with its logits through backward and the next forward), or
            ``chunked`` (TRL's fused LM head: per-token log-probabilities, entropy and top-1 from tiles, never
            the batch x sequence x vocabulary logits), or ``score`` (a reward model's Linear(h, 1) head).
        keeps_kv_cache: with checkpointing off the model builds a DynamicCache (``use_cache`` stays on in train
            mode) and the kept output holds it; TRL and HF Trainer's loss path pass ``use_cache=False`` or drop it.
        reentrant: reentrant gradient checkpointing (peft's own ``gradient_checkpointing_enable({})`` leaves
            torch's default) rather than the non-reentrant kind HF Trainer enables.
        fragmentation: reserved-but-unallocated bytes at the peak per byte of (one layer's saved activations,
            the materialised logits), with and without checkpointing. The caching allocator's splitting is not
            derived; these are fitted to this framework's H200 points (``fit_framework_constants`` in
            bench/planner_accuracy.py reproduces them) and used unless ``Hardware.fragmentation`` is given.
        offloads_checkpoints: with gradient checkpointing on, each layer's input (the checkpoint) is copied to
            pinned host memory as the forward leaves the layer and copied back for its backward (Unsloth's
            ``use_gradient_checkpointing="unsloth"``), from :data:`OFFLOAD_MIN_SEQ` tokens on.
        cuda_context_bytes: the process's GPU memory outside torch's allocator (CUDA context, kernels, cuBLAS
            handles; TRL's and accelerate's extra kernels): the largest NVML process - peak reserved seen on the
            H200 for this framework; used unless ``Hardware.cuda_context_bytes`` is given.
    """

    name: str
    title: str
    prepares_kbit: bool
    autocast: bool
    adapters_half: bool
    logits: str
    keeps_kv_cache: bool
    reentrant: bool
    fragmentation: tuple[float, float, float, float] = (0.615, 0.269, 1.037, 0.026)
    cuda_context_bytes: int = 745 * 1024**2
    offloads_checkpoints: bool = False


FRAMEWORK_TABLE: dict[str, Framework] = {
    "hf": Framework(
        name="hf", title="HF Trainer + prepare_model_for_kbit_training (the qlora.py recipe), bf16 autocast",
        prepares_kbit=True, autocast=True, adapters_half=False, logits="dropped", keeps_kv_cache=False,
        reentrant=False, fragmentation=(1.718, 0.442, 1.907, 0.468), cuda_context_bytes=758 * 1024**2),
    "trl": Framework(
        name="trl", title="TRL SFTTrainer defaults (no kbit preparation, bf16 LoRA, fused chunked LM head)",
        prepares_kbit=False, autocast=True, adapters_half=True, logits="chunked", keeps_kv_cache=False,
        reentrant=False, fragmentation=(0.808, 0.0, 1.411, 0.0), cuda_context_bytes=758 * 1024**2),
    # qlora.py (artidoro/qlora, get_accelerate_model): prepare_model_for_kbit_training upcasts to fp32, then with
    # --bf16 it casts every LoraLayer, embed_tokens and lm_head back to bf16 (norms stay fp32); Seq2SeqTrainer is
    # HF Trainer, so autocast, the dropped output and HF Trainer's allocator behaviour are hf's.
    "qlora": Framework(
        name="qlora", title="qlora.py --bf16 (HF Trainer; LoRA, embeddings and lm_head cast back to bf16 after "
        "prepare_model_for_kbit_training)", prepares_kbit=False, autocast=True, adapters_half=True,
        logits="dropped", keeps_kv_cache=False, reentrant=False, fragmentation=(1.718, 0.442, 1.907, 0.468),
        cuda_context_bytes=758 * 1024**2),
    # Unsloth: TRL's trainers (dtypes, fused head, allocator behaviour: trl's) under Unsloth's patches, whose
    # use_gradient_checkpointing="unsloth" keeps the checkpoints on the host. Not measured (docs/planner.md).
    "unsloth": Framework(
        name="unsloth", title="Unsloth (TRL's trainer; checkpoints offloaded to pinned host memory)",
        prepares_kbit=False, autocast=True, adapters_half=True, logits="chunked", keeps_kv_cache=False,
        reentrant=False, fragmentation=(0.808, 0.0, 1.411, 0.0), cuda_context_bytes=758 * 1024**2,
        offloads_checkpoints=True),
    "loop": Framework(
        name="loop", title="hand-written loop keeping `out` (prepare_model_for_kbit_training, no autocast)",
        prepares_kbit=True, autocast=False, adapters_half=False, logits="kept", keeps_kv_cache=True,
        reentrant=True, fragmentation=(1.042, 0.233, 2.688, 0.129), cuda_context_bytes=744 * 1024**2),
    "loop-loss": Framework(
        name="loop-loss", title="hand-written loop keeping only `loss` (prepare_model_for_kbit_training, no "
        "autocast)", prepares_kbit=True, autocast=False, adapters_half=False, logits="dropped", keeps_kv_cache=False,
        reentrant=True, fragmentation=(0.615, 0.269, 1.037, 0.026), cuda_context_bytes=745 * 1024**2),
}
assert tuple(FRAMEWORK_TABLE) == FRAMEWORKS


def framework_for(spec: QLoraSpec) -> Framework:
    """The :class:`Framework` a recipe names.

    Raises:
        PlanInputError: a framework name the planner does not know.
    """
    try:
        return FRAMEWORK_TABLE[spec.framework]
    except KeyError:
        raise PlanInputError(f"unknown framework {spec.framework!r}; choose one of {', '.join(FRAMEWORKS)}") from None


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


# vramscope's own measurement step (bench/planner_measure.py, integrations.qlora, the DDP bench): a loop that
# keeps only the loss; the 60-point grid it measured is scored with it.
HARNESS = FRAMEWORK_TABLE["loop-loss"]


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
