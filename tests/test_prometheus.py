"""The Prometheus exporter over real HTTP: values from NVML scenario fakes, absent-not-zero, labels, errors.

Everything here runs without the Prometheus binaries; tests against a real Prometheus server are in
``test_prometheus_server.py``. Traffic stays on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

import fake_nvml
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli import main
from vramscope.exporters import (
    METRICS,
    PrometheusAddressError,
    PrometheusBindError,
    PrometheusLabelError,
    PrometheusSink,
    PrometheusSinkError,
    PrometheusUnavailableError,
    parse_address,
)
from vramscope.sampling.sampler import Collector
from vramscope.types import AllocatorReading, Sample

GIB = 1024**3
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def nvml_sample(nvml: fake_nvml.FakeNvml, **fields: object) -> Sample:
    """A sample read through the real NvmlBackend and Collector from an NVML scenario, this process watched."""
    collector = Collector(nvml=NvmlBackend(nvml=nvml), host=HostBackend())
    sample = collector.collect()
    return dataclasses.replace(sample, **fields)  # type: ignore[arg-type]


def training_sample(step: int = 7, rank: int = 1, peak: int = 9 * GIB, phase: str | None = "train") -> Sample:
    """Two healthy GPUs (this process holds 18 GiB on GPU 0) plus what a training callback adds."""
    base = nvml_sample(fake_nvml.two_healthy_gpus(pid=os.getpid()))
    allocator = AllocatorReading(
        device=0,
        allocated_bytes=8 * GIB,
        reserved_bytes=12 * GIB,
        active_bytes=8 * GIB,
        inactive_split_bytes=512 * 1024**2,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=13 * GIB,
        num_alloc_retries=2,
        num_ooms=0,
        uuid=base.gpus[0].uuid,
    )
    return dataclasses.replace(base, allocator=(allocator,), step=step, phase=phase, extra={"rank": rank})


def scrape(url: str) -> Series:
    """GET the endpoint (real HTTP) and parse the exposition into {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series[(s.name, frozenset(s.labels.items()))] = s.value
    return series


def values(series: Series, metric: str, /, **labels: str) -> list[float]:
    """Values of ``metric`` whose labels include ``labels``."""
    want = set(labels.items())
    return [v for (n, lab), v in series.items() if n == metric and want <= lab]


def one(series: Series, metric: str, /, **labels: str) -> float:
    found = values(series, metric, **labels)
    assert len(found) == 1, f"{metric}{labels}: {found}"
    return found[0]


def names(series: Series) -> set[str]:
    return {name for name, _ in series}


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    exporter = PrometheusSink("127.0.0.1:0")
    yield exporter
    exporter.close()


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port something else already listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- addresses --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("19400", ("127.0.0.1", 19400)),
        (" 19400 ", ("127.0.0.1", 19400)),
        ("0.0.0.0:19400", ("0.0.0.0", 19400)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9401", ("::1", 9401)),
    ],
)
def test_address_forms_bind_loopback_unless_a_host_is_given(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", ":19400", "host:", "70000", "-1", "::1:19400", "[::1]19400", "19400/metrics"]
)
def test_bad_addresses_say_what_to_write(text: str) -> None:
    with pytest.raises(PrometheusAddressError) as info:
        parse_address(text)
    message = str(info.value)
    assert "\n" not in message
    assert "19400" in message  # every message shows an example to copy


# -- the endpoint -----------------------------------------------------------------------------------------


def test_scrape_over_http_returns_the_sample_values(sink: PrometheusSink) -> None:
    sink.write(training_sample())
    sink.set_analysis(leak_slope_bytes_per_step=2.5 * 1024**2, steps_to_oom=4000.0, gpu=0)
    series = scrape(sink.url)

    gpu0 = {"gpu": "0", "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd", "rank": "1"}
    assert one(series, "vramscope_gpu_memory_used_bytes", **gpu0) == 20 * GIB
    assert one(series, "vramscope_gpu_memory_total_bytes", **gpu0) == 141 * GIB
    assert one(series, "vramscope_gpu_memory_free_bytes", **gpu0) == 141 * GIB - 20 * GIB - 512 * 1024**2
    assert one(series, "vramscope_gpu_memory_driver_reserved_bytes", **gpu0) == 512 * 1024**2
    assert one(series, "vramscope_gpu_utilization_ratio", **gpu0) == pytest.approx(0.87)
    assert one(series, "vramscope_gpu_memory_used_bytes", gpu="1") == 2 * GIB
    assert one(series, "vramscope_gpu_info", gpu="1", name="NVIDIA H200") == 1
    # per process, with its pid; the watched tree is this process
    assert one(series, "vramscope_gpu_process_memory_bytes", pid=str(os.getpid()), **gpu0) == 18 * GIB
    assert one(series, "vramscope_gpu_process_memory_bytes", pid="999001") == 1 * GIB
    assert one(series, "vramscope_watched_gpu_memory_bytes", **gpu0) == 18 * GIB
    # allocator, joined to NVML's GPU 0 by its UUID
    assert one(series, "vramscope_allocator_allocated_bytes", **gpu0) == 8 * GIB
    assert one(series, "vramscope_allocator_reserved_bytes", **gpu0) == 12 * GIB
    assert one(series, "vramscope_allocator_inactive_split_bytes", **gpu0) == 512 * 1024**2
    assert one(series, "vramscope_allocator_peak_allocated_bytes", **gpu0) == 9 * GIB
    assert one(series, "vramscope_allocator_alloc_retries_total", **gpu0) == 2
    # training and analysis
    assert one(series, "vramscope_training_step", rank="1") == 7
    # the counter rate() wants, and the phase as a label (Grafana draws eval bands from it)
    assert one(series, "vramscope_training_steps_total", rank="1") == 7
    assert one(series, "vramscope_training_phase_info", phase="train") == 1
    assert one(series, "vramscope_leak_slope_bytes_per_step", gpu="0") == 2.5 * 1024**2
    assert one(series, "vramscope_forecast_steps_to_oom", gpu="0") == 4000
    assert one(series, "vramscope_samples_total") == 1
    assert one(series, "vramscope_host_rss_bytes") > 10 * 1024**2  # this Python process, really read
    # every series carries the host
    assert {dict(labels).get("host") for _, labels in series} == {socket.gethostname()}


def test_steps_are_exposed_as_a_counter_and_the_phase_as_an_info_series(sink: PrometheusSink) -> None:
    sink.write(training_sample(step=12, phase="eval"))
    text = urllib.request.urlopen(sink.url, timeout=10).read().decode()
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds["vramscope_training_steps"] == "counter"
    assert 'vramscope_training_phase_info{' in text and 'phase="eval"' in text
    sink.write(dataclasses.replace(training_sample(step=13), phase=None))
    # no phase known: no phase series at all, rather than a stale or made-up one
    assert "vramscope_training_phase_info" not in urllib.request.urlopen(sink.url, timeout=10).read().decode()


def test_every_listed_metric_appears_for_a_full_sample(sink: PrometheusSink) -> None:
    sink.write(training_sample())
    sink.set_analysis(1.0, 10.0)
    assert names(scrape(sink.url)) == set(METRICS)


def test_nothing_is_made_up_before_the_first_sample(sink: PrometheusSink) -> None:
    # Only the sample count, which is a true 0; no GPU, host or training series at all.
    assert scrape(sink.url) == {("vramscope_samples_total", frozenset({("host", socket.gethostname())})): 0.0}


def test_fields_nvml_cannot_read_are_absent_not_zero(sink: PrometheusSink) -> None:
    sink.write(nvml_sample(fake_nvml.not_supported_fields()))
    series = scrape(sink.url)
    assert one(series, "vramscope_gpu_memory_used_bytes", gpu="0") == 5 * GIB
    assert values(series, "vramscope_gpu_utilization_ratio") == []  # NotSupported
    assert values(series, "vramscope_gpu_process_memory_bytes") == []  # process listing NotSupported
    assert not {n for n in names(series) if n.startswith("vramscope_allocator_")}  # no torch allocator here
    assert values(series, "vramscope_training_step") == []


def test_a_lost_gpu_is_listed_but_its_memory_is_absent(sink: PrometheusSink) -> None:
    sink.write(nvml_sample(fake_nvml.one_gpu_lost()))
    series = scrape(sink.url)
    assert one(series, "vramscope_gpu_memory_used_bytes", gpu="0") == 10 * GIB
    assert values(series, "vramscope_gpu_memory_used_bytes", gpu="1") == []
    assert values(series, "vramscope_gpu_memory_total_bytes", gpu="1") == []
    assert one(series, "vramscope_gpu_info", gpu="1") == 1  # the GPU is there; what it holds is unknown


def test_no_driver_gives_host_metrics_only(sink: PrometheusSink) -> None:
    sink.write(nvml_sample(fake_nvml.no_driver()))
    series = scrape(sink.url)
    assert not {n for n in names(series) if n.startswith("vramscope_gpu_")}
    assert one(series, "vramscope_host_memory_total_bytes") > 0


def test_peaks_are_kept_between_scrapes(sink: PrometheusSink) -> None:
    # The allocator's own peak is reset at each reading; the exporter keeps the maximum since it started.
    for peak in (5 * GIB, 11 * GIB, 6 * GIB):
        sink.write(training_sample(peak=peak))
    series = scrape(sink.url)
    assert one(series, "vramscope_allocator_peak_allocated_bytes", gpu="0") == 11 * GIB
    assert one(series, "vramscope_allocator_allocated_bytes", gpu="0") == 8 * GIB  # the latest, not a peak
    assert one(series, "vramscope_watched_gpu_memory_peak_bytes", gpu="0") == 18 * GIB
    assert one(series, "vramscope_samples_total") == 3


def test_analysis_can_be_withdrawn_and_ignores_nan(sink: PrometheusSink) -> None:
    sink.set_analysis(1000.0, 50.0, gpu=1)
    sink.set_analysis(float("nan"), float("inf"), gpu=0)  # a degenerate fit is unknown, not a value
    series = scrape(sink.url)
    assert one(series, "vramscope_leak_slope_bytes_per_step", gpu="1") == 1000
    assert values(series, "vramscope_leak_slope_bytes_per_step", gpu="0") == []
    assert values(series, "vramscope_forecast_steps_to_oom", gpu="0") == []
    sink.set_analysis(None, None, gpu=1)
    assert values(scrape(sink.url), "vramscope_leak_slope_bytes_per_step") == []


def test_rank_comes_from_labels_before_the_sample() -> None:
    exporter = PrometheusSink("127.0.0.1:0", labels={"rank": "3", "run": "llama"})
    try:
        exporter.write(training_sample(rank=1))
        series = scrape(exporter.url)
        assert {dict(labels)["rank"] for _, labels in series} == {"3"}
        assert {dict(labels)["run"] for _, labels in series} == {"llama"}
    finally:
        exporter.close()


def test_no_rank_label_without_a_rank(sink: PrometheusSink) -> None:
    sink.write(nvml_sample(fake_nvml.two_healthy_gpus()))
    assert all("rank" not in dict(labels) for _, labels in scrape(sink.url))


@pytest.mark.parametrize("labels", [{"gpu": "0"}, {"pid": "1"}, {"bad-name": "x"}, {"__meta": "x"}, {"1st": "x"}])
def test_labels_that_clash_or_are_invalid_are_refused(labels: dict[str, str]) -> None:
    with pytest.raises(PrometheusLabelError):
        PrometheusSink("127.0.0.1:0", labels=labels)


def test_a_shared_registry_serves_the_users_metrics_too() -> None:
    registry = CollectorRegistry()
    Gauge("my_loss", "Training loss", registry=registry).set(0.25)
    exporter = PrometheusSink("127.0.0.1:0", registry=registry)
    try:
        exporter.write(training_sample())
        series = scrape(exporter.url)
        assert one(series, "my_loss") == 0.25
        assert one(series, "vramscope_gpu_memory_used_bytes", gpu="0") == 20 * GIB
    finally:
        exporter.close()
    assert b"vramscope_" not in exporter.exposition()  # closing unregisters vramscope's collector


def test_port_in_use_is_one_catchable_error(listening_port: int) -> None:
    registry = CollectorRegistry()
    with pytest.raises(PrometheusBindError) as info:
        PrometheusSink(f"127.0.0.1:{listening_port}", registry=registry)
    assert isinstance(info.value, PrometheusSinkError)  # what the training monitor catches to warn instead
    assert str(info.value) == (
        f"port {listening_port} on 127.0.0.1 is already in use; choose another port (or stop what listens there)"
    )
    assert list(registry.collect()) == []  # nothing left registered by the failed attempt


def test_a_host_that_is_not_this_machine_is_refused() -> None:
    with pytest.raises(PrometheusBindError, match="not an address of this machine"):
        PrometheusSink("192.0.2.1:0")  # TEST-NET-1: never local


def test_close_frees_the_port_and_is_idempotent() -> None:
    exporter = PrometheusSink("127.0.0.1:0")
    port = exporter.port
    exporter.close()
    exporter.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    again = PrometheusSink(f"127.0.0.1:{port}")  # the port is free again
    again.close()


def test_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        exporter = PrometheusSink("[::1]:0")
    except PrometheusBindError as exc:
        pytest.skip(f"IPv6 loopback unavailable here: {exc}")
    try:
        assert exporter.url == f"http://[::1]:{exporter.port}/metrics"
        exporter.write(training_sample())
        assert one(scrape(exporter.url), "vramscope_gpu_memory_used_bytes", gpu="1") == 2 * GIB
    finally:
        exporter.close()


def test_scrapes_during_writes_see_whole_samples(sink: PrometheusSink) -> None:
    # The sampler writes on its thread while Prometheus scrapes on the server's: every scrape must show
    # one consistent sample (step and sample count advance together here).
    stop, started = threading.Event(), threading.Event()
    steps = [0]

    def writer() -> None:
        while not stop.is_set():
            steps[0] += 1
            sink.write(training_sample(step=steps[0]))
            started.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    # Scrapes begin once the writer has written: without the wait, 20 quick scrapes on an idle machine could all
    # come before its first sample (the test failed so, 4 times in 5, on the tree before and after issue 15).
    assert started.wait(timeout=10)
    first = steps[0]
    try:
        for _ in range(20):
            series = scrape(sink.url)
            assert one(series, "vramscope_training_step") == one(series, "vramscope_samples_total")
            time.sleep(0.002)  # the writer's turn: a scrape loop with no pause holds the collector's lock back to back
        assert steps[0] > first  # it wrote while the scrapes went on
    finally:
        stop.set()
        thread.join(timeout=5)


def test_without_prometheus_client_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an environment without the extra sees
    with pytest.raises(PrometheusUnavailableError, match=r"pip install 'vramscope\[prometheus\]'"):
        PrometheusSink("127.0.0.1:0")


def test_importing_the_module_does_not_import_prometheus_client() -> None:
    # So that `vramscope run --help` and address parsing work without the extra.
    code = (
        "import sys, vramscope.exporters as p, vramscope.cli.run, vramscope.cli.watch\n"
        "p.parse_address('19400')\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- the CLI ------------------------------------------------------------------------------------------------


def test_run_with_port_in_use_exits_2_without_starting_the_command(
    listening_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    code = main(["run", "--prometheus", str(listening_port), "--", "touch", str(marker)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"vramscope: error: port {listening_port} on 127.0.0.1 is already in use; "
        "choose another port (or stop what listens there)\n"
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--prometheus", "nine", "--", "true"], "cannot read 'nine' as [HOST:]PORT"),
        (["run", "--prometheus", ":19400", "--", "true"], "0.0.0.0:PORT for every interface"),
        (["run", "--push", "pushgateway:9091", "--", "true"], "give the Pushgateway as http(s)://HOST[:PORT]"),
        (["run", "--push-interval", "5", "--", "true"], "add --push http://HOST:9091"),
        (["watch", "--push", "http://gw:notaport"], "the port is not a number"),
        (["watch", "--once", "--prometheus", "19400"], "drop --once or use --push"),
    ],
)
def test_bad_exporter_flags_exit_2_with_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("vramscope: error: ")
    assert says in err


def test_watch_serves_while_its_loop_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from vramscope.cli import watch

    scenario = fake_nvml.two_healthy_gpus()
    # Fake NVML at the hardware boundary: watch builds its own backend, so hand it the scenario.
    monkeypatch.setattr(watch, "NvmlBackend", lambda gpus=None: NvmlBackend(nvml=scenario, gpus=gpus))
    port = free_port()
    result: list[int] = []
    runner = threading.Thread(
        target=lambda: result.append(
            main(["watch", "--prometheus", f"127.0.0.1:{port}", "--interval", "0.1", "--count", "30"])
        ),
        daemon=True,
    )
    runner.start()
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 10
    seen: list[float] = []
    while time.monotonic() < deadline and runner.is_alive() and len(set(seen)) < 3:
        try:
            series = scrape(url)
        except urllib.error.URLError:  # not listening yet
            time.sleep(0.05)
            continue
        if values(series, "vramscope_gpu_memory_used_bytes"):
            assert one(series, "vramscope_gpu_memory_used_bytes", gpu="0") == 20 * GIB
            assert one(series, "vramscope_gpu_process_memory_bytes", gpu="0", pid="4242") == 18 * GIB
            seen.append(one(series, "vramscope_samples_total"))
        time.sleep(0.1)
    # Several scrapes saw the count grow: the endpoint answered while the plain loop kept sampling.
    assert len(set(seen)) >= 3, seen
    runner.join(timeout=10)
    assert result == [0]
    assert f"serving Prometheus metrics at {url}" in capsys.readouterr().err
    with pytest.raises(urllib.error.URLError):  # watch closed the endpoint on the way out
        urllib.request.urlopen(url, timeout=2)
