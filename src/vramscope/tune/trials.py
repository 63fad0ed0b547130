"""Running trials for real: one step at one size, memory released before and after, its OOM caught and cleared,
and the model and optimizer put back as they were (:class:`Restorer`).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from vramscope.oom.classify import oom_kind
from vramscope.tune.search import MemoryProbe, Trial

log = logging.getLogger("vramscope.tuner")  # the name the search's log lines always had


class Restorer:
    """Copies the trainable parameters and the state of the given objects to host memory, to put back.

    Modules (anything with ``named_parameters``): only parameters that require grad are saved (the
    frozen, possibly quantized base does not change during a step), and their ``.grad`` is dropped
    after each failed trial. Optimizers (``state`` and ``param_groups``): the per-parameter state is
    copied back *into the tensors it lives in*, so that state kept in special memory (bitsandbytes'
    paged buffers) stays there; state the search created is dropped. Anything else with
    ``state_dict``/``load_state_dict`` (schedulers, scalers): its state dict.
    """

    def __init__(self, objects: Iterable[Any]) -> None:
        self._objects = list(objects)
        self._saved: list[Any] = []
        for obj in self._objects:
            if hasattr(obj, "named_parameters"):
                self._saved.append(
                    {n: p.detach().to("cpu", copy=True) for n, p in obj.named_parameters() if p.requires_grad}
                )
            elif hasattr(obj, "state") and hasattr(obj, "param_groups"):
                state = {p: {k: _host_copy(v) for k, v in st.items()} for p, st in obj.state.items()}
                groups = [{k: v for k, v in g.items() if k != "params"} for g in obj.param_groups]
                self._saved.append((state, _to_host(groups)))
            elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
                self._saved.append(_to_host(obj.state_dict()))
            else:
                raise TypeError(
                    f"cannot restore a {type(obj).__name__}: pass modules, optimizers or objects "
                    "with state_dict()/load_state_dict()"
                )

    def drop_grads(self) -> None:
        for obj in self._objects:
            if hasattr(obj, "named_parameters"):
                for p in obj.parameters():
                    p.grad = None

    def restore(self) -> None:
        import torch

        for obj, saved in zip(self._objects, self._saved, strict=True):
            if hasattr(obj, "named_parameters"):
                with torch.no_grad():
                    for n, p in obj.named_parameters():
                        if n in saved:
                            p.copy_(saved[n])
                        p.grad = None
            elif hasattr(obj, "state") and hasattr(obj, "param_groups"):
                state, groups = saved
                for p in [p for p in obj.state if p not in state]:
                    del obj.state[p]  # created by the search: training had none
                with torch.no_grad():
                    for p, entries in state.items():
                        current = obj.state.setdefault(p, {})
                        for key, (value, device) in entries.items():
                            now = current.get(key)
                            if torch.is_tensor(value) and torch.is_tensor(now) and now.shape == value.shape:
                                now.copy_(value)
                            else:
                                current[key] = value.to(device) if torch.is_tensor(value) else value
                for group, hyper in zip(obj.param_groups, groups, strict=False):
                    group.update(hyper)
            else:
                obj.load_state_dict(saved)


def _host_copy(value: Any) -> tuple[Any, Any]:
    """``(copy on the host, the device it came from)`` for a tensor; ``(value, None)`` otherwise."""
    if hasattr(value, "detach") and hasattr(value, "device"):
        return value.detach().to("cpu", copy=True), value.device
    return value, None


def _to_host(value: Any) -> Any:
    if hasattr(value, "detach") and hasattr(value, "to"):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def make_trial_runner(
    step_fn: Callable[[int], Any],
    probe: MemoryProbe,
    restorer: Restorer | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> Callable[[int], Trial]:
    """Wrap ``step_fn(size)`` into a trial: memory released before and after, OOMs caught and cleared."""

    def run(size: int) -> Trial:
        # empty_cache() first, so the reserve holds only live tensors and its peak is this trial's.
        probe.release()
        base = probe.allocated_bytes()
        base_reserved = probe.reserved_bytes()
        probe.reset_peak()
        t0 = time.perf_counter()
        error: str | None = None
        peak: int | None = None
        peak_reserved: int | None = None
        try:
            step_fn(size)
            peak = probe.peak_bytes()
            peak_reserved = probe.peak_reserved_bytes()
        except BaseException as exc:
            kind = oom_kind(exc)
            if kind is None:
                _forget(exc)
                probe.release()
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            error = f"{kind}: {first[:300]}"
            # The traceback's frames hold the failed step's tensors; clear them so release() frees them.
            _forget(exc)
            del exc
            if restorer is not None:
                restorer.drop_grads()
        seconds = time.perf_counter() - t0
        probe.release()
        trial = Trial(
            size=size,
            ok=error is None,
            base_bytes=base,
            peak_bytes=peak,
            seconds=seconds,
            error=error,
            after_bytes=probe.allocated_bytes(),
            base_reserved_bytes=base_reserved,
            peak_reserved_bytes=peak_reserved,
            after_reserved_bytes=probe.reserved_bytes(),
        )
        log.info("trial %d: %s", size, "ok" if trial.ok else error)
        if on_trial is not None:
            on_trial(trial)
        return trial

    return run


def _forget(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # a frame still executing (ours): nothing to clear there
            pass
        tb = tb.tb_next
    traceback.clear_frames(exc.__traceback__)
