"""What the exporter emits and how: the metric list, the errors, and the collector built from the latest sample.

Design, after prometheus/client_python's own ``ProcessCollector``: ``write(sample)`` only keeps a reference to the
latest :class:`~vramscope.types.Sample` and updates a few running peaks; metric families are built by
:class:`SampleCollector` when a scraper (or the pusher) asks. Missing data is an absent metric, never a fake 0.
Imports ``prometheus_client`` lazily, when an exporter is built (``vramscope run --help`` works without the extra).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from vramscope.types import AllocatorReading, Sample, gpu_of

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

DEFAULT_ADDRESS = "127.0.0.1:19400"
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
    "vramscope_host_rss_bytes": ("gauge", "Resident host memory of the watched process tree (with rank: that rank's)."),
    "vramscope_host_rss_peak_bytes": ("gauge", "Peak of vramscope_host_rss_bytes since the exporter started."),
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


def load_prometheus_client() -> Any:
    """The prometheus_client module, or PrometheusUnavailableError with the install command."""
    try:
        import prometheus_client
    except ImportError:
        raise PrometheusUnavailableError(f"Prometheus export needs prometheus-client; {INSTALL_HINT}") from None
    return prometheus_client


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The labels as strings, or PrometheusLabelError for a name Prometheus cannot take or vramscope sets."""
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
        self._labels = check_labels(labels)
        self._labels.setdefault("host", host or socket.gethostname())
        self._lock = threading.Lock()
        self._sample: Sample | None = None
        self._samples = 0
        self._version = 0  # bumped on every change, so the pusher can skip pushes of unchanged state
        # Running peaks since start, because the allocator's own peak is reset at every reading and a
        # gauge scraped every 15 s would miss the peaks in between.
        # Keyed by torch's device and UUID; the latest reading is kept to find its NVML GPU by at each scrape.
        self._allocator_peaks: dict[tuple[int, str | None], tuple[AllocatorReading, int | None, int | None]] = {}
        self._watched_peaks: dict[int, tuple[str | None, int]] = {}
        self._rss_peak: int | None = None
        self._analysis: dict[int | None, tuple[float | None, float | None]] = {}
        # The training processes' own series, relayed to this exporter by rank (``vramscope run``: the Trainers
        # in the command send them through exporters/relay.py), beside this process's own sample.
        self._ranks: dict[str, _RankState] = {}

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
            _fold_allocator_peaks(self._allocator_peaks, sample)
            self._rss_peak = _max(self._rss_peak, sample.host.rss_bytes)
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

    def update_rank(self, rank: str, sample: Sample) -> None:
        """Take a training process's own sample, relayed here: its step, phase, allocator and host memory are
        exported with its ``rank`` label, beside this process's series (the GPU-wide ones stay this process's)."""
        with self._lock:
            self._version += 1
            state = self._ranks.setdefault(rank, _RankState())
            state.sample = sample
            if sample.step is not None:  # a sample between steps keeps the last step known
                state.step = sample.step
            _fold_allocator_peaks(state.allocator_peaks, sample)
            state.rss_peak = _max(state.rss_peak, sample.host.rss_bytes)

    def set_rank_analysis(self, rank: str, analysis: Mapping[int | None, tuple[float | None, float | None]]) -> None:
        """Replace a relayed rank's leak slopes and OOM forecasts (per GPU, None: the whole run) with ``analysis``."""
        with self._lock:
            self._version += 1
            state = self._ranks.setdefault(rank, _RankState())
            state.analysis = {gpu: (_finite(slope), _finite(steps)) for gpu, (slope, steps) in analysis.items()}

    def collect(self) -> Iterator[Metric]:
        """Build the metric families from the latest state (called per scrape or push)."""
        with self._lock:
            sample = self._sample
            samples = self._samples
            allocator_peaks = dict(self._allocator_peaks)
            watched_peaks = dict(self._watched_peaks)
            rss_peak = self._rss_peak
            analysis = dict(self._analysis)
            ranks = {rank: state.copy() for rank, state in self._ranks.items()}
        base = self._base_labels(sample)
        families = _Families(base)
        if sample is not None:
            _add_sample(families, sample, allocator_peaks, watched_peaks)
            families.gauge("vramscope_host_rss_peak_bytes", {}, rss_peak)
        families.counter("vramscope_samples_total", {}, samples)
        _add_analysis(families, analysis, {})
        for rank, state in sorted(ranks.items()):
            _add_rank(families, {"rank": rank}, state)
        yield from families.done()


class _RankState:
    """What the exporter keeps of one relayed rank: its latest sample, last step, running peaks and analysis."""

    def __init__(self) -> None:
        self.sample: Sample | None = None
        self.step: int | None = None
        self.allocator_peaks: dict[tuple[int, str | None], tuple[AllocatorReading, int | None, int | None]] = {}
        self.rss_peak: int | None = None
        self.analysis: dict[int | None, tuple[float | None, float | None]] = {}

    def copy(self) -> _RankState:
        other = _RankState()
        other.sample, other.step, other.rss_peak = self.sample, self.step, self.rss_peak
        other.allocator_peaks = dict(self.allocator_peaks)
        other.analysis = dict(self.analysis)
        return other


def _fold_allocator_peaks(
    peaks: dict[tuple[int, str | None], tuple[AllocatorReading, int | None, int | None]], sample: Sample
) -> None:
    for reading in sample.allocator:
        key = (reading.device, reading.uuid)
        _, old_alloc, old_res = peaks.get(key, (reading, None, None))
        alloc = _first(reading.peak_allocated_bytes, reading.allocated_bytes)
        res = _first(reading.peak_reserved_bytes, reading.reserved_bytes)
        peaks[key] = (reading, _max(old_alloc, alloc), _max(old_res, res))


def _add_analysis(
    families: _Families, analysis: Mapping[int | None, tuple[float | None, float | None]], labels: dict[str, str]
) -> None:
    for gpu, (slope, steps) in analysis.items():
        gpu_label = {**labels, "gpu": "" if gpu is None else str(gpu)}
        families.gauge("vramscope_leak_slope_bytes_per_step", gpu_label, slope)
        families.gauge("vramscope_forecast_steps_to_oom", gpu_label, steps)


def _add_rank(families: _Families, rank: dict[str, str], state: _RankState) -> None:
    """A relayed rank's series: what its own process knows (steps, phase, allocator, its RSS, its analysis)."""
    sample = state.sample
    if sample is not None:
        families.gauge("vramscope_last_sample_timestamp_seconds", rank, sample.time)
        families.gauge("vramscope_training_step", rank, state.step)
        families.counter("vramscope_training_steps_total", rank, state.step)
        if sample.phase:
            families.gauge("vramscope_training_phase_info", {**rank, "phase": sample.phase}, 1)
        families.gauge("vramscope_host_rss_bytes", rank, sample.host.rss_bytes)
        families.gauge("vramscope_host_rss_peak_bytes", rank, state.rss_peak)
        _add_allocator(families, sample, state.allocator_peaks, rank)
    _add_analysis(families, state.analysis, rank)


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
        load_prometheus_client()  # a clear error instead of an ImportError from the line below
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
    allocator_peaks: dict[tuple[int, str | None], tuple[AllocatorReading, int | None, int | None]],
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

    for gpu in sample.gpus:
        ids = {"gpu": str(gpu.index), "uuid": gpu.uuid or ""}
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

    _add_allocator(families, sample, allocator_peaks, {})


def _add_allocator(
    families: _Families,
    sample: Sample,
    allocator_peaks: dict[tuple[int, str | None], tuple[AllocatorReading, int | None, int | None]],
    labels: dict[str, str],
) -> None:
    def ids_of(reading: AllocatorReading) -> dict[str, str]:
        # The ``gpu`` label is NVML's index, as on the GPU series, where the one GPU-to-allocator rule
        # (types.gpu_of) finds the reading's GPU in this sample; torch's index where it finds none
        # (no NVML, or a GPU this sample does not list), which is the same unless CUDA_VISIBLE_DEVICES
        # reorders the devices.
        gpu = gpu_of(reading, sample.gpus)
        return {**labels, "gpu": str(reading.device if gpu is None else gpu.index), "uuid": reading.uuid or ""}

    for reading in sample.allocator:
        ids = ids_of(reading)
        families.gauge("vramscope_allocator_allocated_bytes", ids, reading.allocated_bytes)
        families.gauge("vramscope_allocator_reserved_bytes", ids, reading.reserved_bytes)
        families.gauge("vramscope_allocator_active_bytes", ids, reading.active_bytes)
        families.gauge("vramscope_allocator_inactive_split_bytes", ids, reading.inactive_split_bytes)
        families.counter("vramscope_allocator_alloc_retries_total", ids, reading.num_alloc_retries)
        families.counter("vramscope_allocator_ooms_total", ids, reading.num_ooms)
    for _, (last, peak_alloc, peak_res) in sorted(allocator_peaks.items(), key=lambda kv: kv[0][0]):
        ids = ids_of(last)
        families.gauge("vramscope_allocator_peak_allocated_bytes", ids, peak_alloc)
        families.gauge("vramscope_allocator_peak_reserved_bytes", ids, peak_res)


class ExporterBase:
    """What both sinks share: a :class:`SampleCollector` in a registry, and the sink interface."""

    def __init__(self, labels: Mapping[str, str] | None, registry: CollectorRegistry | None) -> None:
        client = load_prometheus_client()
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
        client = load_prometheus_client()
        text: bytes = client.generate_latest(self.registry)
        return text

    def _unregister(self) -> None:
        with contextlib.suppress(KeyError):  # already gone: closing twice is harmless
            self.registry.unregister(self.collector)  # type: ignore[arg-type]


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
