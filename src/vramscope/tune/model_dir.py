"""Tune a Hugging Face model folder: build the model and its training step as the recipe says, then search.

The step is a real QLoRA/LoRA training step over random tokens (memory depends on shapes, not values), built by
:func:`vramscope.tune.qlora.build_trainer`; the search is :func:`vramscope.tune.find.find_max_batch_size`
or, for the longest sequence at a fixed batch, :func:`~vramscope.tune.find.find_max_seq_len`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vramscope.recipe import QLoraSpec
from vramscope.tune.cuda import CudaProbe
from vramscope.tune.find import find_max_batch_size, find_max_seq_len
from vramscope.tune.search import DEFAULT_MAX_BATCH, DEFAULT_MAX_TRIALS, Trial, TuneResult

# The longest sequence tried when the config names no max_position_embeddings.
FALLBACK_MAX_LEN = 131072


class ModelLoadError(Exception):
    """The model folder could not be loaded (missing library, unreadable weights); the message says which."""


@dataclass(frozen=True)
class ModelDirSearch:
    """What to search for one model folder.

    Attributes:
        model_dir: a Hugging Face model folder (config.json and weights).
        spec: the recipe the model is loaded and trained with.
        config: the folder's config.json, already read (for its max_position_embeddings).
        seq_len: tokens per sequence for the batch search; the first length for the sequence search.
        max_seq_len: search the longest sequence at ``batch_size`` instead of the largest batch.
    """

    model_dir: str
    spec: QLoraSpec
    config: Mapping[str, Any]
    seq_len: int | None
    device: int = 0
    max_seq_len: bool = False
    batch_size: int = 1
    start: int = 1
    max_batch: int = DEFAULT_MAX_BATCH
    max_len: int | None = None
    multiple_of: int = 64
    margin: float = 0.05
    target_batch: int | None = None
    max_trials: int = DEFAULT_MAX_TRIALS
    memory_limit_bytes: int | None = None


def tune_model_dir(request: ModelDirSearch, on_trial: Callable[[Trial], None] | None = None) -> TuneResult:
    """Load ``request.model_dir`` on its CUDA device (see :func:`vramscope.tune.cuda.claim_device`) and search.

    Raises:
        ModelLoadError: the folder cannot be loaded.
        vramscope.tune.search.NoSizeFitsError: even the smallest size runs out of memory.
    """
    try:
        from vramscope.tune.qlora import build_trainer

        trainer = build_trainer(request.model_dir, request.spec, device=f"cuda:{request.device}")
    except ImportError as exc:
        raise ModelLoadError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {request.model_dir}: {exc}") from None

    def step(batch: int, seq: int) -> None:
        # zero_grad first: a step that ran out of memory in backward left partial gradients behind.
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.step(batch, seq)

    probe = CudaProbe(device=request.device, limit_bytes=request.memory_limit_bytes)
    if request.max_seq_len:
        max_len = request.max_len or int(request.config.get("max_position_embeddings") or FALLBACK_MAX_LEN)
        return find_max_seq_len(
            lambda s: step(request.batch_size, s),
            start=request.seq_len or 256,
            max_len=max_len,
            multiple_of=request.multiple_of,
            margin=request.margin,
            quadratic=request.spec.attn == "eager",
            max_trials=request.max_trials,
            probe=probe,
            on_trial=on_trial,
        )
    seq_len = request.seq_len
    if seq_len is None:
        raise ValueError("the batch search needs a seq_len")
    return find_max_batch_size(
        lambda b: step(b, seq_len),
        start=request.start,
        max_batch=request.max_batch,
        margin=request.margin,
        target_batch=request.target_batch,
        max_trials=request.max_trials,
        probe=probe,
        on_trial=on_trial,
    )
