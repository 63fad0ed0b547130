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


def _fold_peaks(nested: dict[str, Any], into: dict[PeakPath, int], prefix: PeakPath = ()) -> None:
    """Raise ``into``'s carried peaks to every ``peak`` in torch's nested stats dict (one walk, no copy)."""
    peak = nested.get("peak")
    if isinstance(peak, int) and peak > into.get(prefix, 0):
        into[prefix] = peak
    for key, value in nested.items():
        if isinstance(value, dict):
            _fold_peaks(value, into, (*prefix, str(key)))


def _raised(nested: dict[str, Any], carried: dict[PeakPath, int]) -> dict[str, Any]:
    """``nested`` with its peaks raised to at least the ``carried`` ones.

    torch builds a fresh dict at every reading, so without a carry (the common case: nobody reset the other
    view since its last reading) it is returned as it is; otherwise only the dicts on a carried peak's path
    are copied, so the caller's reading is never changed in place.
    """
    if not carried:
        return nested
    out = dict(nested)
    for path, peak in carried.items():
        level = out
        for key in path:
            inner = level.get(key)
            if not isinstance(inner, dict):
                break
            level[key] = level = dict(inner)
        else:
            value = level.get("peak")
            if isinstance(value, int) and peak > value:
                level["peak"] = peak
    return out


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
            _fold_peaks(self._read(device), self._own_carry.setdefault(device, {}))
            self._user_carry.pop(device, None)
            self._reset(device)

    def own_stats(self, device: int) -> dict[str, Any]:
        """vramscope's view: the peaks since its own last reset, a user's reset in between included."""
        with self._lock:
            return _raised(self._read(device), self._own_carry.get(device, {}))

    def own_read_and_reset(
        self, device: int, in_use: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """:meth:`own_stats` and :meth:`own_reset` from one reading of torch's stats (a row's hot path).

        ``in_use``, when given, is asked about that reading first: a device it refuses is neither reset nor
        read (None), so finding the devices a process uses costs no second reading.
        """
        with self._lock:
            real = self._read(device)
            if in_use is not None and not in_use(real):
                return None
            # The user's view keeps every peak this reset hides; vramscope's gets what a user's reset hid.
            _fold_peaks(real, self._user_carry.setdefault(device, {}))
            stats = _raised(real, self._own_carry.pop(device, {}))
            self._reset(device)
            return stats

    def own_reset(self, device: int) -> None:
        """vramscope's reset after a reading: the user's view keeps every peak it hid."""
        with self._lock:
            _fold_peaks(self._read(device), self._user_carry.setdefault(device, {}))
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
        # Only devices this process has touched: reading another would create a CUDA context there.
        return [i for i in self._candidates() if _in_use(self._own_view(i))]

    def _candidates(self) -> range:
        """The devices that may be in use (before asking each); nothing before torch initialised CUDA."""
        if not self.available() or not self._torch.cuda.is_initialized():
            return range(0)
        return range(self._torch.cuda.device_count())

    def _own_view(self, device: int) -> dict[str, Any]:
        """vramscope's nested stats of ``device`` without a reset: the ledger's view once one exists."""
        if _LEDGER is not None:
            return _LEDGER.own_stats(device)
        # Nothing was ever reset: torch's counters are both views (and its function is still its own).
        return self._torch.cuda.memory.memory_stats_as_nested_dict(device=device)  # type: ignore[no-any-return]

    def read(self) -> tuple[AllocatorReading, ...]:
        # One nested reading per device and row: it answers whether the device is in use (when the devices
        # were not given) and is the row itself; torch's flat ``memory_stats`` (a copy of every one of its
        # ~120 keys, sorted) and a second reading to find the devices were what a row cost before.
        probe = self._devices is None
        readings = []
        for device in self._candidates() if probe else self._devices or ():
            stats: dict[str, Any] | None
            if self._reset_peak:
                stats = self._peak_ledger().own_read_and_reset(device, in_use=_in_use if probe else None)
            else:
                stats = self._own_view(device)
                if probe and not _in_use(stats):
                    stats = None
            if stats is not None:
                readings.append(reading_from_nested(device, stats, self._uuid(device)))
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


def _in_use(nested: dict[str, Any]) -> bool:
    """True when the nested stats show a device this process has allocated on."""
    reserved = nested.get("reserved_bytes")
    current = reserved.get("all", {}).get("current", 0) if isinstance(reserved, dict) else 0
    return bool(nested.get("num_device_alloc", 0) or current)


def _count(nested: dict[str, Any], stat: str, counter: str = "current") -> int | None:
    """``nested[stat]["all"][counter]`` (torch's flat ``<stat>.all.<counter>``), None when absent."""
    pools = nested.get(stat)
    value = pools.get("all", {}).get(counter) if isinstance(pools, dict) else None
    return int(value) if value is not None else None


def reading_from_nested(device: int, nested: dict[str, Any], uuid: str | None = None) -> AllocatorReading:
    """Turn one ``torch.cuda.memory_stats_as_nested_dict`` reading into a reading (absent keys become None):
    the nine numbers a row needs, read where they sit, without flattening the rest."""
    retries, ooms = nested.get("num_alloc_retries"), nested.get("num_ooms")
    return AllocatorReading(
        device=device,
        allocated_bytes=_count(nested, "allocated_bytes") or 0,
        reserved_bytes=_count(nested, "reserved_bytes") or 0,
        active_bytes=_count(nested, "active_bytes"),
        inactive_split_bytes=_count(nested, "inactive_split_bytes"),
        peak_allocated_bytes=_count(nested, "allocated_bytes", "peak"),
        peak_reserved_bytes=_count(nested, "reserved_bytes", "peak"),
        num_alloc_retries=None if retries is None else int(retries),
        num_ooms=None if ooms is None else int(ooms),
        uuid=uuid,
    )


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
