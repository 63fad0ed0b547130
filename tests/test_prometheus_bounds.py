"""The exporter's HTTP server is bounded (issue 14, item 10): idle sockets cost no thread and are closed,
scrapes keep working beside a thousand of them, only /metrics serves the metrics, and every interface
is bound only when asked, with one warning.

Real sockets to a real server on 127.0.0.1; every loop and wait is bounded.
"""

from __future__ import annotations

import logging
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

from vramscope.exporters import PrometheusSink
from vramscope.exporters import server as metrics_http

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    exporter = PrometheusSink("0")
    try:
        yield exporter
    finally:
        exporter.close()


def get(url: str, method: str = "GET", timeout: float = 3.0) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


@pytest.mark.slow  # a thousand real sockets
def test_a_thousand_idle_sockets_cost_no_thread_and_scrapes_still_answer(sink: PrometheusSink) -> None:
    # Before: a thread per connection, each waiting forever for a request; 776 of the later scrapes timed out.
    threads_before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", sink.port), timeout=5) for _ in range(1000)]
    try:
        assert threading.active_count() == threads_before  # one server thread, whatever the connections
        answered = 0
        started = time.monotonic()
        for _ in range(100):
            status, body, _ = get(sink.url, timeout=3.0)
            answered += status == 200 and b"vramscope_samples_total" in body
        assert answered == 100
        assert time.monotonic() - started < 30
        assert threading.active_count() == threads_before
        assert sink._server.open_connections <= metrics_http.MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()


def test_an_idle_connection_is_closed_after_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 0.5)
    exporter = PrometheusSink("0")
    try:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=10) as idle:
            started = time.monotonic()
            idle.sendall(b"GET /metr")  # half a request, then nothing
            assert idle.recv(100) == b""  # the server hung up
            assert 0.3 < time.monotonic() - started < 5
        assert exporter._server.open_connections == 0
    finally:
        exporter.close()


def test_a_client_that_never_reads_its_answer_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "SEND_TIMEOUT_S", 0.5)
    big = b"x" * (64 << 20)  # an answer far larger than the socket buffers
    exporter = PrometheusSink("0")
    monkeypatch.setattr(exporter._server, "_render", lambda accept, query: (big, "text/plain"))
    try:
        slow = socket.create_connection(("127.0.0.1", exporter.port), timeout=10)
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 10
        while not exporter._server.open_connections and time.monotonic() < deadline:
            time.sleep(0.01)  # until the server has taken the connection
        started = time.monotonic()
        while exporter._server.open_connections and time.monotonic() < started + 10:
            time.sleep(0.05)
        assert exporter._server.open_connections == 0
        assert time.monotonic() - started >= 0.4  # dropped by the send timeout, not because it all went out
        slow.close()
        monkeypatch.undo()
        status, _, _ = get(exporter.url)
        assert status == 200  # and the server still serves
    finally:
        exporter.close()


def test_metrics_only_on_metrics_a_short_page_on_root_and_404_elsewhere(sink: PrometheusSink) -> None:
    base = f"http://127.0.0.1:{sink.port}"
    status, body, kind = get(base + "/metrics")
    assert status == 200 and b"# TYPE vramscope_samples_total counter" in body and kind.startswith("text/plain")
    status, body, kind = get(base + "/metrics?debug=1")  # a query string is not another path
    assert status == 200 and b"vramscope_samples_total" in body
    status, body, kind = get(base + "/")
    assert status == 200 and b'href="/metrics"' in body and kind.startswith("text/html") and len(body) < 500
    for path in ("/favicon.ico", "/metrics/", "/foo", "/../metrics", "/metricsx"):
        status, body, _ = get(base + path)
        assert status == 404 and b"vramscope_samples_total" not in body, path
    status, body, _ = get(base + "/metrics", method="HEAD")
    assert status == 200 and body == b""
    status, _, _ = get(base + "/metrics", method="POST")
    assert status == 405


def test_openmetrics_is_served_when_asked(sink: PrometheusSink) -> None:
    request = urllib.request.Request(sink.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(request, timeout=3) as answer:
        body = answer.read()
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_garbage_and_oversized_requests_get_an_error_not_a_hang(sink: PrometheusSink) -> None:
    with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as client:
        client.sendall(b"\x00\x01\x02 nonsense\r\n\r\n")
        assert client.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", sink.port), timeout=5) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (metrics_http.MAX_REQUEST_BYTES + 10))
        assert client.recv(100).startswith(b"HTTP/1.1 431")
    assert get(sink.url)[0] == 200


def test_more_connections_than_the_cap_close_the_oldest_idle_ones(sink: PrometheusSink) -> None:
    idle = [socket.create_connection(("127.0.0.1", sink.port), timeout=5)
            for _ in range(metrics_http.MAX_CONNECTIONS + 20)]
    try:
        assert get(sink.url)[0] == 200
        oldest = idle[0]
        oldest.settimeout(5)
        assert oldest.recv(10) == b""  # closed to make room
        assert sink._server.open_connections <= metrics_http.MAX_CONNECTIONS
    finally:
        for s in idle:
            s.close()


def test_close_stops_the_thread_and_frees_the_port() -> None:
    exporter = PrometheusSink("0")
    port = exporter.port
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    before = {t for t in threading.enumerate() if t.name == "vramscope-prometheus"}
    exporter.close()
    # the thread this exporter started is gone (other tests' exporters may live on in the same process)
    after = {t for t in threading.enumerate() if t.name == "vramscope-prometheus"}
    assert len(before - after) == 1
    assert held.recv(10) == b""
    held.close()
    again = PrometheusSink(f"127.0.0.1:{port}")  # the port is free again
    again.close()


def test_every_interface_warns_once_and_loopback_not_at_all(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="vramscope.exporters")
    quiet = PrometheusSink("0")
    quiet.close()
    assert not caplog.records
    wide = PrometheusSink("0.0.0.0:0")
    try:
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and "anyone who can reach this machine" in warnings[0]
        assert str(wide.port) in warnings[0]
        assert get(f"http://127.0.0.1:{wide.port}/metrics")[0] == 200
    finally:
        wide.close()


def test_the_cli_warns_on_stderr_when_binding_every_interface(tmp_path: Path) -> None:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    result = subprocess.run([PYTHON, "-m", "vramscope", "run", "--prometheus", "0.0.0.0:0", "--", PYTHON, "-c", "0"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "anyone who can reach" in line]
    assert len(lines) == 1 and lines[0].startswith("vramscope: warning: ")
    default = subprocess.run([PYTHON, "-m", "vramscope", "run", "--prometheus", "0", "--", PYTHON, "-c", "0"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert default.returncode == 0 and "anyone who can reach" not in default.stderr
