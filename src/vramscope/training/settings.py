"""What a :class:`~vramscope.training.monitor.MemoryMonitor` is asked to do, as one frozen value.

:class:`MonitorSettings` is the one list of the in-process monitor's options: ``MemoryMonitor(...)``, the HF
and the Lightning ``MemoryMonitorCallback(...)`` all take its fields as keyword arguments (or a whole
``settings=MonitorSettings(...)``) and build it once, with :meth:`MonitorSettings.build`. A new option is one
field here (its default, its check in ``__post_init__``, its line in the docstring); every front-end takes it
from then on.

What is not an option but a thing the monitor is handed (more sinks, a fake NVML module, the stream the
warnings go to) is :class:`MonitorParts`.

``prometheus=`` is the one name of the exporter's address; the HF callback called it ``prometheus_port=``
until this release, and every front-end accepts that spelling for one more release, with one FutureWarning
line (FutureWarning: shown to the people who run the code, not only to developers as a DeprecationWarning
would be).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TextIO

from vramscope.analysis.leak import DEFAULT_CONFIG, LeakConfig
from vramscope.sampling.sampler import MIN_INTERVAL_S
from vramscope.types import Sink

MIN_HISTORY = 256  # fewer rows than this leave the leak test nothing to fit after its warm-up


def prometheus_address(port: int | str | None) -> str | None:
    """``19400`` -> ``"127.0.0.1:19400"`` (the exporter's own default host); an address with a host is kept."""
    if port is None:
        return None
    text = str(port)
    if ":" in text:
        return text
    # deferred, as the monitor opens its exporters: a monitor that exports nothing imports none of exporters/
    from vramscope.exporters.collector import DEFAULT_HOST

    return f"{DEFAULT_HOST}:{text}"


def prometheus_option(prometheus: int | str | None, prometheus_port: int | str | None,
                      stacklevel: int = 3) -> str | None:
    """The exporter's ``"HOST:PORT"`` from ``prometheus=`` or its old spelling ``prometheus_port=``.

    ``stacklevel`` is the warning's: the frame of the user's line that passed the old name, counted from here.

    Raises:
        TypeError: both were given (which one is meant cannot be guessed).
    """
    if prometheus_port is not None:
        if prometheus is not None:
            raise TypeError("give prometheus= only (prometheus_port= is its old name)")
        warnings.warn("prometheus_port= is now prometheus=; the old name works until the next release",
                      FutureWarning, stacklevel=stacklevel)
        prometheus = prometheus_port
    return prometheus_address(prometheus)


def _frozen_export(export: Mapping[str, Any] | None, prometheus: str | None) -> Mapping[str, Any]:
    merged = dict(export or {})
    if prometheus is not None:
        merged["prometheus"] = prometheus
    return MappingProxyType(merged)


@dataclass(frozen=True)
class MonitorSettings:
    """The options of the in-process monitor, checked once when built.

    Args:
        log: CSV (or ``.jsonl``) log path; None keeps rows in memory only (for ``analysis()``). Rank *k* > 0
            writes ``<stem>.rank<k><suffix>``.
        every_n_steps: log one row every this many steps (``step % every_n_steps == 0``); its peak covers all
            the steps since the previous row.
        interval: also sample every ``interval`` seconds on a background thread (rows with an empty ``step``),
            to see what happens between steps; None for step rows only.
        gpus: NVML indices to read; None reads the GPUs this process uses (matched by UUID), or every GPU when
            none is in use yet.
        oom_snapshot: record an allocator snapshot and the training context when CUDA runs out of memory
            (``vramscope.oom.OomRecorder``), into ``<log stem>.oom/`` (or into this folder when a path is
            given). Without CUDA it is off, with a warning.
        prometheus: ``"[HOST:]PORT"`` (or a port) to serve the samples and the analysis to Prometheus (a port
            in use gives one warning and no exporter, not an error); the same as ``export={"prometheus": ...}``.
            Kept as ``"HOST:PORT"`` (a bare port binds 127.0.0.1).
        export: the exporters to open, by the names of their flags' options in
            :data:`vramscope.exporters.registry.EXPORTERS`: ``{"prometheus": "9464", "push": "http://gw:9091",
            "push_interval": 15, "push_job": "llama", "push_labels": [("team", "nlp")]}``; ``prometheus`` is
            merged in. Read-only.
        warn: print throttled one-line warnings while training (always saved beside the log).
        analyze_every: run the leak test and the forecast every this many logged rows.
        analyze_min_interval_s: ... and no more often than this ...
        analyze_max_share: ... nor than keeps the analysis under this share of the wall time.
        capacity_bytes: memory to forecast against; default: the GPU's (the host's without GPU).
        max_batch_tokens: the longest batch the run can see, for the longest-batch warning.
        total_steps: the run's last step, when known: an OOM forecast beyond it is not a warning.
        leak_config: thresholds of the leak test.
        history: rows kept in memory for the analysis (at least 256): the newest half as they are, the older
            ones evenly thinned over the whole run (never all dropped).
        gather: under torch.distributed with more than one rank, gather every rank's row to rank 0's log at each
            logged step (a collective: all ranks or none must have it on).
        rank_logs: ranks other than 0 write their own ``<stem>.rank<k>`` log (their phase rows, warnings and
            analysis); False leaves rank 0's log (with ``gather``) as the only one.
        overwrite: replace a log another process left (the default, as a script run again does); False refuses
            it (``LogExistsError``, as ``vramscope run`` does without ``--overwrite``). A log this process wrote
            earlier is never overwritten: the new run writes the next free name beside it (one warning).

    Raises:
        ValueError: a number out of its range (the message says which and why).
    """

    log: str | None = None
    every_n_steps: int = 1
    interval: float | None = None
    gpus: tuple[int, ...] | None = None
    oom_snapshot: bool | str = False
    prometheus: str | None = None
    export: Mapping[str, Any] = field(default_factory=dict)
    warn: bool = True
    analyze_every: int = 25
    analyze_min_interval_s: float = 2.0
    analyze_max_share: float = 0.005
    capacity_bytes: int | None = None
    max_batch_tokens: int | None = None
    total_steps: int | None = None
    leak_config: LeakConfig = DEFAULT_CONFIG
    history: int = 8192
    gather: bool = True
    rank_logs: bool = True
    overwrite: bool = True

    def __post_init__(self) -> None:
        n = self.every_n_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"every_n_steps must be a whole number of at least 1, got {n!r}")
        if self.interval is not None and not self.interval >= MIN_INTERVAL_S:
            raise ValueError(
                f"interval must be at least {MIN_INTERVAL_S} s (or None for step rows only), got {self.interval!r}"
            )
        if self.analyze_every < 1:
            raise ValueError(f"analyze_every must be at least 1, got {self.analyze_every!r}")
        if not 0 < self.analyze_max_share <= 1:
            raise ValueError(f"analyze_max_share must be in (0, 1], got {self.analyze_max_share!r}")
        # Normalised once, here: the rest of the monitor reads plain, immutable values.
        fix = object.__setattr__  # the frozen dataclass's own way to set a field in __post_init__
        if self.log is not None:
            fix(self, "log", os.fspath(self.log))
        if self.gpus is not None:
            fix(self, "gpus", tuple(int(g) for g in self.gpus))
        if not isinstance(self.oom_snapshot, (bool, str)):  # a path-like folder (the field says str)
            fix(self, "oom_snapshot", os.fspath(self.oom_snapshot))
        fix(self, "prometheus", prometheus_address(self.prometheus))
        fix(self, "export", _frozen_export(self.export, self.prometheus))
        fix(self, "history", max(MIN_HISTORY, int(self.history)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name, in the order of the fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, settings: MonitorSettings | None = None, /, **options: Any) -> MonitorSettings:
        """``settings`` (or the defaults) with ``options`` over it: what each front-end calls with its keywords.

        ``prometheus_port=`` is read as ``prometheus=`` (with a FutureWarning that names the user's line: the
        front-end's caller, two frames above this one).

        Raises:
            TypeError: an option that is no field of :class:`MonitorSettings` (the message lists them), or
                both ``prometheus=`` and ``prometheus_port=``.
            ValueError: a value out of its range.
        """
        if "prometheus_port" in options:
            port = options.pop("prometheus_port")
            given = options.pop("prometheus", None)
            if port is not None or given is not None:
                options["prometheus"] = prometheus_option(given, port, stacklevel=4)
        unknown = sorted(set(options) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown monitor option {unknown[0]!r}; the options are: {', '.join(cls.names())}")
        base = settings if settings is not None else cls()
        if not options:
            return base
        if "prometheus" in options and "export" not in options:
            # A new address replaces the old one; the other exporters asked for stay.
            options["export"] = {k: v for k, v in base.export.items() if k != "prometheus"}
        return dataclasses.replace(base, **options)

    def with_export(self, name: str, value: Any) -> MonitorSettings:
        """These settings with one more exporter option (``with_export("relay", path)``)."""
        return dataclasses.replace(self, export={**self.export, name: value})


@dataclass(frozen=True)
class MonitorParts:
    """What a monitor is handed besides its options: objects, not settings.

    Args:
        sinks: more sinks that receive every sample.
        nvml: the NVML module (tests pass a fake one); default ``pynvml``.
        warn_stream: where warnings are printed.
    """

    sinks: tuple[Sink, ...] = ()
    nvml: Any = None
    warn_stream: TextIO | None = sys.stderr  # the stream at import, as before the settings existed

    NAMES: ClassVar[tuple[str, ...]] = ("sinks", "nvml", "warn_stream")

    @classmethod
    def take(cls, options: dict[str, Any]) -> MonitorParts:
        """Take the parts out of a front-end's keyword arguments (what stays are options)."""
        given = {name: options.pop(name) for name in cls.NAMES if name in options}
        if "sinks" in given:
            given["sinks"] = tuple(given["sinks"])
        return cls(**given)


__all__ = ["MonitorParts", "MonitorSettings", "prometheus_address", "prometheus_option"]
