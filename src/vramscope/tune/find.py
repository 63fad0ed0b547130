"""The tuner's two entry points: the largest batch, or the longest sequence, whose training step fits.

Each wraps the caller's step into trials (:mod:`vramscope.tune.trials`), measures on a probe (default the CUDA
device: :class:`~vramscope.tune.cuda.CudaProbe`) and runs the pure search (:func:`vramscope.tune.search.search`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from vramscope.planner.batching import split_batch
from vramscope.tune.cuda import CudaProbe
from vramscope.tune.search import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_TRIALS,
    MemoryProbe,
    Trial,
    TuneResult,
    check_bounds,
    search,
)
from vramscope.tune.trials import Restorer, make_trial_runner


def find_max_batch_size(
    step_fn: Callable[[int], Any],
    *,
    start: int = 1,
    max_batch: int = DEFAULT_MAX_BATCH,
    margin: float = 0.05,
    target_batch: int | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
    restore: Sequence[Any] = (),
    probe: MemoryProbe | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """The largest batch whose training step fits, found with a few real steps.

    ``step_fn(batch_size)`` runs one full training step (forward, backward, optimizer step, zero_grad)
    at that batch size; the tuner calls it at most ``max_trials`` times (three in the usual case).
    The model and optimizer that ``step_fn`` uses either belong to the search alone (build them inside
    ``step_fn``'s closure and drop them afterwards) or are passed in ``restore``: their trainable
    parameters and state are copied to host memory first and put back at the end, so the search leaves
    training where it was. Memory is released (``gc.collect``, ``torch.cuda.empty_cache``) before and
    after every trial; grads of ``restore`` modules are dropped after a failed one.

    Args:
        step_fn: runs one training step at the given batch size.
        start: the first (small) batch size to measure.
        max_batch: never try more than this.
        margin: fraction of the capacity to keep free at the step's peak reserve (longer batches
            later; the allocator's fragmentation is measured, not guessed). 0 finds the raw limit.
        target_batch: the effective batch you want; the result then carries ``micro_batch`` and
            ``grad_accum_steps``.
        max_trials: real steps at most.
        restore: modules / optimizers (anything with ``state_dict``) to restore afterwards.
        probe: the device to measure; default :class:`CudaProbe` on the current CUDA device.
        on_trial: called after each trial (progress output).

    Returns:
        A :class:`TuneResult`: ``batch_size``, the margin kept, every trial, and the accumulation split.

    Raises:
        NoSizeFitsError: even batch size 1 runs out of memory.
        ValueError: bad arguments.
        Any non-OOM exception from ``step_fn``, after restoring.
    """
    if target_batch is not None and target_batch < 1:
        raise ValueError(f"target_batch must be at least 1, got {target_batch}")
    check_bounds(start=start, max_size=max_batch, margin=margin, max_trials=max_trials)
    probe = probe if probe is not None else CudaProbe()
    restorer = Restorer(restore) if restore else None
    try:
        result = search(
            make_trial_runner(step_fn, probe, restorer, on_trial),
            probe.capacity_bytes(),
            start=start,
            max_size=max_batch,
            margin=margin,
            max_trials=max_trials,
        )
    finally:
        if restorer is not None:
            restorer.restore()
        probe.release()
    if target_batch is not None:
        micro, steps = split_batch(target_batch, result.size)
        result = replace(result, target_batch=target_batch, micro_batch=micro, grad_accum_steps=steps)
    return result


def find_max_seq_len(
    step_fn: Callable[[int], Any],
    *,
    start: int = 256,
    max_len: int = 131072,
    multiple_of: int = 64,
    margin: float = 0.05,
    quadratic: bool = False,
    max_trials: int = DEFAULT_MAX_TRIALS,
    restore: Sequence[Any] = (),
    probe: MemoryProbe | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """The longest sequence length whose training step fits at a fixed batch size.

    ``step_fn(seq_len)`` runs one training step at that length. Lengths are multiples of
    ``multiple_of``. Memory grows linearly with length with fused attention (sdpa, flash-attention);
    pass ``quadratic=True`` for eager attention, whose scores are seq x seq. Otherwise as
    :func:`find_max_batch_size`.
    """
    if multiple_of < 1:
        raise ValueError(f"multiple_of must be at least 1, got {multiple_of}")
    if start < multiple_of:
        raise ValueError(f"start ({start}) must be at least multiple_of ({multiple_of})")
    if max_len < start:
        raise ValueError(f"max_len ({max_len}) must be at least start ({start})")
    probe = probe if probe is not None else CudaProbe()
    restorer = Restorer(restore) if restore else None

    def step_units(units: int) -> Any:
        return step_fn(units * multiple_of)

    def on_unit_trial(trial: Trial) -> None:
        if on_trial is not None:
            on_trial(_scaled(trial, multiple_of))

    try:
        result = search(
            make_trial_runner(step_units, probe, restorer, on_unit_trial),
            probe.capacity_bytes(),
            start=start // multiple_of,
            max_size=max_len // multiple_of,
            margin=margin,
            max_trials=max_trials,
            degree=2 if quadratic else 1,
            scale=multiple_of,
        )
    finally:
        if restorer is not None:
            restorer.restore()
        probe.release()
    m = multiple_of
    per_unit = None if result.bytes_per_unit is None else result.bytes_per_unit / (m ** (2 if quadratic else 1))
    return replace(
        result,
        size=result.size * m,
        limit_size=result.limit_size * m,
        predicted_max=None if result.predicted_max is None else result.predicted_max * m,
        bytes_per_unit=per_unit,
        trials=tuple(_scaled(t, m) for t in result.trials),
        unit="seq_len",
    )


def _scaled(trial: Trial, factor: int) -> Trial:
    return replace(trial, size=trial.size * factor)
