"""Prometheus export: a ``/metrics`` endpoint (:class:`PrometheusSink`) and a Pushgateway pusher
(:class:`PushgatewaySink`), both fed by the sampler like any other sink.

This is the only module that imports ``prometheus_client`` (the ``vramscope[prometheus]`` extra), and it
imports it lazily, when a sink is built, so that ``vramscope run --help`` works without the extra.

Design, after prometheus/client_python's own ``ProcessCollector``:

* ``write(sample)`` only keeps a reference to the latest :class:`~vramscope.types.Sample` and updates a
  few running peaks; it builds no metric objects. The sampler calls it beside a training loop, so it
  must cost next to nothing. Metric families are built by :class:`SampleCollector` when a scraper (or
  the pusher) asks, at its own pace.
* Missing data is an absent metric, never a fake 0: a ``None`` field in the sample yields no series.
* Units live in the names (``_bytes``, ``_seconds``, ``_ratio``).

Every series carries ``host`` and, when known, ``rank``; GPU series add ``gpu`` (NVML's index) and
``uuid``; per-process series add ``pid``. Metric names are listed in :data:`METRICS` (the docs, the
Grafana dashboard and the alert rules are tested against that list).

Errors are :class:`PrometheusSinkError` subclasses, so an integration can catch one type, warn, and let
training go on: :class:`PrometheusAddressError` (bad ``[HOST:]PORT``), :class:`PrometheusBindError`
(port in use, not allowed, host not of this machine), :class:`PrometheusLabelError` (bad constant label),
:class:`PushgatewayURLError` (bad ``--push`` URL) and :class:`PrometheusUnavailableError`
(``prometheus-client`` not installed).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vramscope.sinks.metrics_http import MetricsServer
from vramscope.types import Sample

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1:9400"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PUSH_INTERVAL_S = 15.0
DEFAULT_PUSH_TIMEOUT_S = 5.0
DEFAULT_JOB = "vramscope"
INSTALL_HINT = "pip install 'vramscope[prometheus]'"

# Label names the exporter sets itself per series; user labels may not take them.
SERIES_LABELS = ("gpu", "uuid", "pid", "name", "phase")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# name -> (type, help). The single list of what the exporter can emit: tests check the dashboard and the
# alert rules against it, and that every entry really appears in an exposition of a full sample.
METRICS: dict[str, tuple[str, str]] = {
    "vramscope_gpu_info": ("gauge", "Always 1; labels name each GPU (gpu index, uuid, model name)."),
    "vramscope_gpu_memory_used_bytes": ("gauge", "GPU memory in use on the device (nvidia-smi memory.used)."),
    "vramscope_gpu_memory_total_bytes": ("gauge", "GPU memory capacity (nvidia-smi memory.total)."),
    "vramscope_gpu_memory_free_bytes": ("gauge", "GPU memory free (nvidia-smi memory.free)."),
    "vramscope_gpu_memory_driver_reserved_bytes": ("gauge", "GPU memory the driver and firmware keep back."),
    "vramscope_gpu_utilization_ratio": ("gauge", "GPU busy fraction over NVML's last period, 0 to 1."),
    "vramscope_gpu_process_memory_bytes": ("gauge", "GPU memory held by one compute process."),
    "vramscope_watched_gpu_memory_bytes": ("gauge", "GPU memory held by the watched process tree."),
    "vramscope_watched_gpu_memory_peak_bytes": ("gauge", "Peak of the watched tree's GPU memory since start."),
    "vramscope_allocator_allocated_bytes": ("gauge", "Memory handed out to tensors by torch's caching allocator."),
    "vramscope_allocator_reserved_bytes": ("gauge", "Memory torch's caching allocator holds from the driver."),
    "vramscope_allocator_active_bytes": ("gauge", "Memory in active allocator blocks."),
    "vramscope_allocator_inactive_split_bytes": (
        "gauge",
        "Cached but unusable memory in split blocks: the allocator's fragmentation.",
    ),
    "vramscope_allocator_peak_allocated_bytes": ("gauge", "Peak allocated memory since the exporter started."),
    "vramscope_allocator_peak_reserved_bytes": ("gauge", "Peak reserved memory since the exporter started."),
    "vramscope_allocator_alloc_retries_total": ("counter", "Allocations retried after freeing the cache."),
    "vramscope_allocator_ooms_total": ("counter", "Out-of-memory errors the allocator raised."),
    "vramscope_host_rss_bytes": ("gauge", "Resident host memory of the watched process tree."),
    "vramscope_host_memory_used_bytes": ("gauge", "Host memory in use on the machine."),
    "vramscope_host_memory_total_bytes": ("gauge", "Host memory of the machine."),
    "vramscope_training_step": ("gauge", "Training step of the latest sample (kept for old dashboards)."),
    # rate() and increase() want a counter: a restarted run starts again from its resumed step, which
    # Prometheus reads as a counter reset.
    "vramscope_training_steps_total": ("counter", "Training steps done: the latest sample's step, for rate()."),
    "vramscope_training_phase_info": ("gauge", "Always 1; the phase label names the phase now (train, eval, ...)."),
    "vramscope_leak_slope_bytes_per_step": ("gauge", "Fitted growth of memory per step (leak trend)."),
    "vramscope_forecast_steps_to_oom": ("gauge", "Steps left until memory runs out at the current trend."),
    "vramscope_last_sample_timestamp_seconds": ("gauge", "Unix time of the latest sample."),
    "vramscope_samples_total": ("counter", "Samples the exporter has received."),
}


class PrometheusSinkError(Exception):
    """Base of every error this module raises; catch it to warn and carry on without the exporter."""


class PrometheusAddressError(PrometheusSinkError, ValueError):
    """A listen address that is not ``[HOST:]PORT``."""


class PrometheusBindError(PrometheusSinkError, OSError):
    """The exporter cannot listen where asked (port in use, port not allowed, host not of this machine)."""


class PrometheusLabelError(PrometheusSinkError, ValueError):
    """A constant label that Prometheus cannot take, or that vramscope sets per series."""


class PushgatewayURLError(PrometheusSinkError, ValueError):
    """A Pushgateway URL that is not ``http(s)://HOST[:PORT][/PATH]``."""


class PrometheusUnavailableError(PrometheusSinkError, ImportError):
    """``prometheus-client`` is not installed."""


def parse_address(text: str) -> tuple[str, int]:
    """Read ``"[HOST:]PORT"`` into ``(host, port)``; the host defaults to 127.0.0.1.

    ``"9400"`` -> ``("127.0.0.1", 9400)``, ``"0.0.0.0:9400"`` -> all interfaces, ``"[::1]:9400"`` -> IPv6.
    Port 0 asks the system for a free port (see :attr:`PrometheusSink.port`).

    Raises:
        PrometheusAddressError: with the accepted forms.
    """
    raw = text.strip()
    host = DEFAULT_HOST
    port_text = raw
    if raw.startswith("["):  # [IPv6]:PORT
        end = raw.find("]")
        if end < 0 or raw[end + 1 : end + 2] != ":":
            raise PrometheusAddressError(f"cannot read {text!r} as an address; write an IPv6 one as [::1]:9400")
        host, port_text = raw[1:end], raw[end + 2 :]
    elif ":" in raw:
        host, _, port_text = raw.rpartition(":")
        if ":" in host:
            raise PrometheusAddressError(f"cannot read {text!r} as an address; write an IPv6 one as [::1]:9400")
    if not host:
        # Prometheus reads ":9400" as "every interface"; we never widen exposure without an explicit host.
        raise PrometheusAddressError(
            f"no host before ':' in {text!r}; give just the port (binds 127.0.0.1) or 0.0.0.0:PORT for every interface"
        )
    # ASCII digits only, as every number vramscope reads ("٩٤٠٠".isdigit() is true too), and short.
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5) or int(port_text) > 65535:
        shown = repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"
        raise PrometheusAddressError(f"cannot read {shown} as [HOST:]PORT; write e.g. 9400 or 0.0.0.0:9400")
    return host, int(port_text)


def _prometheus_client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise PrometheusUnavailableError(f"Prometheus export needs prometheus-client; {INSTALL_HINT}") from None
    return prometheus_client


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    checked: dict[str, str] = {}
    for key, value in (labels or {}).items():
        if not _LABEL_NAME.match(key) or key.startswith("__"):
            raise PrometheusLabelError(
                f"label name {key!r} is not valid in Prometheus; use letters, digits and '_', not starting with '__'"
            )
        if key in SERIES_LABELS:
            raise PrometheusLabelError(f"label {key!r} is set per series by vramscope; choose another name")
        checked[key] = str(value)
    return checked


class SampleCollector:
    """A prometheus_client collector over the latest sample (``collect() -> Iterable[Metric]``).

    Thread-safe: the sampler thread calls :meth:`update` and :meth:`set_analysis`; scrapes call
    :meth:`collect` from the HTTP server's threads.

    Args:
        labels: constant labels put on every series (``rank`` here wins over the samples' own rank).
        host: the ``host`` label; defaults to this machine's hostname.
    """

    def __init__(self, labels: Mapping[str, str] | None = None, host: str | None = None) -> None:
        self._labels = _check_labels(labels)
        self._labels.setdefault("host", host or socket.gethostname())
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._samples = 0
        self._version = 0  # bumped on every change, so the pusher can skip pushes of unchanged state
        # Running peaks since start, because the allocator's own peak is reset at every reading and a
        # gauge scraped every 15 s would miss the peaks in between.
        self._allocator_peaks: dict[tuple[int, str | None], tuple[int | None, int | None]] = {}
        self._watched_peaks: dict[int, tuple[str | None, int]] = {}
        self._analysis: dict[int | None, tuple[float | None, float | None]] = {}

    @property
    def version(self) -> int:
        """A number that changes whenever the exported state changes."""
        return self._version

    def base_labels(self) -> dict[str, str]:
        """Labels every series carries now: the constant ones, ``host``, and ``rank`` when known."""
        with self._lock:
            return self._base_labels(self._sample)

    def _base_labels(self, sample: Sample | None) -> dict[str, str]:
        labels = dict(self._labels)
        rank = sample.extra.get("rank") if sample is not None else None
        if "rank" not in labels and rank is not None:
            labels["rank"] = str(rank)
        return labels

    def update(self, sample: Sample) -> None:
        """Take a new sample: O(GPUs) work, no metric objects."""
        watched = [(gpu.index, gpu.uuid, sample.process_bytes(gpu.index)) for gpu in sample.gpus]
        with self._lock:
            self._sample = sample
            self._samples += 1
            self._version += 1
            for reading in sample.allocator:
                key = (reading.device, reading.uuid)
                old_alloc, old_res = self._allocator_peaks.get(key, (None, None))
                alloc = _first(reading.peak_allocated_bytes, reading.allocated_bytes)
                res = _first(reading.peak_reserved_bytes, reading.reserved_bytes)
                self._allocator_peaks[key] = (_max(old_alloc, alloc), _max(old_res, res))
            for index, uuid, used in watched:
                if used is not None:
                    old = self._watched_peaks.get(index)
                    if old is None or used > old[1]:
                        self._watched_peaks[index] = (uuid, used)

    def set_analysis(
        self, leak_slope_bytes_per_step: float | None, steps_to_oom: float | None, gpu: int | None = None
    ) -> None:
        """Set (or, with None, withdraw) the leak slope and the OOM forecast for ``gpu`` (None: whole run)."""
        with self._lock:
            self._version += 1
            if leak_slope_bytes_per_step is None and steps_to_oom is None:
                self._analysis.pop(gpu, None)
            else:
                self._analysis[gpu] = (_finite(leak_slope_bytes_per_step), _finite(steps_to_oom))

    def collect(self) -> Iterator[Metric]:
        """Build the metric families from the latest state (called per scrape or push)."""
        with self._lock:
            sample = self._sample
            samples = self._samples
            allocator_peaks = dict(self._allocator_peaks)
            watched_peaks = dict(self._watched_peaks)
            analysis = dict(self._analysis)
        base = self._base_labels(sample)
        families = _Families(base)
        if sample is not None:
            _add_sample(families, sample, allocator_peaks, watched_peaks)
        families.counter("vramscope_samples_total", {}, samples)
        for gpu, (slope, steps) in analysis.items():
            gpu_label = {"gpu": "" if gpu is None else str(gpu)}
            families.gauge("vramscope_leak_slope_bytes_per_step", gpu_label, slope)
            families.gauge("vramscope_forecast_steps_to_oom", gpu_label, steps)
        yield from families.done()


class _Families:
    """Collects samples per metric name, then yields only the families that got at least one."""

    def __init__(self, base: dict[str, str]) -> None:
        self._base = base
        self._series: dict[str, list[tuple[dict[str, str], float]]] = {}

    def gauge(self, name: str, labels: dict[str, str], value: float | None) -> None:
        if value is not None:  # unknown stays absent
            self._series.setdefault(name, []).append(({**self._base, **labels}, float(value)))

    counter = gauge

    def done(self) -> Iterator[Metric]:
        _prometheus_client()  # a clear error instead of an ImportError from the line below
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, series in self._series.items():
            kind, help_text = METRICS[name]
            if kind == "counter":
                metric: Any = CounterMetricFamily(name.removesuffix("_total"), help_text)
            else:
                metric = GaugeMetricFamily(name, help_text)
            for labels, value in series:
                metric.add_sample(metric.name + ("_total" if kind == "counter" else ""), labels, value)
            yield metric


def _add_sample(
    families: _Families,
    sample: Sample,
    allocator_peaks: dict[tuple[int, str | None], tuple[int | None, int | None]],
    watched_peaks: dict[int, tuple[str | None, int]],
) -> None:
    families.gauge("vramscope_last_sample_timestamp_seconds", {}, sample.time)
    families.gauge("vramscope_training_step", {}, sample.step)
    families.counter("vramscope_training_steps_total", {}, sample.step)
    if sample.phase:
        families.gauge("vramscope_training_phase_info", {"phase": sample.phase}, 1)
    families.gauge("vramscope_host_rss_bytes", {}, sample.host.rss_bytes)
    families.gauge("vramscope_host_memory_used_bytes", {}, sample.host.system_used_bytes)
    families.gauge("vramscope_host_memory_total_bytes", {}, sample.host.system_total_bytes)

    index_by_uuid: dict[str, int] = {}
    for gpu in sample.gpus:
        ids = {"gpu": str(gpu.index), "uuid": gpu.uuid or ""}
        if gpu.uuid:
            index_by_uuid[gpu.uuid] = gpu.index
        families.gauge("vramscope_gpu_info", {**ids, "name": gpu.name or ""}, 1)
        families.gauge("vramscope_gpu_memory_used_bytes", ids, gpu.used_bytes)
        families.gauge("vramscope_gpu_memory_total_bytes", ids, gpu.total_bytes)
        families.gauge("vramscope_gpu_memory_free_bytes", ids, gpu.free_bytes)
        families.gauge("vramscope_gpu_memory_driver_reserved_bytes", ids, gpu.reserved_bytes)
        util = gpu.utilization_pct
        families.gauge("vramscope_gpu_utilization_ratio", ids, None if util is None else util / 100)
        for proc in gpu.processes:
            families.gauge("vramscope_gpu_process_memory_bytes", {**ids, "pid": str(proc.pid)}, proc.gpu_bytes)
        families.gauge("vramscope_watched_gpu_memory_bytes", ids, sample.process_bytes(gpu.index))
    for index, (uuid, peak) in sorted(watched_peaks.items()):
        families.gauge("vramscope_watched_gpu_memory_peak_bytes", {"gpu": str(index), "uuid": uuid or ""}, peak)

    def ids_of(device: int, uuid: str | None) -> dict[str, str]:
        # NVML's index where the UUID joins the allocator to an NVML reading; torch's index otherwise
        # (the same unless CUDA_VISIBLE_DEVICES reorders devices).
        index = index_by_uuid.get(uuid, device) if uuid else device
        return {"gpu": str(index), "uuid": uuid or ""}

    for reading in sample.allocator:
        ids = ids_of(reading.device, reading.uuid)
        families.gauge("vramscope_allocator_allocated_bytes", ids, reading.allocated_bytes)
        families.gauge("vramscope_allocator_reserved_bytes", ids, reading.reserved_bytes)
        families.gauge("vramscope_allocator_active_bytes", ids, reading.active_bytes)
        families.gauge("vramscope_allocator_inactive_split_bytes", ids, reading.inactive_split_bytes)
        families.counter("vramscope_allocator_alloc_retries_total", ids, reading.num_alloc_retries)
        families.counter("vramscope_allocator_ooms_total", ids, reading.num_ooms)
    for (device, uuid), (peak_alloc, peak_res) in sorted(allocator_peaks.items(), key=lambda kv: kv[0][0]):
        ids = ids_of(device, uuid)
        families.gauge("vramscope_allocator_peak_allocated_bytes", ids, peak_alloc)
        families.gauge("vramscope_allocator_peak_reserved_bytes", ids, peak_res)


class _Exporter:
    """What both sinks share: a :class:`SampleCollector` in a registry, and the sink interface."""

    def __init__(self, labels: Mapping[str, str] | None, registry: CollectorRegistry | None) -> None:
        client = _prometheus_client()
        self.collector = SampleCollector(labels)
        self.registry: CollectorRegistry = registry if registry is not None else client.CollectorRegistry()
        self.registry.register(self.collector)  # type: ignore[arg-type]
        self._closed = False

    def write(self, sample: Sample) -> None:
        """Hand the exporter a new sample (cheap: a reference and a few running peaks)."""
        self.collector.update(sample)

    def set_analysis(
        self, leak_slope_bytes_per_step: float | None, steps_to_oom: float | None, gpu: int | None = None
    ) -> None:
        """Export the leak slope and the steps-to-OOM forecast; None for both withdraws them for ``gpu``.

        Args:
            leak_slope_bytes_per_step: fitted memory growth per step; None when unknown.
            steps_to_oom: steps until memory runs out at that trend; None when no OOM is in sight.
            gpu: the GPU index it is about (the ``gpu`` label), or None for the whole run.
        """
        self.collector.set_analysis(leak_slope_bytes_per_step, steps_to_oom, gpu)

    def exposition(self) -> bytes:
        """The current metrics in Prometheus' text format (what a scrape returns)."""
        client = _prometheus_client()
        text: bytes = client.generate_latest(self.registry)
        return text

    def _unregister(self) -> None:
        with contextlib.suppress(KeyError):  # already gone: closing twice is harmless
            self.registry.unregister(self.collector)  # type: ignore[arg-type]


class PrometheusSink(_Exporter):
    """Serves ``/metrics`` over HTTP for Prometheus to scrape, from the latest sample.

    The server starts at construction, on daemon threads, and stops at :meth:`close`.

    Args:
        address: ``"[HOST:]PORT"``; binds 127.0.0.1 unless a host is given (``0.0.0.0:9400`` for every
            interface). Port 0 picks a free port, readable as :attr:`port`.
        labels: constant labels on every series, e.g. ``{"rank": "0", "run": "llama-qlora"}``.
        registry: a ``prometheus_client.CollectorRegistry`` to register into and serve (so that your own
            metrics share the endpoint); default: a fresh one holding only vramscope's collector.

    Raises:
        PrometheusAddressError: ``address`` is not ``[HOST:]PORT``.
        PrometheusLabelError: a label name is not valid or is one vramscope sets per series.
        PrometheusBindError: the port is in use or not allowed, or the host is not of this machine.
        PrometheusUnavailableError: prometheus-client is not installed.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        labels: dict[str, str] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        host, port = parse_address(address)
        super().__init__(labels, registry)
        try:
            self._server = _serve(host, port, self._render)
        except PrometheusBindError:
            self._unregister()
            raise
        self.host = host
        self.port: int = self._server.server_port
        log.info("vramscope: serving Prometheus metrics at %s", self.url)
        if self.every_interface:
            log.warning("vramscope: warning: %s", self.exposure)

    @property
    def every_interface(self) -> bool:
        """True when bound to every interface (0.0.0.0 or ::): reachable from the network."""
        return self.host in ("0.0.0.0", "::", "")

    @property
    def exposure(self) -> str:
        """The one-line warning for a server open to the network."""
        return (f"the metrics on port {self.port} can be read by anyone who can reach this machine (host name, "
                "GPUs, process ids); give just the port to keep them on 127.0.0.1")

    def _render(self, accept: str, query: str) -> tuple[bytes, str]:
        """A scrape's answer, as prometheus_client's own server gives it (format by Accept, ``name[]`` filters)."""
        encoder, content_type = _prometheus_client().exposition.choose_encoder(accept)
        names = urllib.parse.parse_qs(query).get("name[]")
        registry = self.registry.restricted_registry(names) if names else self.registry
        body: bytes = encoder(registry)
        return body, content_type

    @property
    def url(self) -> str:
        """Where the metrics are, e.g. ``http://127.0.0.1:9400/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def where(self) -> str:
        """One line for people: where the metrics are served."""
        return f"serving Prometheus metrics at {self.url}"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.close()
        self._unregister()


def _serve(host: str, port: int, render: Any) -> MetricsServer:
    """The bounded metrics server (sinks/metrics_http.py) on ``host:port``, bind failures as one clear line."""
    where = f"{host}:{port}"
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise PrometheusBindError(f"cannot listen on {where}: unknown host ({exc.strerror}); check the name") from None
    try:
        return MetricsServer(host, port, family, render)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = f"port {port} on {host} is already in use; choose another port (or stop what listens there)"
        elif exc.errno == errno.EACCES:
            why = f"not allowed to listen on port {port}; choose a port above 1023"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"{host} is not an address of this machine; use 127.0.0.1 or one of its own addresses"
        else:
            why = f"cannot listen on {where}: {exc.strerror or exc}"
        raise PrometheusBindError(why) from None


def check_push_url(url: str) -> str:
    """Validate a Pushgateway URL (``http(s)://HOST[:PORT][/PATH]``) and return it without a trailing '/'.

    Raises:
        PushgatewayURLError: with the accepted form.
    """
    parts = urllib.parse.urlsplit(url.strip())
    example = "e.g. http://pushgateway:9091"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushgatewayURLError(f"cannot push to {url!r}: give the Pushgateway as http(s)://HOST[:PORT], {example}")
    try:
        parts.port  # noqa: B018 - reading it validates it
    except ValueError:
        raise PushgatewayURLError(f"cannot push to {url!r}: the port is not a number, {example}") from None
    if parts.query or parts.fragment:
        raise PushgatewayURLError(f"cannot push to {url!r}: drop the '?...' or '#...' part, {example}")
    return url.strip().rstrip("/")


class PushgatewaySink(_Exporter):
    """Pushes the metrics to a Prometheus Pushgateway every ``interval`` seconds, on its own thread.

    For nodes that Prometheus cannot scrape (batch jobs, firewalled workers). A push replaces the
    group's previous one (HTTP PUT). Pushes happen on the timer, never per sample, and only when something
    changed; :meth:`close` makes a last push so that the end state of a short run is on record. A failed
    push is logged once (per cause) and retried at the next tick: a gateway that is down never stops
    training.

    The group is ``job`` plus ``instance`` (the host) and, when known, ``rank``: several ranks on one host
    push to separate groups. Two runs on one host with no rank overwrite each other's group unless you
    give them different ``job`` names.

    Args:
        url: the gateway, ``http(s)://HOST[:PORT][/PATH]``.
        labels: constant labels on every series.
        interval: seconds between pushes.
        job: the ``job`` of the group.
        timeout: seconds one push may take before it is given up.
        registry: a registry to register into and push (your own metrics ride along).
        delete_on_close: remove the group from the gateway at :meth:`close` instead of a last push.

    Raises:
        PushgatewayURLError: ``url`` is not an http(s) URL.
        PrometheusLabelError: a label name is not valid or is one vramscope sets per series.
        PrometheusUnavailableError: prometheus-client is not installed.
    """

    def __init__(
        self,
        url: str,
        labels: dict[str, str] | None = None,
        interval: float = DEFAULT_PUSH_INTERVAL_S,
        job: str = DEFAULT_JOB,
        timeout: float = DEFAULT_PUSH_TIMEOUT_S,
        registry: CollectorRegistry | None = None,
        delete_on_close: bool = False,
    ) -> None:
        self.url = check_push_url(url)
        if not interval > 0:
            raise ValueError(f"push interval must be positive, got {interval}")
        super().__init__(labels, registry)
        self.job = job
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.pushes = 0  # successful pushes, for tests and the curious
        self._delete_on_close = delete_on_close
        self._pushed_version = -1
        self._grouping: dict[str, str] | None = None
        self._failures: set[str] = set()
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vramscope-pushgateway", daemon=True)
        self._thread.start()

    def grouping_key(self) -> dict[str, str]:
        """The group's labels besides ``job``: fixed at the first push, so a group never moves."""
        if self._grouping is None:
            base = self.collector.base_labels()
            self._grouping = {"instance": base["host"]}
            if "rank" in base:
                self._grouping["rank"] = base["rank"]
        return self._grouping

    @property
    def where(self) -> str:
        """One line for people: where the metrics go."""
        return f"pushing metrics to {self.url} every {self.interval:g} s (job {self.job!r})"

    def push_now(self) -> bool:
        """Push the current state now if it changed since the last push; True when the gateway has it."""
        with self._push_lock:
            version = self.collector.version
            if version == self._pushed_version:
                return True
            if version == 0:  # nothing written yet: an empty push would only erase an older group
                return False
            client = _prometheus_client()
            try:
                client.push_to_gateway(
                    self.url,
                    job=self.job,
                    registry=self.registry,
                    grouping_key=self.grouping_key(),
                    timeout=self.timeout,
                )
            except Exception as exc:  # urllib's URLError, HTTPError, socket timeouts: never fatal
                self._warn(exc)
                return False
            self._pushed_version = version
            self.pushes += 1
            if self._failures:
                log.warning("vramscope: pushing to %s works again", self.url)
                self._failures.clear()
            return True

    def _warn(self, exc: Exception) -> None:
        cause = f"{type(exc).__name__}: {exc}"
        if cause not in self._failures:
            self._failures.add(cause)
            log.warning(
                "vramscope: cannot push metrics to %s (%s); retrying every %g s", self.url, cause, self.interval
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.push_now()

    def close(self) -> None:
        """Stop the timer and make the last push (or delete the group); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=self.timeout + 1.0)
        if self._delete_on_close:
            try:
                _prometheus_client().delete_from_gateway(
                    self.url, job=self.job, grouping_key=self.grouping_key(), timeout=self.timeout
                )
            except Exception as exc:
                self._warn(exc)
        else:
            self.push_now()
        self._unregister()


def open_exporters(
    prometheus: str | None = None,
    push: str | None = None,
    push_interval: float | None = None,
    labels: dict[str, str] | None = None,
) -> list[PrometheusSink | PushgatewaySink]:
    """The sinks that ``--prometheus ADDRESS`` and ``--push URL`` ask for (none when both are None).

    Built together so that a failure closes the one already started before raising.

    Raises:
        PrometheusSinkError: a bad address or URL, a port in use, or prometheus-client missing.
    """
    if push is None and push_interval is not None:
        raise PushgatewayURLError("a push interval needs a Pushgateway to push to; add --push http://HOST:9091")
    sinks: list[PrometheusSink | PushgatewaySink] = []
    try:
        if push is not None:
            check_push_url(push)  # before a server starts, so a bad URL leaves nothing behind
        if prometheus is not None:
            sinks.append(PrometheusSink(prometheus, labels=labels))
        if push is not None:
            interval = DEFAULT_PUSH_INTERVAL_S if push_interval is None else push_interval
            sinks.append(PushgatewaySink(push, labels=labels, interval=interval))
    except BaseException:
        close_all(sinks)
        raise
    return sinks


def close_all(sinks: Sequence[PrometheusSink | PushgatewaySink]) -> None:
    """Close every sink, even when one fails to close."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:
            log.warning("vramscope: closing %s failed: %s", type(sink).__name__, exc)


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _first(peak: int | None, current: int) -> int:
    # A reading without a peak counter still bounds the peak from below with its current value.
    return peak if peak is not None else current


def _finite(value: float | None) -> float | None:
    # NaN or inf from a degenerate fit is "unknown" here: Prometheus would store it, alerts would misfire.
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)
