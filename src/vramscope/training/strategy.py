"""Which way a run is spread over its GPUs, as the monitor sees it at train begin.

Read from, in this order: the model's wrapping (FSDP1 ``FullyShardedDataParallel``, FSDP2 ``fully_shard``,
``DistributedDataParallel``, a DeepSpeed engine and its ZeRO stage); the HF ``TrainingArguments``
(``fsdp``, ``deepspeed``); accelerate's environment (``ACCELERATE_USE_FSDP``, ``ACCELERATE_USE_DEEPSPEED``,
``ACCELERATE_DEEPSPEED_ZERO_STAGE``); and the process group (more than one rank and nothing else: DDP, which
is what the Trainer and ``accelerate`` run then). The answer is a :class:`~vramscope.types.RunStrategy`, the
format of the step log's sidecar (``<log>.strategy.json``: :data:`vramscope.output.names.STRATEGY_SUFFIX`), which
``vramscope report`` reads.
"""

from __future__ import annotations

import json
import os
from typing import Any

from vramscope.types import RunStrategy


def _process_group() -> tuple[int, str | None]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size()), str(dist.get_backend())
    except Exception:  # a broken or half-initialised group: not ours to diagnose
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1), None


def _from_model(model: Any) -> tuple[str, str] | None:
    modules = getattr(model, "modules", None)
    if modules is None:
        return None
    engine_stage = getattr(model, "zero_optimization_stage", None)
    if callable(engine_stage):  # a DeepSpeedEngine
        stage = int(engine_stage())
        return (f"zero{stage}" if stage else "ddp"), f"DeepSpeed ZeRO-{stage}"
    try:
        for module in modules():
            names = [cls.__name__ for cls in type(module).__mro__]
            if "FullyShardedDataParallel" in names:
                strategy = getattr(getattr(module, "sharding_strategy", None), "name", "FULL_SHARD")
                return ("ddp" if strategy == "NO_SHARD" else "zero2" if strategy == "SHARD_GRAD_OP" else "fsdp",
                        f"FSDP1 {strategy}")
            if "FSDPModule" in names:
                return "fsdp", "FSDP2 fully_shard"
            if "DistributedDataParallel" in names:
                return "ddp", "DistributedDataParallel"
    except Exception:
        return None
    return None


def _deepspeed_stage(config: Any) -> int | None:
    if isinstance(config, str) and config.endswith(".json"):
        try:
            with open(config, encoding="utf-8") as handle:
                config = json.load(handle)
        except (OSError, ValueError):
            return None
    if isinstance(config, dict):
        stage = (config.get("zero_optimization") or {}).get("stage")
        return int(stage) if isinstance(stage, int) else None
    return None


def _from_args(args: Any) -> tuple[str, str] | None:
    if args is None:
        return None
    fsdp = getattr(args, "fsdp", None)
    options = fsdp if isinstance(fsdp, (list, tuple)) else str(fsdp or "").split()
    options = [str(getattr(o, "value", o)) for o in options]
    if options:
        if "shard_grad_op" in options:
            return "zero2", "FSDP SHARD_GRAD_OP (TrainingArguments)"
        return "fsdp", f"FSDP {' '.join(options)} (TrainingArguments)"
    ds = getattr(args, "deepspeed", None)
    if ds:
        hf = getattr(args, "hf_deepspeed_config", None)
        stage = _deepspeed_stage(getattr(hf, "config", None)) if hf is not None else None
        stage = stage if stage is not None else _deepspeed_stage(ds)
        return (f"zero{stage}" if stage else "zero"), f"DeepSpeed ZeRO-{stage if stage is not None else '?'}"
    return None


def _from_environment() -> tuple[str, str] | None:
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        return "fsdp", "FSDP (accelerate config)"
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
        return (f"zero{stage}" if stage.isdigit() else "zero"), f"DeepSpeed ZeRO-{stage or '?'} (accelerate config)"
    return None


def detect_strategy(model: Any = None, args: Any = None) -> RunStrategy:
    """The running job's strategy (``fsdp``, ``zero2``, ``zero3``, ``ddp``, ``single``), its implementation, world
    size, backend and where it was read. Never raises."""
    world, backend = _process_group()
    found, source = None, None
    for name, probe in (("model wrapping", lambda: _from_model(model)), ("TrainingArguments", lambda: _from_args(args)),
                        ("accelerate environment", _from_environment)):
        try:
            found = probe()
        except Exception:
            found = None
        if found is not None:
            source = name
            break
    if found is None:
        found, source = (("ddp", "DistributedDataParallel (assumed)") if world > 1 else ("single", "one process"),
                         "process group")
    return RunStrategy(found[0], found[1], world, backend, source)


__all__ = ["detect_strategy"]
