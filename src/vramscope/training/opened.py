"""What a :class:`~vramscope.training.monitor.MemoryMonitor` opens when it starts, held together: the collector
and the sampler that logs its rows, the warnings, the exporters, the OOM recorder, the background thread and the
ranks' all-gather. One value, made by ``start()``, closed by ``close()``: the monitor holds it as one attribute.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from vramscope.analysis.alerts import Alerts
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.training.gather import RankGather
from vramscope.training.readers import BackgroundSampler


@dataclass
class OpenParts:
    """The monitor's open parts; ``oom``, ``background`` and ``gatherer`` are set once they exist."""

    collector: Collector
    sampler: Sampler
    alerts: Alerts
    exporters: tuple[Any, ...] = ()  # the exporters among the sampler's sinks, for the live analysis
    oom: Any = None  # the OOM recorder, when oom_snapshot asked for one
    background: BackgroundSampler | None = None  # the thread of interval= samples
    gatherer: RankGather | None = None  # the all-gather of the ranks' rows, set up at the first logged step

    @property
    def prometheus(self) -> Any:
        """The ``/metrics`` exporter among :attr:`exporters` (the one with a port); None when there is none."""
        return next((sink for sink in self.exporters if hasattr(sink, "port")), None)

    def close(self) -> None:
        """Stop the OOM recorder and close the sampler's sinks (the background thread is stopped before)."""
        if self.oom is not None:
            with contextlib.suppress(Exception):
                self.oom.stop()
        self.sampler.close()  # closes the sinks (never started, so it takes no extra sample)


__all__ = ["OpenParts"]
