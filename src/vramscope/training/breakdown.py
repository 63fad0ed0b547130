"""What holds memory right now: count a model's and an optimizer's own tensors by category.

This replaces the ``torch.cuda.memory_summary()`` prints people add to their loops: instead of the
allocator's pools it says how much is 4-bit weights, 16/32-bit weights, quantization constants, LoRA,
gradients and optimizer states, and (given the run's peak) what the activations took at the peak.

Counting walks ``model.parameters()``, ``model.buffers()`` and ``optimizer.state`` once (a 7B LoRA model
has about a thousand tensors: well under a millisecond), deduplicating shared storages (tied
embeddings). bitsandbytes is never imported: its 4-bit parameters are recognised by their
``quant_state`` and its paged optimizer states by their ``is_paged`` flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from vramscope.types import MemoryBreakdown, gpu_of

_QUANT_STATE_TENSORS = ("absmax", "code", "offset")


def _tensor_bytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _on(t: Any, device: Any) -> bool:
    return device is None or t.device == device


def _storage_key(t: Any) -> tuple[int, int]:
    # Two tensors share memory when they view one storage; count the storage once.
    try:
        return (int(t.untyped_storage().data_ptr()), int(t.untyped_storage().nbytes()))
    except Exception:  # tensors without a storage (fake or meta tensors) are counted by their own bytes
        return (id(t), _tensor_bytes(t))


def _quant_state_tensors(state: Any, depth: int = 0) -> Iterator[Any]:
    """The tensors of a bitsandbytes QuantState, nested (double quantization) ones included."""
    if state is None or depth > 2:
        return
    for name in _QUANT_STATE_TENSORS:
        t = getattr(state, name, None)
        if t is not None and hasattr(t, "element_size"):
            yield t
    yield from _quant_state_tensors(getattr(state, "state2", None), depth + 1)


def _weight_kind(p: Any) -> str:
    if getattr(p, "quant_state", None) is not None:
        bits = "4-bit" if "4bit" in type(p).__name__.lower() or str(p.dtype).endswith("uint8") else "quantized"
        return f"{bits} ({str(p.dtype).removeprefix('torch.')})"
    if type(p).__name__ == "Int8Params":
        return "8-bit (int8)"
    return str(p.dtype).removeprefix("torch.")


def model_device(model: Any) -> Any:
    """The device most of the model's parameters are on (the first CUDA one, else the first)."""
    first = None
    for p in model.parameters():
        if first is None:
            first = p.device
        if p.device.type == "cuda":
            return p.device
    return first


def measure(model: Any, optimizer: Any = None, *, device: Any = None) -> MemoryBreakdown:
    """Count what ``model`` and ``optimizer`` hold on ``device`` (default: the model's device).

    The dynamic figures (peak, cache, context, activations) stay None: :func:`with_readings` fills them.
    """
    device = device if device is not None else model_device(model)
    seen: set[tuple[int, int]] = set()

    def new(t: Any) -> bool:
        key = _storage_key(t)
        if key in seen:
            return False
        seen.add(key)
        return True

    weights: dict[str, int] = {}
    consts = lora = trainable = grads = 0
    for p in model.parameters():
        if not _on(p, device):
            continue
        if p.requires_grad:
            trainable += int(p.numel())
            if new(p):
                lora += _tensor_bytes(p)
                # The gradient has the parameter's shape and dtype; it exists from the backward to the
                # optimizer step (zero_grad(set_to_none=True) frees it), so it is counted at full size.
                grads += _tensor_bytes(p)
            continue
        if new(p):
            kind = _weight_kind(p)
            weights[kind] = weights.get(kind, 0) + _tensor_bytes(p)
        for t in _quant_state_tensors(getattr(p, "quant_state", None)):
            if _on(t, device) and new(t):
                consts += _tensor_bytes(t)
    buffers = sum(_tensor_bytes(b) for b in model.buffers() if _on(b, device) and new(b))
    states, paged = _optimizer_bytes(optimizer, device, new)
    assert min(consts, lora, grads, buffers, states, paged, trainable, *weights.values()) >= 0, "a negative size"
    return MemoryBreakdown(device=str(device), weights=dict(sorted(weights.items(), key=lambda kv: -kv[1])),
                           quantization_constants=consts, buffers=buffers, lora_weights=lora,
                           trainable_params=trainable, gradients=grads, optimizer_states=states,
                           optimizer_states_paged=paged)


def _optimizer_bytes(optimizer: Any, device: Any, new: Any) -> tuple[int, int]:
    """(states in torch's allocator on ``device``, paged states) of ``optimizer``; (0, 0) without one."""
    state = getattr(optimizer, "state", None)
    if not state:
        return 0, 0
    in_allocator = paged = 0
    for per_param in list(state.values()):
        for value in _state_tensors(per_param):
            if getattr(value, "is_paged", False):
                paged += _tensor_bytes(value)  # unified memory: not in torch's allocator
            elif _on(value, device) and new(value):
                in_allocator += _tensor_bytes(value)
    return in_allocator, paged


def _state_tensors(per_param: Any) -> Iterable[Any]:
    values = per_param.values() if isinstance(per_param, dict) else ()
    return [v for v in values if hasattr(v, "element_size") and hasattr(v, "numel") and v.numel() > 1]


def with_readings(static: MemoryBreakdown, *, peak_allocated: int | None, reserved: int | None,
                  allocated: int | None, process: int | None) -> MemoryBreakdown:
    """``static`` with the run's peak, the allocator's cache and the CUDA context filled in."""
    from dataclasses import replace

    static_bytes = static.static_bytes()
    activations = None if peak_allocated is None else max(0, peak_allocated - static_bytes)
    # At the peak the cache is what the allocator held beyond the peak's tensors (reserved rarely shrinks);
    # reserved less allocated at a step's end would count the freed activations as cache.
    in_use = peak_allocated if peak_allocated is not None else allocated
    cache = None if reserved is None or in_use is None else max(0, reserved - in_use)
    context = None if process is None or reserved is None else max(0, process - reserved)
    # The parts add up (torch's _memory_viz states its own sums the same way): the static parts and the
    # activations are the peak (or more, when the tensors counted outlive a peak read before they existed),
    # the cache tops the tensors in use up to reserved, the context tops reserved up to the process's memory.
    assert activations is None or peak_allocated is None or static_bytes + activations == max(peak_allocated,
                                                                                               static_bytes)
    assert cache is None or in_use is None or reserved is None or in_use + cache == max(reserved, in_use)
    assert context is None or reserved is None or process is None or reserved + context == max(process, reserved)
    return replace(static, activations_at_peak=activations, peak_allocated_bytes=peak_allocated,
                   reserved_bytes=reserved, allocator_cache_bytes=cache, cuda_context_bytes=context,
                   process_bytes=process)


def summary(model: Any, optimizer: Any = None) -> MemoryBreakdown:
    """What holds memory now, for a notebook or a print: ``print(vramscope.summary(model, optimizer))``.

    On CUDA the peak is ``torch.cuda.max_memory_allocated`` since the last reset (the run's peak unless
    something reset it), the cache and context come from the allocator and NVML; on a CPU only the
    static parts are known.
    """
    static = measure(model, optimizer)
    device = model_device(model)
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return static
    import os

    from vramscope.backends.nvml import NvmlBackend
    from vramscope.backends.torch_allocator import TorchAllocatorBackend

    readings = TorchAllocatorBackend(devices=[device.index or 0], reset_peak=False).read()
    if not readings:
        return static
    reading = readings[0]
    process = None
    nvml = NvmlBackend()
    try:
        gpu = gpu_of(reading, nvml.read())
        if gpu is not None and gpu.processes_known:
            mine = [p.gpu_bytes for p in gpu.processes if p.pid == os.getpid() and p.gpu_bytes is not None]
            process = sum(mine) if mine else None
    finally:
        nvml.close()
    return with_readings(static, peak_allocated=reading.peak_allocated_bytes, reserved=reading.reserved_bytes,
                         allocated=reading.allocated_bytes, process=process)


class BreakdownTracker:
    """The monitor's side: remembers the model and optimizer (weakly) and the run's peak, and says what holds
    memory on request. ``observe`` is called with every step row (O(GPUs), no tensor walk); the tensors are
    counted only in :meth:`current`, i.e. when someone asks, when the breakdown file is written (once the
    optimizer has states, and at the end) and in an OOM report.
    """

    def __init__(self) -> None:
        self._model: Any = None
        self._optimizer: Any = None
        self.peak_allocated: int | None = None
        self._latest: Any = None
        self.saved_with_states = False

    def watch_model(self, model: Any) -> None:
        self._model = _weak(model)

    def watch_optimizer(self, optimizer: Any) -> None:
        if optimizer is not None and (self._optimizer is None or self._optimizer() is not optimizer):
            self._optimizer = _weak(optimizer)

    @property
    def has_optimizer_states(self) -> bool:
        opt = self._optimizer() if self._optimizer is not None else None
        return bool(getattr(opt, "state", None))

    def observe(self, sample: Any) -> None:
        self._latest = sample
        for reading in getattr(sample, "allocator", ()):
            peak = reading.peak_allocated_bytes if reading.peak_allocated_bytes is not None else reading.allocated_bytes
            if peak is not None and (self.peak_allocated is None or peak > self.peak_allocated):
                self.peak_allocated = peak

    @property
    def lost_sight(self) -> bool:
        """True when the model or the optimizer seen earlier is gone (a trainer freed at exit): a breakdown
        taken now would miss them, so the one saved while they lived is the better record."""
        return (self._model is not None and self._model() is None) or (
            self._optimizer is not None and self._optimizer() is None)

    def current(self) -> MemoryBreakdown | None:
        """What holds memory now, with the run's peak; None before a model is known (or once it is gone)."""
        model = self._model() if self._model is not None else None
        if model is None:
            return None
        optimizer = self._optimizer() if self._optimizer is not None else None
        static = measure(model, optimizer)
        sample = self._latest
        reading = next(iter(getattr(sample, "allocator", ())), None)
        if reading is None:
            return static
        # The run's peak covers every row seen, the latest among them: never below what it left allocated.
        assert self.peak_allocated is None or reading.allocated_bytes is None or (
            self.peak_allocated >= reading.allocated_bytes), "the run's peak is below the latest allocated"
        gpu = gpu_of(reading, getattr(sample, "gpus", ()))
        process = None if gpu is None else sample.process_bytes(gpu.index)
        return with_readings(static, peak_allocated=self.peak_allocated, reserved=reading.reserved_bytes,
                             allocated=reading.allocated_bytes, process=process)


def _weak(obj: Any) -> Any:
    import weakref

    try:
        return weakref.ref(obj)
    except TypeError:  # objects without weak references are kept alive for the run instead
        return lambda: obj
