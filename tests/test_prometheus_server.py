"""The exporter against a real Prometheus server (Debian's ``prometheus`` package).

The server is started here, never as a system service: on a free loopback port, with a temporary
config and storage folder, and stopped at the end. One server serves every test: its config lists a few
loopback ports reserved up front (service discovery would add a 5 s update delay per target), each
labelled ``test=slotN``; a test claims a slot, listens on its port, and selects ``{test="slotN"}`` in
PromQL. Every wait is bounded.

The helpers at the top (``free_port``, ``wait_for``, :class:`Daemon`, :class:`Gateway`) are also used by
``test_pushgateway.py``; the Pushgateway -> Prometheus test is here, to share this module's server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_prometheus import GIB, training_sample
from vramscope.exporters import PrometheusSink, PushgatewaySink

T = TypeVar("T")

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs the prometheus binary (Debian: apt-get install -y prometheus)"
)
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian: apt-get install -y prometheus)")

needs_pushgateway = pytest.mark.skipif(
    PUSHGATEWAY is None, reason="needs the Pushgateway (Debian: apt-get install -y prometheus-pushgateway)"
)
HOST = socket.gethostname()
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]

SCRAPE_INTERVAL_S = 0.25  # fast scrapes keep the tests short; Prometheus accepts sub-second intervals
WAIT_S = 20.0  # upper bound for any wait on a server; a healthy run needs a second or two


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
    """Poll ``probe`` until it returns something other than None (or falsy), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


class Daemon:
    """A server binary started by a test, ready when ``ready_url`` answers 200, stopped by :meth:`stop`."""

    def __init__(self, argv: list[str], ready_url: str, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def ready() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"{argv[0]} exited with {self.process.returncode}: {self.log()}")
            try:
                http_get(ready_url, timeout=1.0)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
            return True

        try:
            wait_for(ready, f"{argv[0]} to be ready")
        except BaseException:
            self.stop()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()


class PrometheusServer:
    """A real Prometheus on 127.0.0.1 that scrapes ``slots`` reserved loopback ports."""

    def __init__(self, root: Path, slots: int = 8) -> None:
        assert PROMETHEUS is not None
        self.root = root
        # Each slot's port stays bound (not listening) until claimed, so that no other free_port() in the
        # session, nor another program, can take it in between.
        self._free: list[tuple[socket.socket, int, str]] = []
        targets = ""
        for n in range(slots):
            holder = socket.socket()
            holder.bind(("127.0.0.1", 0))
            port = holder.getsockname()[1]
            self._free.append((holder, port, f"slot{n}"))
            targets += f"      - targets: ['127.0.0.1:{port}']\n        labels: {{test: slot{n}}}\n"
        config = root / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {int(SCRAPE_INTERVAL_S * 1000)}ms\n"
            f"  scrape_timeout: {int(SCRAPE_INTERVAL_S * 800)}ms\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: vramscope\n"
            "    honor_labels: true  # as for a Pushgateway; harmless for the exporter, which sets no job\n"
            "    static_configs:\n" + targets
        )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.daemon = Daemon(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            f"{self.url}/-/ready",
            root / "prometheus.log",
        )

    def claim(self) -> tuple[int, str]:
        """A port that Prometheus scrapes, and the ``test`` label of its series; each is used once."""
        if not self._free:
            pytest.fail("no scrape slot left; raise PrometheusServer(slots=...)")
        holder, port, label = self._free.pop(0)
        holder.close()
        return port, label

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant PromQL query through the HTTP API; fails the test on a query error."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as exc:
            pytest.fail(f"PromQL {expr!r} was refused: {exc.read().decode(errors='replace')}")
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for_value(self, expr: str, timeout: float = WAIT_S) -> float:
        """The value of a query that returns one series, once it does."""

        def probe() -> list[dict[str, Any]] | None:
            return self.query(expr) or None

        result = wait_for(probe, f"PromQL {expr!r} to return data", timeout)
        assert len(result) == 1, "; ".join(str(sorted(r["metric"].items())) for r in result)
        return float(result[0]["value"][1])

    def stop(self) -> None:
        self.daemon.stop()
        for holder, _, _ in self._free:
            holder.close()


class Gateway:
    """A real Pushgateway on 127.0.0.1:``port``."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        assert PUSHGATEWAY is not None
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.daemon = Daemon(
            [
                PUSHGATEWAY,
                f"--web.listen-address=127.0.0.1:{self.port}",
                # Debian's build persists to /var/lib/prometheus by default; a test keeps its groups in memory.
                "--persistence.file=",
                "--log.level=warn",
            ],
            f"{self.url}/-/ready",
            root / f"pushgateway-{self.port}.log",
        )

    def series(self) -> Series:
        found: Series = {}
        for family in text_string_to_metric_families(http_get(f"{self.url}/metrics").decode()):
            for s in family.samples:
                found[(s.name, frozenset(s.labels.items()))] = s.value
        return found

    def values(self, metric: str, /, **labels: str) -> list[float]:
        want = set(labels.items())
        return [v for (n, lab), v in self.series().items() if n == metric and want <= lab]

    def wait_for_value(self, metric: str, /, **labels: str) -> float:
        found = wait_for(lambda: self.values(metric, **labels) or None, f"{metric}{labels} on the gateway")
        assert len(found) == 1, found
        return found[0]

    def put_requests(self) -> float:
        """Successful PUTs the gateway has counted (its own metric): how often we really pushed."""
        return sum(self.values("pushgateway_http_requests_total", code="200", handler="push", method="put"))

    def stop(self) -> None:
        self.daemon.stop()


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    if PROMETHEUS is None:
        pytest.skip("needs the prometheus binary (Debian: apt-get install -y prometheus)")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"))
    yield server
    server.stop()


# -- scraping the exporter --------------------------------------------------------------------------------


@pytest.mark.slow  # a real Prometheus server's scrape interval
@needs_prometheus
def test_prometheus_scrapes_the_exporter_and_promql_returns_the_values(prometheus: PrometheusServer) -> None:
    port, slot = prometheus.claim()
    sink = PrometheusSink(f"127.0.0.1:{port}")
    try:
        sink.write(training_sample(step=120))
        sink.set_analysis(leak_slope_bytes_per_step=3 * 1024**2, steps_to_oom=900.0, gpu=0)
        sel = f'test="{slot}"'

        assert prometheus.wait_for_value(f'vramscope_gpu_memory_used_bytes{{{sel},gpu="0"}}') == 20 * GIB
        assert prometheus.wait_for_value(f'vramscope_gpu_memory_total_bytes{{{sel},gpu="1"}}') == 141 * GIB
        # per process, and summed by PromQL over both GPUs
        pid = os.getpid()
        assert prometheus.wait_for_value(f'vramscope_gpu_process_memory_bytes{{{sel},pid="{pid}"}}') == 18 * GIB
        assert prometheus.wait_for_value(f"sum(vramscope_gpu_process_memory_bytes{{{sel}}})") == 19 * GIB
        # the share of capacity the alert rule computes
        share = prometheus.wait_for_value(
            f'vramscope_gpu_memory_used_bytes{{{sel},gpu="0"}} / vramscope_gpu_memory_total_bytes{{{sel},gpu="0"}}'
        )
        assert share == pytest.approx(20 / 141)
        assert prometheus.wait_for_value(f"vramscope_allocator_reserved_bytes{{{sel}}}") == 12 * GIB
        assert prometheus.wait_for_value(f"vramscope_allocator_inactive_split_bytes{{{sel}}}") == 512 * 1024**2
        assert prometheus.wait_for_value(f'vramscope_training_step{{{sel},rank="1"}}') == 120
        assert prometheus.wait_for_value(f"vramscope_leak_slope_bytes_per_step{{{sel}}}") == 3 * 1024**2
        assert prometheus.wait_for_value(f"vramscope_forecast_steps_to_oom{{{sel}}}") == 900
        # the labels Prometheus stored
        (series,) = prometheus.query(f'vramscope_gpu_memory_used_bytes{{{sel},gpu="0"}}')
        labels = series["metric"]
        assert labels["host"] == socket.gethostname()
        assert labels["rank"] == "1"
        assert labels["uuid"] == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
        assert labels["instance"] == f"127.0.0.1:{sink.port}"
        # the scrape itself was healthy
        assert prometheus.wait_for_value(f"up{{{sel}}}") == 1
    finally:
        sink.close()


@needs_prometheus
def test_absent_values_stay_absent_in_prometheus(prometheus: PrometheusServer) -> None:
    import fake_nvml
    from test_prometheus import nvml_sample

    port, slot = prometheus.claim()
    sink = PrometheusSink(f"127.0.0.1:{port}")
    try:
        sink.write(nvml_sample(fake_nvml.not_supported_fields()))
        assert prometheus.wait_for_value(f'vramscope_gpu_memory_used_bytes{{test="{slot}"}}') == 5 * GIB
        # after a successful scrape, the fields NVML could not read have no series at all
        assert prometheus.query(f'vramscope_gpu_utilization_ratio{{test="{slot}"}}') == []
        assert prometheus.query(f'vramscope_gpu_process_memory_bytes{{test="{slot}"}}') == []
        assert prometheus.query(f'{{test="{slot}", __name__=~"vramscope_allocator_.*"}}') == []
    finally:
        sink.close()


# -- vramscope run, end to end ----------------------------------------------------------------------------


@needs_prometheus
def test_vramscope_run_is_scraped_while_the_command_runs(prometheus: PrometheusServer, tmp_path: Path) -> None:
    port, slot = prometheus.claim()
    release = tmp_path / "release"
    # The child holds 64 MiB of touched memory until the test has seen it through Prometheus, so the run
    # lasts exactly as long as needed (and at most 30 s).
    child = (
        "import os, time\n"
        "held = bytearray(b'x' * (64 * 1024 * 1024))\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "vramscope", "run", "--prometheus", f"127.0.0.1:{port}", "--interval", "0.1",
         "--no-inject", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        rss = prometheus.wait_for_value(f'vramscope_host_rss_bytes{{test="{slot}"}} > 64 * 1024 * 1024')
        assert 64 * 1024**2 < rss < 1024**3  # the child's buffer, in the watched tree's RSS
        assert prometheus.wait_for_value(f'vramscope_samples_total{{test="{slot}"}} > 1') > 1
        assert run.poll() is None  # seen while the command was still running
    finally:
        release.touch()
        _out, err = run.communicate(timeout=30)
    assert run.returncode == 0, err
    assert f"vramscope: serving Prometheus metrics at http://127.0.0.1:{port}/metrics" in err
    assert "exited with 0" in err


# -- through a Pushgateway ---------------------------------------------------------------------------------


@needs_prometheus
@needs_pushgateway
def test_prometheus_scrapes_pushed_metrics_through_the_gateway(prometheus: PrometheusServer, tmp_path: Path) -> None:
    port, slot = prometheus.claim()
    scraped = Gateway(tmp_path, port=port)
    sink = PushgatewaySink(scraped.url, labels={"rank": "5"}, job="train-node-7", interval=0.2)
    try:
        sink.write(training_sample(step=9))
        value = prometheus.wait_for_value(f'vramscope_gpu_memory_used_bytes{{test="{slot}", gpu="0"}}')
        assert value == 20 * GIB
        (series,) = prometheus.query(f'vramscope_training_step{{test="{slot}"}}')
        # honor_labels: the group's own job and instance, not the gateway's
        assert series["metric"]["job"] == "train-node-7"
        assert series["metric"]["instance"] == HOST
        assert series["metric"]["rank"] == "5"
        assert series["value"][1] == "9"
    finally:
        sink.close()
        scraped.stop()


# -- the Grafana dashboard's queries ------------------------------------------------------------------------


@needs_prometheus
def test_every_dashboard_query_runs_and_returns_data(prometheus: PrometheusServer) -> None:
    from test_prometheus_deploy import dashboard_queries

    host = "dashboard-test-host"
    port, _slot = prometheus.claim()
    sink = PrometheusSink(f"127.0.0.1:{port}", labels={"host": host, "run": "dashboard-run"})
    stop = threading.Event()

    def training() -> None:
        # Steps advance (for the step rate and time-to-OOM panels), the leak test reports a slope, and
        # evaluation comes and goes (for the eval-band annotation).
        step = 0
        while not stop.is_set():
            step += 5
            sink.write(training_sample(step=step, phase="eval" if step % 20 == 0 else "train"))
            sink.set_analysis(2 * 1024**2, 5000.0 - step, gpu=0)
            stop.wait(0.1)

    thread = threading.Thread(target=training, daemon=True)
    thread.start()
    try:
        for title, expr in dashboard_queries():
            # Grafana's variables, as the "All" choice sends them; this host only.
            promql = (
                expr.replace("$host", host)
                .replace("$job", ".*")
                .replace("$run", "dashboard-run")  # one run picked: every panel must still have data
                .replace("$rank", ".*")
                .replace("$gpu", ".*")
                .replace("$__rate_interval", "1m")
            )
            wait_for(lambda q=promql: prometheus.query(q) or None, f"panel {title!r}: {promql}")  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=5)
        sink.close()


# -- promtool --------------------------------------------------------------------------------------------


@needs_promtool
def test_promtool_check_metrics_passes_on_the_exposition() -> None:
    assert PROMTOOL is not None
    sink = PrometheusSink("127.0.0.1:0")
    try:
        sink.write(training_sample())
        sink.set_analysis(1024.0, 300.0, gpu=0)
        sink.set_analysis(512.0, None)
        exposition = http_get(sink.url)
    finally:
        sink.close()
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    # promtool prints lint problems (names, units, help) and exits non-zero on any.
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert check.stdout.decode().strip() == ""
