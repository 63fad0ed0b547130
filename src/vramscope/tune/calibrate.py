"""``vramscope plan --calibrate``: measure a few tiny real steps on this GPU and fit the model to them.

The analytic model is exact for the library versions it was built against; on another stack (a newer torch
kernel, another bitsandbytes) its per-token terms can drift. Calibration loads the actual architecture as the
recipe's framework does (random weights, :mod:`vramscope.tune.qlora`: HF Trainer's bf16 autocast, TRL's
bf16 adapters and fused LM head, or a loop that keeps its output), runs two of that framework's steps at each of
three small shapes while reading ``torch.cuda.max_memory_allocated``, and fits

    measured peak - measured static = scale x (model's step memory) + offset

by least squares, where the static part (weights, adapters, optimizer states) is measured after loading. NVML,
when present, gives the CUDA context. The fit becomes a :class:`~vramscope.planner.memory.Hardware` that
:func:`~vramscope.planner.plan` applies to any larger shape.

It lives with the tuner, not in the pure planner: it imports torch (lazily, inside the functions that measure).
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vramscope.planner.api import ModelRef, resolve_model
from vramscope.planner.frameworks import framework_for
from vramscope.planner.memory import Breakdown, Hardware, estimate
from vramscope.planner.registry import get_config
from vramscope.recipe import QLoraSpec
from vramscope.units import MIB

DEFAULT_SHAPES: tuple[tuple[int, int], ...] = ((1, 128), (2, 128), (2, 256))


class CalibrationError(Exception):
    """Calibration cannot run here (no GPU, missing libraries) or its measurements do not fit."""


@dataclass(frozen=True)
class Point:
    """One measured shape: peak allocated over its steps, and the analytic model's step memory for it."""

    batch: int
    seq: int
    peak_allocated: int
    model_dynamic: int


def _static(bd: Breakdown) -> int:
    return (bd.quantized_weights + bd.quantization_constants + bd.unquantized_params + bd.lora_weights
            + bd.optimizer_states + bd.cublas_workspaces)


def fit(points: Sequence[Point], measured_static: int, predicted_static: int, base: Hardware | None = None,
        cuda_context_bytes: int | None = None) -> Hardware:
    """Least-squares ``peak - measured_static = scale * model_dynamic + offset`` over the points.

    Pure arithmetic, so it is tested without a GPU.

    Raises:
        CalibrationError: fewer than two points, or points whose model step memory does not vary.
    """
    if len(points) < 2:
        raise CalibrationError("calibration needs at least two measured shapes")
    xs = [float(p.model_dynamic) for p in points]
    ys = [float(p.peak_allocated - measured_static) for p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        raise CalibrationError("calibration shapes gave the same predicted step memory; use different shapes")
    scale = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if not 0.25 <= scale <= 4.0:
        raise CalibrationError(f"calibration fit is implausible (scale {scale:.2f}); the measurements may be "
                               "disturbed by other processes on this GPU")
    offset = my - scale * mx
    hw = base or Hardware()
    changes: dict[str, Any] = {"dynamic_scale": scale, "dynamic_offset_bytes": round(offset),
                               "static_offset_bytes": measured_static - predicted_static}
    if cuda_context_bytes is not None:
        changes["cuda_context_bytes"] = cuda_context_bytes
    return replace(hw, **changes)


def _config_of(model: ModelRef) -> dict[str, Any]:
    if isinstance(model, str):
        return get_config(model)
    if isinstance(model, Mapping):
        return dict(model)
    raise CalibrationError("calibration needs a registry name or a config.json, not a bare shape")


def measure(model_dir: str, spec: QLoraSpec, vocab: int, shapes: Sequence[tuple[int, int]], steps: int = 2
            ) -> tuple[int, list[tuple[int, int, int, int, int | None]]]:
    """Load ``model_dir`` as ``spec.framework`` does and run ``steps`` of its steps per shape on the current CUDA
    device (:class:`vramscope.tune.qlora.Trainer`).

    Returns:
        (static allocated after loading and creating the optimizer, [(batch, seq, peak allocated,
        peak reserved, NVML process bytes or None), ...]).
    """
    import torch

    from vramscope.tune.qlora import Trainer, load_model, make_optimizer

    model = load_model(model_dir, spec)
    if spec.gradient_checkpointing and framework_for(spec).reentrant:
        # As the H200 measurements ran: reentrant checkpointing, asked for explicitly (peft passes no kwargs,
        # and torch warns, or in later versions refuses, when use_reentrant is left unset).
        model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    elif spec.gradient_checkpointing:
        # HF Trainer (and TRL through it) enables non-reentrant checkpointing at train start
        model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = make_optimizer(model, spec)
    device = next(model.parameters()).device
    # The framework's own step: autocast and the output dropped (hf), the fused LM head (trl), `out` kept (loop)
    trainer = Trainer(model=model, optimizer=optimizer, vocab_size=vocab, device=device, spec=spec)
    results: list[tuple[int, int, int, int, int | None]] = []
    static = 0
    try:
        for batch, seq in shapes:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            for _ in range(steps):
                trainer.step(batch, seq)
            trainer._kept = None  # a loop's output would count as static
            torch.cuda.synchronize()
            if not static:
                # after the first shape's steps the optimizer states exist: weights + adapters + states
                static = torch.cuda.memory_allocated()
            results.append((batch, seq, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
                            _process_bytes()))
    finally:
        del trainer, optimizer, model
        gc.collect()
        torch.cuda.empty_cache()
    return static, results


def _process_bytes() -> int | None:
    """This process's GPU memory as NVML reports it (what nvidia-smi shows), or None without NVML."""
    import torch

    from vramscope.backends.host import HostBackend
    from vramscope.backends.nvml import NvmlBackend
    from vramscope.sampling.sampler import Collector

    nvml = NvmlBackend()
    if not nvml.is_available():
        return None
    sample = Collector(nvml=nvml, host=HostBackend()).collect()
    return sample.process_bytes(torch.cuda.current_device())


def calibrate(model: ModelRef, spec: QLoraSpec, shapes: Sequence[tuple[int, int]] = DEFAULT_SHAPES,
              steps: int = 2) -> tuple[Hardware, str]:
    """Measure ``shapes`` on this machine's GPU and return the fitted :class:`Hardware` with a short report.

    Raises:
        CalibrationError: no CUDA GPU, missing libraries, or an implausible fit.
        PlanInputError: a model name the registry does not know (checked before anything else).
    """
    # The model first: a name that is not known is the user's to fix, on any machine (PlanInputError).
    config = _config_of(model)
    _, shape = resolve_model(model)
    try:
        import torch
    except ImportError:
        raise CalibrationError("--calibrate needs torch; run: pip install 'vramscope[hf]'") from None
    if not torch.cuda.is_available():
        raise CalibrationError("--calibrate needs a CUDA GPU; without one, plan without --calibrate")
    try:
        from vramscope.tune.qlora import require, write_random_checkpoint

        require("transformers", "peft", *(["bitsandbytes"] if spec.bits in (4, 8) else []))
    except ImportError as exc:
        raise CalibrationError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="vramscope-calibrate-") as tmp:
        write_random_checkpoint(config, tmp, device="cuda")
        gc.collect()
        torch.cuda.empty_cache()
        static, rows = measure(tmp, spec, shape.vocab, shapes, steps)
    points = []
    contexts = []
    for batch, seq, alloc, reserved, process in rows:
        est = estimate(shape, spec, batch, seq)
        points.append(Point(batch, seq, alloc, est.peak_allocated_bytes - _static(est.breakdown)))
        if process is not None:
            contexts.append(process - reserved)
    predicted_static = _static(estimate(shape, spec, 1, 1).breakdown)
    hw = fit(points, static, predicted_static, cuda_context_bytes=max(contexts) if contexts else None)
    lines = [f"calibration on {torch.cuda.get_device_name()}: static {static / MIB:.0f} MiB measured, "
             f"{predicted_static / MIB:.0f} MiB predicted; step memory x {hw.dynamic_scale:.3f} "
             f"{hw.dynamic_offset_bytes / MIB:+.0f} MiB"]
    for p in points:
        analytic = static + p.model_dynamic
        lines.append(f"  batch {p.batch} x {p.seq}: measured {p.peak_allocated / MIB:.0f} MiB, "
                     f"analytic {analytic / MIB:.0f} MiB")
    return hw, "\n".join(lines)
