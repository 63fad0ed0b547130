"""The rows a :class:`~vramscope.training.monitor.MemoryMonitor` keeps in memory for its analysis, bounded."""

from __future__ import annotations

from collections import deque
from typing import Any


class RowHistory:
    """At most ``size`` rows (tuples of ``columns``): the newest half as they are, the older ones evenly thinned.

    The newest ``size / 2`` rows are kept as they are (the leak test's short windows need full
    resolution); older rows move to an archive that keeps every ``stride``-th of them and, when full,
    drops every other one and doubles the stride. So the whole run stays represented, evenly thinned,
    however long it is. Not thread-safe: the monitor holds its lock around every call.
    """

    def __init__(self, size: int, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=size // 2)
        self._archive: list[tuple[Any, ...]] = []
        self._archive_cap = size - size // 2
        self._archived = 0
        self._stride = 1

    def add(self, row: tuple[Any, ...]) -> None:
        """Keep one row (values in :attr:`columns` order)."""
        if len(self._recent) == self._recent.maxlen:
            self._archive_row(self._recent[0])
        self._recent.append(row)

    def _archive_row(self, row: tuple[Any, ...]) -> None:
        self._archived += 1
        if self._archived % self._stride:
            return
        self._archive.append(row)
        if len(self._archive) > self._archive_cap:
            self._archive = self._archive[::2]
            self._stride *= 2

    def __len__(self) -> int:
        return len(self._archive) + len(self._recent)

    def as_columns(self) -> dict[str, list[Any]]:
        """The rows held, oldest first, as one list per column (what the analysis reads)."""
        held = [*self._archive, *self._recent]
        return {name: [row[i] for row in held] for i, name in enumerate(self.columns)}
