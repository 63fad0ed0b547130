"""When a monitor may run its live analysis (the leak test and the forecast) without slowing the training."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class AnalysisPacer:
    """Due every ``every`` logged steps, no more often than every ``min_interval_s`` seconds, and spaced so
    that the analysis takes at most ``max_share`` of the wall time, however fast the steps (the gap grows
    with what the last analysis cost, measured with :meth:`ran`)."""

    def __init__(
        self, every: int, min_interval_s: float, max_share: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every = every
        self.min_interval_s = min_interval_s
        self.max_share = max_share
        self._clock = clock
        self._since = 0
        self._last_at = -math.inf
        self._cost_s = 0.0

    def due(self) -> bool:
        """Count one logged step; True when the analysis should run now (the caller then calls :meth:`ran`)."""
        self._since += 1
        if self._since < self.every:
            return False
        now = self._clock()
        if now - self._last_at < max(self.min_interval_s, self._cost_s / self.max_share):
            return False
        self._since = 0
        self._last_at = now
        return True

    def ran(self) -> None:
        """The analysis that :meth:`due` allowed has finished: its cost spaces the next one."""
        self._cost_s = self._clock() - self._last_at
