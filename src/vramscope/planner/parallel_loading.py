"""Loading under each multi-GPU strategy: what one GPU holds from ``from_pretrained`` until the model is wrapped.

The single-GPU loading (:mod:`vramscope.planner.loading`, the ``load`` phase of :mod:`vramscope.planner.phases`)
is the unit: each strategy loads it whole on every rank, in the shards, or a GPU's own layers. What each does
(transformers 5.24, accelerate 1.15, peft 0.21, as installed here, and torch's FSDP):

A 4-bit or 8-bit base (bitsandbytes), every data-parallel strategy (DDP, ZeRO-2, ZeRO-3, FSDP, FSDP with its
parameters on the host):
    every rank loads the whole quantized model onto its own GPU, as one GPU would, and only then does the
    wrapper shard or offload it. ``Bnb4BitHfQuantizer.update_device_map`` makes a missing ``device_map``
    ``{"": torch.cuda.current_device()}`` (the rank's GPU); ``fsdp_cpu_ram_efficient_loading`` keeps a quantized
    model off the meta device (``PreTrainedModel._move_missing_keys_from_meta_to_device``: ``not is_quantized``),
    so every rank reads every weight; ZeRO-3's ``zero.Init`` is not used for a quantized model
    (``PreTrainedModel.get_init_context``: meta device and ``set_quantized_state`` instead). accelerate's FSDP2
    path says the same of 4-bit weights ("bypassing the move to meta will still cause the VRAM spike",
    ``fsdp2_prepare_model``). transformers 4 from 4.39 (PR #29587) quantized each weight on the GPU and moved it to
    the host under FSDP's efficient loading or ZeRO-3 (``_load_state_dict_into_meta_model``); 5.24's loader
    (``core_model_loading``) has no such step. The rank's loading is therefore the single-GPU one, moment for
    moment (``prepare_model_for_kbit_training`` too: the model is on the GPU when the script calls it), and
    under FSDP1 one moment more: wrapping a unit flattens its parameters into one new tensor beside them
    (``FlatParamHandle.flatten_tensors``: ``torch.cat``) before the shard is cut, while the rest of the model is
    still whole. FSDP2 and ZeRO-3 turn one parameter at a time into its shard: that parameter's shard beside it,
    not counted.
A 16-bit base under FSDP or ZeRO-3:
    not quantized, so it loads onto the host (no ``device_map``: ``core_model_loading`` places it on ``cpu``; or
    under ``zero.Init``, already partitioned), and the Trainer leaves it there (``place_model_on_device`` is
    False under FSDP and DeepSpeed). Wrapping brings one unit at a time to the GPU and shards it: the GPU holds
    its shards and that unit, flattened beside itself under FSDP (two units' bytes, for either FSDP version:
    errs high for FSDP2), gathered once under ZeRO-3 (one unit).
A 16-bit base under DDP or ZeRO-2:
    the whole model on each rank's GPU, as on one GPU.
``split`` (``device_map="auto"`` over the GPUs):
    each GPU loads its own layers (the loader's copies in flight are its own layers' largest), and
    ``prepare_model_for_kbit_training`` upcasts each GPU's own parameters where they are: each GPU's loading is the
    single-GPU loading of its share, the embeddings on the first GPU and lm_head on the last.

NCCL's buffers are not counted: the communicator is opened by the first collective, after loading (DDP's and
FSDP's broadcast of the module states come with the wrapping, whose own moment is counted above).

Pure arithmetic; nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vramscope.planner.frameworks import Framework
from vramscope.planner.loading import FLATTEN_MOMENT, kept_params, load_moments
from vramscope.planner.memory import Breakdown, Estimate
from vramscope.planner.phases import load_phase
from vramscope.planner.shapes import ModelShape
from vramscope.recipe import QLoraSpec

# The moment FSDP1's wrapping adds to a rank that loaded the whole model: one unit flattened beside itself.
WRAP_MOMENT = "wrapping, unit by unit"


@dataclass(frozen=True)
class RankLoading:
    """One GPU's loading: its most (``device_bytes``: allocated, and the CUDA context beside it, as the single-GPU
    ``load`` phase counts it) and the moment of that most."""

    device_bytes: int
    moment: str


def _most(moments: dict[str, Breakdown], context: int) -> tuple[int, str]:
    """The largest moment's allocated bytes plus the CUDA context, as :func:`~vramscope.planner.phases.load_phase`
    counts them (reserved as allocated: the loader's segment is sized to the weights)."""
    allocated = {k: bd.allocated() for k, bd in moments.items()}
    moment = max(allocated, key=lambda k: allocated[k])
    return allocated[moment] + context, moment


def whole_copy(shape: ModelShape, spec: QLoraSpec, est: Estimate, fw: Framework, *,
               flatten_unit: int = 0) -> RankLoading:
    """Every rank loads the whole model onto its own GPU: the single-GPU ``load`` phase, and with ``flatten_unit``
    FSDP1's wrapping of the first unit (the adapted model whole, one unit's flat copy beside it)."""
    one = load_phase(shape, spec, est, fw)
    best, moment = one.device_bytes, one.moment
    if flatten_unit:
        adapted = one.breakdowns["adapters"]
        wrap = adapted.allocated() + flatten_unit + est.breakdown.cuda_context
        if wrap > best:
            best, moment = wrap, FLATTEN_MOMENT
    return RankLoading(best, moment)


def from_host(sharded_params: int, unit: int, units_at_once: int, context: int) -> RankLoading:
    """A 16-bit model on the host, wrapped unit by unit: the GPU holds ``sharded_params`` (every unit's shard, the
    most it has before the first step) and ``units_at_once`` units' bytes of the one being wrapped."""
    return RankLoading(sharded_params + units_at_once * unit + context, WRAP_MOMENT)


def split_share(sub: ModelShape, spec: QLoraSpec, est: Estimate, fw: Framework, *, embedding_params: int,
                first: bool, last: bool, tied: bool) -> RankLoading:
    """One GPU of a split: the single-GPU loading of its share ``sub`` (a model of its own layers, the full
    vocabulary on the last GPU only), with the embeddings moved to the first GPU, as the step's split moves them:
    each moment's unquantized bytes per parameter carry them at that moment's dtype (bf16 as loaded, fp32 once
    ``prepare_model_for_kbit_training`` upcast them)."""
    kept = kept_params(sub)
    moments = {}
    for name, bd in load_moments(sub, spec, fw, est).items():
        per_param = bd.unquantized_params / kept if kept else 0.0
        moved = math.ceil(per_param * embedding_params)
        unq = bd.unquantized_params - (moved if last and not tied else 0) + (moved if first else 0)
        moments[name] = replace(bd, unquantized_params=unq)
    device, moment = _most(moments, est.breakdown.cuda_context)
    return RankLoading(device, moment)


def _from_host(spec: QLoraSpec, strategy: str) -> bool:
    """Whether ``strategy`` loads a model of ``spec``'s bits on the host and shards it from there."""
    return spec.bits not in (4, 8) and strategy in ("fsdp", "zero3")


def how(spec: QLoraSpec, strategy: str, name: str) -> str:
    """How ``strategy`` (called ``name``) loads a model of ``spec``'s bits, in words."""
    if strategy == "split":
        return "each GPU loads its own layers (device_map=auto), as one GPU loads a model that size"
    if _from_host(spec, strategy):
        where = "zero.Init partitions it as it is built" if strategy == "zero3" else "no device_map"
        return f"loads on the host ({where}), then {name} brings it to the GPU unit by unit and shards it"
    if strategy in ("fsdp", "zero3"):
        return (f"every rank loads the whole {spec.bits}-bit model onto its own GPU, then {name} shards it "
                "(transformers 5: bitsandbytes places a quantized model on the rank's GPU; "
                "cpu_ram_efficient_loading and zero.Init leave it out)")
    return "every rank loads a whole copy onto its own GPU"


def data_parallel(shape: ModelShape, spec: QLoraSpec, est: Estimate, fw: Framework, *, strategy: str,
                  fsdp_version: int, unit: int, sharded_params: int) -> RankLoading:
    """One rank of a data-parallel strategy (every rank alike), by the cases of the module's docstring.

    ``unit`` is one decoder layer's parameters gathered whole; ``sharded_params`` what the rank keeps of every
    parameter once wrapped (0 where they live on the host)."""
    if _from_host(spec, strategy):
        return from_host(sharded_params, unit, 2 if strategy == "fsdp" else 1, est.breakdown.cuda_context)
    return whole_copy(shape, spec, est, fw, flatten_unit=unit if strategy == "fsdp" and fsdp_version == 1 else 0)


__all__ = ["FLATTEN_MOMENT", "WRAP_MOMENT", "RankLoading", "data_parallel", "from_host", "how", "split_share",
           "whole_copy"]
