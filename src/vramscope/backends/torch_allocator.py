"""Readings of torch's CUDA caching allocator (the only backend that imports ``torch``).

Works only inside the process that trains: the allocator is per process. ``torch.cuda.memory_stats``
is a cheap host-side read (no device synchronisation), so it is safe at every step.

A per-step peak needs the allocator's peak counters reset after each reading, and torch has one set of
counters per process, shared with the user's own ``torch.cuda.max_memory_allocated()`` and with HF's
memory metrics. :class:`PeakLedger` keeps both views: vramscope resets the real counters, and the ledger
carries what each reset hid, so the user's code reads what it would read without vramscope.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Iterable
from typing import Any

from vramscope.types import AllocatorReading

PeakPath = tuple[str, ...]  # where a "peak" sits in torch's nested stats: ("allocated_bytes", "all")


def _peaks(nested: dict[str, Any], prefix: PeakPath = ()) -> dict[PeakPath, int]:
    """Every ``peak`` in torch's nested stats dict, by its path."""
    found: dict[PeakPath, int] = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            found.update(_peaks(value, (*prefix, str(key))))
        elif key == "peak" and isinstance(value, int):
            found[prefix] = value
    return found


def _raised(nested: dict[str, Any], carried: dict[PeakPath, int], prefix: PeakPath = ()) -> dict[str, Any]:
    """A copy of ``nested`` whose peaks are at least the ``carried`` ones."""
    out: dict[str, Any] = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            out[key] = _raised(value, carried, (*prefix, str(key)))
        elif key == "peak" and isinstance(value, int):
            out[key] = max(value, carried.get(prefix, 0))
        else:
            out[key] = value
    return out


def _fold(into: dict[PeakPath, int], peaks: dict[PeakPath, int]) -> None:
    for path, value in peaks.items():
        if value > into.get(path, 0):
            into[path] = value


class PeakLedger:
    """Two views of one set of peak counters: the user's (reset only by the user) and vramscope's (reset per row).

    ``read_nested(device)`` and ``reset(device)`` are torch's own functions, taken before any patching.
    Whoever resets the real counters first folds the peaks they held into the other view's carry, so
    neither view loses a peak to the other's reset.
    """

    def __init__(self, read_nested: Callable[[int], dict[str, Any]], reset: Callable[[int], None]) -> None:
        self._read = read_nested
        self._reset = reset
        self._lock = threading.Lock()
        self._user_carry: dict[int, dict[PeakPath, int]] = {}
        self._own_carry: dict[int, dict[PeakPath, int]] = {}

    def user_stats(self, device: int) -> dict[str, Any]:
        """What ``torch.cuda.memory_stats_as_nested_dict`` would say had vramscope never reset a counter."""
        with self._lock:
            return _raised(self._read(device), self._user_carry.get(device, {}))

    def user_reset(self, device: int) -> None:
        """The user's ``torch.cuda.reset_peak_memory_stats``: vramscope keeps the peak it had not read yet."""
        with self._lock:
            _fold(self._own_carry.setdefault(device, {}), _peaks(self._read(device)))
            self._user_carry.pop(device, None)
            self._reset(device)

    def own_stats(self, device: int) -> dict[str, Any]:
        """vramscope's view: the peaks since its own last reset, a user's reset in between included."""
        with self._lock:
            return _raised(self._read(device), self._own_carry.get(device, {}))

    def own_read_and_reset(self, device: int) -> dict[str, Any]:
        """:meth:`own_stats` and :meth:`own_reset` from one reading of torch's stats (a row's hot path)."""
        with self._lock:
            real = self._read(device)
            stats = _raised(real, self._own_carry.pop(device, {}))
            _fold(self._user_carry.setdefault(device, {}), _peaks(real))
            self._reset(device)
            return stats

    def own_reset(self, device: int) -> None:
        """vramscope's reset after a reading: the user's view keeps every peak it hid."""
        with self._lock:
            _fold(self._user_carry.setdefault(device, {}), _peaks(self._read(device)))
            self._own_carry.pop(device, None)
            self._reset(device)


_LEDGER: PeakLedger | None = None
_LEDGER_LOCK = threading.Lock()


def peak_ledger(torch: Any) -> PeakLedger:
    """The process's one ledger, installed on first use: torch's stats and reset functions go through it.

    ``torch.cuda.memory.memory_stats_as_nested_dict`` is what ``memory_stats``, ``max_memory_allocated``,
    ``max_memory_reserved`` and ``memory_summary`` all read, and ``reset_peak_memory_stats`` what
    ``reset_max_memory_allocated`` calls, so two replacements cover every public reading of a peak (a
    module that bound one of them by name before vramscope started keeps torch's own).
    """
    global _LEDGER
    with _LEDGER_LOCK:
        if _LEDGER is not None:
            return _LEDGER
        memory = torch.cuda.memory
        original_nested = memory.memory_stats_as_nested_dict
        original_reset = memory.reset_peak_memory_stats

        def index(device: Any) -> int:
            return int(torch.cuda._utils._get_device_index(device, optional=True))

        ledger = PeakLedger(read_nested=lambda d: original_nested(device=d), reset=lambda d: original_reset(d))

        def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
            try:
                return ledger.user_stats(index(device))
            except Exception:  # the monitor's failure is never the training's: torch's own answer
                return original_nested(device=device)  # type: ignore[no-any-return]

        def reset_peak_memory_stats(device: Any = None) -> None:
            try:
                ledger.user_reset(index(device))
            except Exception:
                original_reset(device)

        replacements: tuple[tuple[Any, Any], ...] = (
            (memory_stats_as_nested_dict, original_nested), (reset_peak_memory_stats, original_reset))
        for fn, original in replacements:
            fn.__doc__ = original.__doc__
            fn.__wrapped__ = original
        for namespace in (memory, torch.cuda):
            if getattr(namespace, "memory_stats_as_nested_dict", None) is original_nested:
                namespace.memory_stats_as_nested_dict = memory_stats_as_nested_dict
            if getattr(namespace, "reset_peak_memory_stats", None) is original_reset:
                namespace.reset_peak_memory_stats = reset_peak_memory_stats
        _LEDGER = ledger
        return ledger


def _flat(nested: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """torch's flat ``memory_stats`` keys ("allocated_bytes.all.peak") from the nested dict."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            flat.update(_flat(value, name))
        else:
            flat[name] = value
    return flat


def torch_cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device. Does not import torch if it is absent."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


class TorchAllocatorBackend:
    """Reads allocated / reserved / peak memory of the devices this process uses.

    Args:
        devices: CUDA device indices; ``None`` means every device torch has initialised.
        reset_peak: reset the peak counters after each reading, so that ``peak_allocated_bytes`` is the
            exact peak *since the previous reading* (what a per-step peak needs). The resets go through
            the process's :class:`PeakLedger`: the user's own peak readings stay as they would be.
    """

    def __init__(self, devices: Iterable[int] | None = None, reset_peak: bool = True) -> None:
        import torch

        self._torch: Any = torch
        self._devices = None if devices is None else list(devices)
        self._reset_peak = reset_peak
        self._uuids: dict[int, str | None] = {}
        self._ledger: PeakLedger | None = None

    def _peak_ledger(self) -> PeakLedger:
        if self._ledger is None:
            self._ledger = peak_ledger(self._torch)
        return self._ledger

    def available(self) -> bool:
        return bool(self._torch.cuda.is_available())

    def devices(self) -> list[int]:
        if self._devices is not None:
            return self._devices
        if not self.available():
            return []
        # Only devices this process has touched: reading another would create a CUDA context there.
        return [i for i in range(self._torch.cuda.device_count()) if self._is_initialised(i)]

    def _is_initialised(self, index: int) -> bool:
        stats = self._torch.cuda.memory_stats(index) if self._torch.cuda.is_initialized() else {}
        return bool(stats.get("num_device_alloc", 0) or stats.get("reserved_bytes.all.current", 0))

    def read(self) -> tuple[AllocatorReading, ...]:
        readings = []
        for device in self.devices():
            if self._reset_peak:
                stats = _flat(self._peak_ledger().own_read_and_reset(device))
            elif _LEDGER is not None:
                stats = _flat(_LEDGER.own_stats(device))
            else:  # nothing was ever reset: torch's counters are both views
                stats = self._torch.cuda.memory_stats(device)
            readings.append(reading_from_stats(device, stats, self._uuid(device)))
        return tuple(readings)

    def _uuid(self, device: int) -> str | None:
        if device not in self._uuids:
            try:
                raw = str(self._torch.cuda.get_device_properties(device).uuid)
            except (AttributeError, RuntimeError):
                raw = ""
            self._uuids[device] = (raw if raw.startswith("GPU-") else f"GPU-{raw}") if raw else None
        return self._uuids[device]

    def reset_peaks(self) -> None:
        ledger = self._peak_ledger()
        for device in self.devices():
            ledger.own_reset(device)


def reading_from_stats(device: int, stats: dict[str, Any], uuid: str | None = None) -> AllocatorReading:
    """Turn one ``torch.cuda.memory_stats`` dict into a reading (absent keys become None)."""

    def get(key: str) -> int | None:
        value = stats.get(key)
        return int(value) if value is not None else None

    return AllocatorReading(
        device=device,
        allocated_bytes=get("allocated_bytes.all.current") or 0,
        reserved_bytes=get("reserved_bytes.all.current") or 0,
        active_bytes=get("active_bytes.all.current"),
        inactive_split_bytes=get("inactive_split_bytes.all.current"),
        peak_allocated_bytes=get("allocated_bytes.all.peak"),
        peak_reserved_bytes=get("reserved_bytes.all.peak"),
        num_alloc_retries=get("num_alloc_retries"),
        num_ooms=get("num_ooms"),
        uuid=uuid,
    )
