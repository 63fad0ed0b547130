"""The one table of exporters: each one's flags, how it opens from options, and its ``where`` line.

The CLI (``run``, ``watch``) adds every exporter's flags from :data:`EXPORTERS` and opens what the parsed
flags ask for; :class:`~vramscope.training.monitor.MemoryMonitor` and both callbacks open the same rows from
their ``export={...}`` option (``{"prometheus": "9464", "push": "http://gw:9091"}``: the same names as the
flags' ``dest``). A new exporter is one module beside ``http.py`` and ``push.py`` plus one row here.

Options are a plain mapping from a flag's ``dest`` to its value (``vars(args)`` of a parsed command line, or
the monitor's ``export`` dict); a key that is absent or None is not asked for.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from vramscope.exporters.collector import (
    DEFAULT_ADDRESS,
    DEFAULT_JOB,
    DEFAULT_PUSH_INTERVAL_S,
    PrometheusBindError,
    PrometheusLabelError,
    PushgatewayURLError,
    check_labels,
)
from vramscope.types import Sample

log = logging.getLogger("vramscope.exporters")  # one logger for every exporter

Options = Mapping[str, Any]
MIN_PUSH_INTERVAL_S = 0.05  # as the sampler's shortest interval: below it a gateway is only hammered
MAX_PUSH_INTERVAL_S = 24 * 3600.0


class ExporterSink(Protocol):
    """What every exporter is: a sink with a ``where`` line, that also takes the live analysis."""

    @property
    def where(self) -> str: ...

    def write(self, sample: Sample) -> None: ...

    def set_analysis(
        self, leak_slope_bytes_per_step: float | None, steps_to_oom: float | None, gpu: int | None = None
    ) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExportContext:
    """What the opener knows besides the options: constant labels, and the run's name for a push group.

    Args:
        labels: constant labels on every series (``rank``, ``run``, ...).
        run: the name of this run (``vramscope run``: the log's stem, else host-pid-start): part of the
            Pushgateway group, so two runs on one host never overwrite each other. None: no ``run`` in the group.
    """

    labels: Mapping[str, str] = field(default_factory=dict)
    run: str | None = None


@dataclass(frozen=True)
class Flag:
    """One command-line flag of an exporter; ``parse`` turns its text into the option (ValueError: why not)."""

    name: str
    dest: str
    metavar: str
    help: str
    parse: Callable[[str], Any] | None = None
    repeat: bool = False  # may be given several times: the option is the list of values


@dataclass(frozen=True)
class Exporter:
    """One row of :data:`EXPORTERS`."""

    name: str
    flags: tuple[Flag, ...]
    asked: Callable[[Options], bool]  # whether the options ask for this exporter
    check: Callable[[Options], None]  # a mistake in the options, raised before anything starts
    open: Callable[[Options, ExportContext], ExporterSink]
    # Served for a scraper to fetch (Prometheus' /metrics): nothing would read it from a command that exits at
    # once (``watch --once``), where a pushed exporter still sends its one reading.
    scraped: bool = False


# -- the option parsers (each raises ValueError with the line to show) ---------------------------------------


def seconds(text: str) -> float:
    """A push interval: seconds, from 0.05 to a day, in ASCII digits."""
    stripped = text.strip()
    try:
        if not stripped.isascii() or len(stripped) > 32:
            raise ValueError
        value = float(stripped)
    except ValueError:
        raise ValueError(f"the push interval must be a number of seconds such as 15, got {text!r}") from None
    if not (math.isfinite(value) and MIN_PUSH_INTERVAL_S <= value <= MAX_PUSH_INTERVAL_S):
        raise ValueError(f"the push interval must be from {MIN_PUSH_INTERVAL_S:g} to {MAX_PUSH_INTERVAL_S:g} s, "
                         f"got {text!r}")
    return value


def job_name(text: str) -> str:
    """A Pushgateway job: any non-empty text up to 200 characters (prometheus_client encodes a '/' in it)."""
    name = text.strip()
    if not name or len(name) > 200:
        raise ValueError(f"--push-job takes a name such as llama-qlora, got {text!r}")
    return name


def label_pair(text: str) -> tuple[str, str]:
    """``k=v`` for ``--push-label``: a Prometheus label name and its value."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"--push-label takes NAME=VALUE such as team=nlp, got {text!r}")
    return key, value


# -- opening ------------------------------------------------------------------------------------------------


def _prometheus(options: Options, context: ExportContext) -> ExporterSink:
    from vramscope.exporters.http import PrometheusSink

    return PrometheusSink(str(options["prometheus"]), labels=dict(context.labels))


def _check_push(options: Options) -> None:
    from vramscope.exporters.push import check_push_url

    if options.get("push") is None:
        given = [flag for flag, dest in (("--push-interval", "push_interval"), ("--push-job", "push_job"),
                                         ("--push-label", "push_labels")) if options.get(dest)]
        if given:
            raise PushgatewayURLError(f"{given[0]} needs a Pushgateway to push to; add --push http://HOST:9091")
        return
    check_push_url(str(options["push"]))
    grouping = dict(options.get("push_labels") or [])
    check_labels(grouping)
    for reserved in ("job", "instance"):
        if reserved in grouping:
            raise PrometheusLabelError(f"--push-label {reserved}=... is set by vramscope; use --push-job for the job")


def push_grouping(options: Options, context: ExportContext) -> dict[str, str]:
    """The group's labels besides ``job`` that the options and the run add: ``run``, then each ``--push-label``."""
    grouping: dict[str, str] = {}
    if context.run is not None:
        grouping["run"] = context.run
    grouping.update(dict(options.get("push_labels") or []))
    return grouping


def _push(options: Options, context: ExportContext) -> ExporterSink:
    from vramscope.exporters.push import PushgatewaySink

    interval = options.get("push_interval")
    return PushgatewaySink(
        str(options["push"]),
        labels=dict(context.labels),
        interval=DEFAULT_PUSH_INTERVAL_S if interval is None else float(interval),
        job=options.get("push_job") or DEFAULT_JOB,
        grouping=push_grouping(options, context),
    )


def _relay(options: Options, context: ExportContext) -> ExporterSink:
    from vramscope.exporters.relay import RelaySink

    return RelaySink(str(options["relay"]))


def _nothing_to_check(options: Options) -> None:
    return None


PROMETHEUS = Exporter(
    name="prometheus",
    flags=(
        Flag("--prometheus", "prometheus", "[HOST:]PORT",
             f"serve /metrics for Prometheus (binds 127.0.0.1 unless HOST; e.g. {DEFAULT_ADDRESS.split(':')[1]})"),
    ),
    asked=lambda options: options.get("prometheus") is not None,
    check=lambda options: _check_address(options.get("prometheus")),
    open=_prometheus,
    scraped=True,
)

PUSHGATEWAY = Exporter(
    name="push",
    flags=(
        Flag("--push", "push", "URL", "push metrics to this Prometheus Pushgateway on a timer"),
        Flag("--push-interval", "push_interval", "S", "seconds between pushes (default 15)", parse=seconds),
        Flag("--push-job", "push_job", "NAME", f"the Pushgateway job (default {DEFAULT_JOB})", parse=job_name),
        Flag("--push-label", "push_labels", "NAME=VALUE",
             "one more label of the push group (repeatable), e.g. team=nlp", parse=label_pair, repeat=True),
    ),
    asked=lambda options: options.get("push") is not None,
    check=_check_push,
    open=_push,
)

# No flag: ``vramscope run`` names its socket to the command's Trainers (VRAMSCOPE_RELAY), whose monitors send
# their step series to the parent's exporters through it (exporters/relay.py).
RELAY = Exporter(
    name="relay",
    flags=(),
    asked=lambda options: bool(options.get("relay")),
    check=_nothing_to_check,
    open=_relay,
)

EXPORTERS: tuple[Exporter, ...] = (PROMETHEUS, PUSHGATEWAY, RELAY)


def _check_address(address: object) -> None:
    if address is not None:
        from vramscope.exporters.http import parse_address

        parse_address(str(address))


def flags(exporters: Iterable[Exporter] = EXPORTERS) -> list[Flag]:
    """Every command-line flag of the exporters, in the table's order."""
    return [flag for exporter in exporters for flag in exporter.flags]


def asked_for(options: Options, exporters: Iterable[Exporter] = EXPORTERS) -> bool:
    """Whether the options ask for any exporter (or carry an exporter's flag at all, to be checked)."""
    dests = {flag.dest for flag in flags(exporters)}
    return any(e.asked(options) for e in exporters) or any(options.get(dest) for dest in dests)


def scraped_flags(options: Options, exporters: Iterable[Exporter] = EXPORTERS) -> list[str]:
    """The flags (``--prometheus``) of the exporters ``options`` ask for that wait to be scraped."""
    return [e.flags[0].name for e in exporters if e.scraped and e.flags and e.asked(options)]


def open_exporters(
    options: Options,
    context: ExportContext | None = None,
    *,
    skip_unbindable: bool = False,
    exporters: Sequence[Exporter] = EXPORTERS,
) -> list[ExporterSink]:
    """The exporters ``options`` ask for, opened in the table's order (none when nothing is asked for).

    Every row checks its options first, so that a bad URL leaves no server behind; a failure while opening
    closes the ones already open before raising.

    Args:
        skip_unbindable: a port in use (``PrometheusBindError``) is one warning and no such exporter, not an
            error: inside a Trainer, a fact of the machine must not stop the training.

    Raises:
        PrometheusSinkError: a bad address, URL or label, a port in use, or prometheus-client missing.
    """
    context = context or ExportContext()
    known = {flag.dest for flag in flags(exporters)} | {e.name for e in exporters}
    unknown = sorted(key for key in options if key not in known)
    if unknown:
        raise ValueError(f"unknown export option {unknown[0]!r}; the options are {', '.join(sorted(known))}")
    for exporter in exporters:
        exporter.check(options)
    sinks: list[ExporterSink] = []
    try:
        for exporter in exporters:
            if not exporter.asked(options):
                continue
            try:
                sinks.append(exporter.open(options, context))
            except PrometheusBindError as exc:
                if not skip_unbindable:
                    raise
                log.warning("vramscope: not serving Prometheus metrics (%s); training goes on without them", exc)
    except BaseException:
        close_all(sinks)
        raise
    return sinks


def close_all(sinks: Sequence[Any]) -> None:
    """Close every sink, even when one fails to close."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:
            log.warning("vramscope: closing %s failed: %s", type(sink).__name__, exc)


def run_name(log_path: str | os.PathLike[str] | None, started: float | None = None) -> str:
    """The ``run`` of a ``vramscope run``: the log's stem (``runs/llama.csv`` -> ``llama``), else
    ``host-pid-YYYYmmddTHHMMSS`` (this process, its start), so that two runs on one host have two groups."""
    if log_path is not None:
        stem = os.path.splitext(os.path.basename(os.fspath(log_path)))[0]
        if stem:
            return stem
    when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if started is None else started))
    return f"{socket.gethostname()}-{os.getpid()}-{when}"
