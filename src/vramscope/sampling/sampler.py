"""The sampling core: a :class:`Collector` turns backends into a :class:`Sample`, and a
:class:`Sampler` takes one at a fixed interval on a background thread and hands it to the sinks.

Nothing here may hurt the training it watches: an exception in a backend or a sink is logged once
(per source) and swallowed, memory is bounded (a fixed-length history), and the thread is a daemon
that a ``stop()`` ends within one interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.types import GpuReading, HostReading, ProcessGpuReading, Sample, Sink

log = logging.getLogger("vramscope.sampler")  # the logger name users filter on, kept from before the move

MIN_INTERVAL_S = 0.05
# Longer waits overflow the platform's timeout types (threading raises OverflowError past ~1e9 s), and
# a reading a day is no monitor.
MAX_INTERVAL_S = 86400.0
DEFAULT_INTERVAL_S = 1.0


class Collector:
    """Reads every configured backend once and assembles a :class:`Sample`.

    Args:
        nvml: GPU readings; None to skip.
        allocator: anything with ``read() -> tuple[AllocatorReading, ...]`` (the torch backend); None to skip.
        host: host memory; its process tree defines which GPU processes are "ours".
        name_processes: fill in process names and command lines (for ``watch``; costs a /proc read per new pid).
        clock: Unix time source (tests pass a fake one for compressed-time soak runs).
    """

    def __init__(
        self,
        nvml: NvmlBackend | None = None,
        allocator: Any | None = None,
        host: HostBackend | None = None,
        name_processes: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.allocator = allocator
        self.host = host
        self._name_processes = name_processes
        self._clock = clock
        self._start = clock()
        self._failed: set[str] = set()

    def collect(
        self,
        step: int | None = None,
        phase: str | None = None,
        tokens: int | None = None,
        extra: dict[str, object] | None = None,
    ) -> Sample:
        now = self._clock()
        pids = self._guard("process tree", lambda: self.host.tree_pids() if self.host else None, None)
        gpus: tuple[GpuReading, ...] = self._guard("NVML", lambda: self.nvml.read() if self.nvml else (), ())
        if self._name_processes and self.host is not None:
            gpus = tuple(self._with_names(g) for g in gpus)
        allocator = self._guard("torch allocator", lambda: self.allocator.read() if self.allocator else (), ())
        host = self._guard("host memory", lambda: self.host.read(pids) if self.host else HostReading(), HostReading())
        return Sample(
            time=now,
            elapsed_s=now - self._start,
            gpus=gpus,
            allocator=allocator,
            host=host,
            watched_pids=pids,
            step=step,
            phase=phase,
            tokens=tokens,
            extra=dict(extra or {}),
        )

    def _with_names(self, gpu: GpuReading) -> GpuReading:
        assert self.host is not None
        named = []
        for proc in gpu.processes:
            name, cmdline = self.host.describe(proc.pid)
            named.append(ProcessGpuReading(proc.pid, proc.gpu_bytes, name, cmdline))
        return GpuReading(**{**gpu.__dict__, "processes": tuple(named)})

    def _guard(self, what: str, read: Callable[[], Any], default: Any) -> Any:
        try:
            value = read()
        except Exception as exc:  # a monitor must never take the training down with it
            if what not in self._failed:
                self._failed.add(what)
                log.warning(
                    "vramscope: reading %s failed (%s: %s); it will show as unknown", what, type(exc).__name__, exc
                )
            return default
        return value


class Sampler:
    """Samples on a daemon thread every ``interval`` seconds and fans samples out to sinks.

    Use as a context manager, or ``start()`` / ``stop()``. ``emit()`` lets a training loop add its
    own step-aligned samples through the same sinks (thread-safe). ``fast=True`` allows intervals
    below ``MIN_INTERVAL_S`` (compressed-time soaks with an injected clock; never for real runs).
    """

    def __init__(
        self,
        collector: Collector,
        sinks: Iterable[Sink] = (),
        interval: float = DEFAULT_INTERVAL_S,
        history: int = 600,
        on_sample: Callable[[Sample], None] | None = None,
        fast: bool = False,
    ) -> None:
        if not interval >= (0.0 if fast else MIN_INTERVAL_S):
            raise ValueError(f"interval must be at least {MIN_INTERVAL_S} s, got {interval}")
        if not interval <= MAX_INTERVAL_S:
            raise ValueError(f"interval must be at most {MAX_INTERVAL_S:g} s, got {interval}")
        self.collector = collector
        self.sinks: list[Sink] = list(sinks)
        self.interval = float(interval)
        self.history: deque[Sample] = deque(maxlen=history)
        self.samples_taken = 0
        self._on_sample = on_sample
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed_sinks: set[int] = set()
        self.writing: Sink | None = None  # the sink being written or closed now: names one that blocks

    @property
    def latest(self) -> Sample | None:
        return self.history[-1] if self.history else None

    def start(self) -> Sampler:
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="vramscope-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_sample: bool = True) -> None:
        """Stop the thread; take one last sample so a short run still has its end on record."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join(timeout=max(5.0, 3 * self.interval))
            self._thread = None
            if final_sample:
                self.sample_now()

    def close(self) -> None:
        self.stop()
        for sink in self.sinks:
            self.writing = sink
            try:
                sink.close()
            except Exception as exc:
                log.warning("vramscope: closing %s failed: %s", type(sink).__name__, exc)
        self.writing = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def sample_now(self, **fields: Any) -> Sample:
        sample = self.collector.collect(**fields)
        self.emit(sample)
        return sample

    def emit(self, sample: Sample) -> None:
        with self._lock:
            self.history.append(sample)
            self.samples_taken += 1
            for sink in self.sinks:
                self.writing = sink
                try:
                    sink.write(sample)
                except Exception as exc:
                    key = id(sink)
                    if key not in self._failed_sinks:
                        self._failed_sinks.add(key)
                        log.warning(
                            "vramscope: writing to %s failed (%s); training goes on, rows may be missing",
                            getattr(sink, "path", type(sink).__name__),
                            exc,
                        )
            self.writing = None
            if self._on_sample is not None:
                try:
                    self._on_sample(sample)
                except Exception as exc:
                    log.warning("vramscope: sample callback failed: %s", exc)

    def _loop(self) -> None:
        # Scheduled against a fixed origin so the rate does not drift by the cost of a reading.
        next_time = time.monotonic()
        while True:
            try:
                self.sample_now()
            except Exception as exc:  # collect() guards its backends; this is a last line of defence
                log.warning("vramscope: sampling failed: %s", exc)
            next_time += self.interval
            delay = next_time - time.monotonic()
            if delay < 0:  # fell behind (a slow reading): skip the missed ticks instead of bursting
                next_time = time.monotonic()
                delay = 0
            if self._stop.wait(delay):
                return
