"""Count the live bytes of a traced training step, as torch's caching allocator would see them.

:class:`LiveBytes` is a ``TorchDispatchMode``: every tensor an operator returns is looked at once per storage;
a new storage adds its size, rounded up to the allocator's 512-byte blocks, to the category the step is in
(``activations`` while a module's forward runs, ``temporaries`` in backward, ...), and a weak reference
takes it off again when the storage dies. The same counter runs on real tensors and on fake ones
(``FakeTensorMode``), which is how the tests prove that a fake trace counts what a real step holds.

Imports torch: only :mod:`vramscope.planner.trace.engine` uses it.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

# CUDA's caching allocator hands out blocks in multiples of 512 bytes (kMinBlockSize); a request of 0 bytes
# gets no block. torch.cuda.max_memory_allocated counts these block sizes.
BLOCK = 512


def block_bytes(nbytes: int) -> int:
    """The bytes a request of ``nbytes`` occupies in the caching allocator."""
    return int(math.ceil(nbytes / BLOCK) * BLOCK) if nbytes > 0 else 0


class LiveBytes(TorchDispatchMode):
    """Live bytes by category, their running peak, and the category totals at that peak.

    Attributes:
        category: where a new storage is counted (the driver sets it as the step moves on).
        now / peak: live bytes now and at most (since the last :meth:`reset_peak`).
        peak_breakdown: the category totals at the moment of ``peak``.
        phase_peaks: the most bytes alive while each phase (:meth:`phase`) ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.category = "other"
        self.phase_name = "setup"
        self.now = 0
        self.peak = 0
        self.peak_phase = "setup"
        self.totals: dict[str, int] = defaultdict(int)
        self.peak_breakdown: dict[str, int] = {}
        self.phase_peaks: dict[str, int] = {}
        self._info: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storage -> [bytes, category]
        self._forward_depth = 0

    # -- storages -------------------------------------------------------------------------------------------
    def track(self, tensor: torch.Tensor, category: str | None = None) -> None:
        """Count ``tensor``'s storage (once) under ``category`` (default: the current one); a storage seen
        before moves to ``category`` when one is given."""
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            return
        storage = tensor.untyped_storage()
        info = self._info.get(storage)
        if info is not None:
            if category is not None and info[1] != category:
                self.totals[info[1]] -= info[0]
                self.totals[category] += info[0]
                info[1] = category
            return
        size = block_bytes(storage.nbytes())
        info = [size, category or self._current_category()]
        self._info[storage] = info
        weakref.finalize(storage, self._release, info)
        self.totals[info[1]] += size
        self.now += size
        self._update_peak()

    def _release(self, info: list[Any]) -> None:
        self.totals[info[1]] -= info[0]
        self.now -= info[0]

    def _current_category(self) -> str:
        if self._forward_depth > 0 and self.category in ("temporaries", "optimizer_states"):
            return "activations"  # a module's forward inside backward: checkpointing recomputes it
        return self.category

    def _update_peak(self) -> None:
        if self.now > self.phase_peaks.get(self.phase_name, 0):
            self.phase_peaks[self.phase_name] = self.now
        if self.now > self.peak:
            self.peak = self.now
            self.peak_phase = self.phase_name
            self.peak_breakdown = {k: v for k, v in self.totals.items() if v}

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now (torch.cuda.reset_peak_memory_stats)."""
        self.peak = self.now
        self.peak_phase = self.phase_name
        self.peak_breakdown = {k: v for k, v in self.totals.items() if v}
        self.phase_peaks = {}

    @contextmanager
    def phase(self, name: str, category: str) -> Iterator[None]:
        """Count what is created inside under ``category`` and its peak under ``name``."""
        saved = self.phase_name, self.category
        self.phase_name, self.category = name, category
        self.phase_peaks[name] = max(self.phase_peaks.get(name, 0), self.now)
        try:
            yield
        finally:
            self.phase_name, self.category = saved

    # -- module hooks: forward (also a checkpoint's recompute) ----------------------------------------------
    def enter_forward(self) -> None:
        self._forward_depth += 1

    def exit_forward(self) -> None:
        self._forward_depth = max(0, self._forward_depth - 1)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out
