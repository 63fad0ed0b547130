"""What a :class:`~vramscope.training.monitor.MemoryMonitor` keeps of its samples between analyses: the rows
for the live analysis (bounded), the latest step sample and the peak since a trainer last asked for its figures.

One lock guards all of it, because the background sampler's thread records rows while the training thread
logs steps and analyses.
"""

from __future__ import annotations

import threading
from typing import Any

from vramscope.analysis.summary import ANALYSED_COLUMNS
from vramscope.logs.schema import sample_rows
from vramscope.training.history import RowHistory
from vramscope.types import Sample


class LiveRows:
    """The samples' rows held for the analysis (:class:`RowHistory`, ``size`` rows at most) and what the
    trainer's figures read; thread-safe."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._rows = RowHistory(size, ANALYSED_COLUMNS)
        self._latest: Sample | None = None
        self._logged = 0
        self._system_total: int | None = None
        self._figures_peak: int | None = None  # the highest peak since figures() last reset it

    @property
    def latest(self) -> Sample | None:
        """The latest step (or phase) sample; background samples do not count."""
        return self._latest

    @property
    def logged(self) -> int:
        """Step and phase samples recorded so far (each may be several rows, one per GPU)."""
        return self._logged

    def record(self, sample: Sample, background: bool = False) -> None:
        """Keep the sample's rows; a background sample (no step) is kept for the analysis only."""
        rows = sample_rows(sample)
        with self._lock:
            if not background:
                self._latest = sample
                self._logged += 1
            if sample.host.system_total_bytes:
                self._system_total = sample.host.system_total_bytes
            for row in rows:
                self._rows.add(tuple(row.get(name) for name in self._rows.columns))
                peak = row.get("peak_allocated_bytes")
                peak = peak if peak is not None else row.get("allocated_bytes") or row.get("host_rss_bytes")
                if peak is not None and not background and (self._figures_peak is None or peak > self._figures_peak):
                    self._figures_peak = peak

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def columns(self) -> tuple[dict[str, list[Any]], bool, int | None]:
        """The rows as columns, whether any row is a GPU's, and the host's memory (the capacity without GPU)."""
        with self._lock:
            columns = self._rows.as_columns()
            return columns, any(g is not None for g in columns["gpu"]), self._system_total

    def figures(self, reset: bool) -> tuple[Sample | None, int | None]:
        """The latest sample and the peak since the last reset; ``reset`` starts the next peak afresh."""
        with self._lock:
            peak = self._figures_peak
            if reset:
                self._figures_peak = None
            return self._latest, peak


__all__ = ["LiveRows"]
