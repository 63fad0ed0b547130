"""``--push URL``: the Pushgateway sink against the real ``prometheus-pushgateway`` binary (Debian package).

Each gateway is started here on a free loopback port, in memory only (``--persistence.file=``: Debian's
build would otherwise write /var/lib/prometheus/pushgateway.data), and stopped at the end. Tests use
distinct ``job`` names so that their groups never meet. Every wait is bounded.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_prometheus import GIB, training_sample
from test_prometheus_server import HOST, PUSHGATEWAY, Gateway, free_port, needs_pushgateway, wait_for
from vramscope.exporters import PushgatewaySink, PushgatewayURLError


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if PUSHGATEWAY is None:
        pytest.skip("needs the Pushgateway (Debian: apt-get install -y prometheus-pushgateway)")
    server = Gateway(tmp_path_factory.mktemp("pushgateway"))
    yield server
    server.stop()


def test_a_push_lands_in_its_group_with_the_values(gateway: Gateway) -> None:
    sink = PushgatewaySink(gateway.url, labels={"rank": "2"}, job="group-test", interval=0.2)
    try:
        sink.write(training_sample(step=42))
        sink.set_analysis(1024.0**2, 700.0, gpu=0)
        group = {"job": "group-test", "instance": HOST, "rank": "2"}
        assert gateway.wait_for_value("vramscope_gpu_memory_used_bytes", gpu="0", **group) == 20 * GIB
        assert gateway.wait_for_value("vramscope_allocator_reserved_bytes", gpu="0", **group) == 12 * GIB
        assert gateway.wait_for_value("vramscope_training_step", **group) == 42
        assert gateway.wait_for_value("vramscope_forecast_steps_to_oom", **group) == 700
        assert gateway.wait_for_value("push_time_seconds", **group) > 0  # the gateway took the whole group
    finally:
        sink.close()
    assert sink.pushes >= 1


def test_pushes_follow_the_timer_not_the_samples(gateway: Gateway) -> None:
    before = gateway.put_requests()
    sink = PushgatewaySink(gateway.url, job="timer-test", interval=0.5)
    written = 0
    deadline = time.monotonic() + 1.3
    while time.monotonic() < deadline:  # a sampler writing every 20 ms
        written += 1
        sink.write(training_sample(step=written))
        time.sleep(0.02)
    sink.close()  # one last push with the final state
    # Two or three timer ticks plus the last push, however many samples came in.
    assert written >= 20
    assert 2 <= sink.pushes <= 4
    assert gateway.put_requests() - before == sink.pushes  # the gateway counted exactly those PUTs
    group = {"job": "timer-test", "instance": HOST, "rank": "1"}
    assert gateway.wait_for_value("vramscope_samples_total", **group) == written
    assert gateway.wait_for_value("vramscope_training_step", **group) == written


def test_close_pushes_the_end_state_of_a_short_run_at_once(gateway: Gateway) -> None:
    sink = PushgatewaySink(gateway.url, job="short-run", interval=60.0)  # the timer never fires here
    for step in (1, 2, 3):
        sink.write(training_sample(step=step))
    started = time.monotonic()
    sink.close()
    assert time.monotonic() - started < 5.0  # the timer's 60 s wait is interrupted, not sat out
    assert sink.pushes == 1
    assert gateway.wait_for_value("vramscope_training_step", job="short-run") == 3


def test_nothing_is_pushed_before_the_first_sample(gateway: Gateway) -> None:
    sink = PushgatewaySink(gateway.url, job="empty-run", interval=0.1)
    time.sleep(0.3)
    sink.close()
    assert sink.pushes == 0
    assert gateway.values("push_time_seconds", job="empty-run") == []


def test_delete_on_close_removes_the_group(gateway: Gateway) -> None:
    sink = PushgatewaySink(gateway.url, job="deleted-run", interval=0.1, delete_on_close=True)
    sink.write(training_sample())
    gateway.wait_for_value("vramscope_gpu_memory_used_bytes", job="deleted-run", gpu="0")
    sink.close()
    # The Pushgateway answers a DELETE with 202 Accepted and applies it from its write queue: poll, as a
    # dashboard would see it, instead of reading once at the instant close() returns.
    wait_for(lambda: gateway.values("vramscope_gpu_memory_used_bytes", job="deleted-run") == [],
             "the deleted group to leave the gateway")


@needs_pushgateway
def test_a_gateway_that_is_down_only_warns_and_is_used_once_it_is_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    sink = PushgatewaySink(f"http://127.0.0.1:{port}", job="late-gateway", interval=0.1, timeout=1.0)
    late: Gateway | None = None
    try:
        with caplog.at_level(logging.WARNING, logger="vramscope.exporters"):
            sink.write(training_sample())
            time.sleep(0.5)  # several failed ticks
            failures = [r for r in caplog.records if "cannot push metrics" in r.getMessage()]
            assert len(failures) == 1  # one line, not one per tick
            assert "Connection refused" in failures[0].getMessage()
            late = Gateway(tmp_path, port=port)
            assert late.wait_for_value("vramscope_gpu_memory_used_bytes", job="late-gateway", gpu="0") == 20 * GIB
            wait_for(lambda: any("works again" in r.getMessage() for r in caplog.records), "the recovery line")
    finally:
        sink.close()
        if late is not None:
            late.stop()


@pytest.mark.parametrize("url", ["pushgateway:9091", "ftp://gw:9091", "http://", "http://gw:x", "http://gw/?a=1"])
def test_bad_urls_are_refused_before_anything_starts(url: str) -> None:
    with pytest.raises(PushgatewayURLError, match=r"e\.g\. http://pushgateway:9091"):
        PushgatewaySink(url)


def test_vramscope_run_pushes_while_the_command_runs_and_at_its_end(gateway: Gateway, tmp_path: Path) -> None:
    release = tmp_path / "release"
    # The child holds 48 MiB of touched memory until the test has seen it on the gateway (at most 30 s).
    child = (
        "import os, time\n"
        "held = bytearray(b'x' * (48 * 1024 * 1024))\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "vramscope", "run", "--push", gateway.url, "--push-interval", "0.2",
         "--interval", "0.1", "--no-inject", "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    group = {"job": "vramscope", "instance": HOST}
    try:
        held = wait_for(
            lambda: [v for v in gateway.values("vramscope_host_rss_bytes", **group) if v > 48 * 1024**2] or None,
            "the child's RSS on the gateway",
        )
        assert held[0] < 1024**3
        assert run.poll() is None  # pushed while the command was still running
    finally:
        release.touch()
        _out, err = run.communicate(timeout=30)
    assert run.returncode == 0, err
    # Its own group: no log, so the run is named host-pid-start (two such runs never share one).
    assert re.search(rf"vramscope: pushing metrics to {re.escape(gateway.url)} every 0\.2 s "
                     rf"\(job 'vramscope', run '{re.escape(HOST)}-\d+-\d{{8}}T\d{{6}}'\)", err), err
    # The last push, at the end of the run, carries the final sample count, which the summary also prints.
    samples = int(err.split("samples: ")[1].split()[0].rstrip(","))
    assert gateway.wait_for_value("vramscope_samples_total", **group) == samples


HOLD = (
    "import os, sys, time\n"
    "held = b'x' * (int(sys.argv[1]) * 1024 * 1024)\n"
    "deadline = time.monotonic() + 30\n"
    "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.05)\n"
)


def test_two_runs_on_one_host_push_to_two_groups(gateway: Gateway, tmp_path: Path) -> None:
    """Two `run --push` jobs at once on one host: each keeps its own group (the log's stem is its `run`),
    where before they shared one and a value flipped between the two runs' figures."""
    release = tmp_path / "release"
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "vramscope", "run", "--push", gateway.url, "--push-interval", "0.2",
             "--interval", "0.1", "--no-inject", "--log", str(tmp_path / f"{name}.csv"), "--push-job", "pair",
             "--", sys.executable, "-c", HOLD, str(mib), str(release)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, mib in (("small", 16), ("large", 160))
    ]
    try:
        def both() -> dict[str, float] | None:
            found = {run: max(gateway.values("vramscope_host_rss_bytes", job="pair", instance=HOST, run=run),
                              default=0.0) for run in ("small", "large")}
            return found if found["large"] > 160 * 1024**2 and found["small"] > 16 * 1024**2 else None

        held = wait_for(both, "both runs' groups on the gateway")
        assert held["small"] < 160 * 1024**2 < held["large"]  # each group holds its own run's memory
    finally:
        release.touch()
        errors = [run.communicate(timeout=30)[1] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], errors
    assert "(job 'pair', run 'small')" in errors[0]
    groups = {dict(labels).get("run") for (name, labels) in gateway.series() if name == "push_time_seconds"
              and dict(labels).get("job") == "pair"}
    assert groups == {"small", "large"}


def test_push_job_and_labels_name_the_group(gateway: Gateway, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "--push", gateway.url, "--push-job", "llama-qlora",
         "--push-label", "team=nlp", "--push-label", "run=nightly", "--no-inject", "--quiet", "--",
         sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    group = {"job": "llama-qlora", "instance": HOST, "team": "nlp", "run": "nightly"}  # the label wins over the run
    assert gateway.wait_for_value("push_time_seconds", **group) > 0
    assert gateway.values("vramscope_samples_total", **group)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--push-label", "team"], "--push-label takes NAME=VALUE such as team=nlp"),
        (["--push", "http://gw:9091", "--push-label", "__x=1"], "label name '__x' is not valid"),
        (["--push", "http://gw:9091", "--push-label", "instance=a"], "--push-label instance=... is set by vramscope"),
        (["--push-job", "x"], "--push-job needs a Pushgateway to push to; add --push http://HOST:9091"),
        (["--push", "http://gw:9091", "--push-interval", "0.01"], "the push interval must be from 0.05 to 86400 s"),
    ],
)
def test_bad_push_flags_are_one_line_and_exit_2(argv: list[str], message: str) -> None:
    for command in (["run", *argv, "--", "true"], ["watch", "--count", "2", *argv]):
        result = subprocess.run([sys.executable, "-m", "vramscope", *command], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, (command, result.stderr)
        assert message in result.stderr, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) <= 2  # argparse's usage line at most, then the one line


@pytest.mark.slow
def test_run_push_carries_the_trainers_last_step(gateway: Gateway, tmp_path: Path) -> None:
    """The zero-code path with --push: the injected callback's series reach the gateway, and the run's last push,
    made after the command ended, has the Trainer's last step (the relay is drained before it)."""
    pytest.importorskip("transformers")
    from test_inject import TRAIN_SCRIPT

    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "--push", gateway.url, "--push-interval", "60", "--quiet",
         "--log", "hf.csv", "--push-job", "zero-code", "--", sys.executable, "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    group = {"job": "zero-code", "instance": HOST, "run": "hf"}
    assert gateway.wait_for_value("vramscope_training_step", rank="0", **group) == 3
    assert gateway.wait_for_value("vramscope_training_steps_total", rank="0", **group) == 3
    assert gateway.values("vramscope_host_rss_peak_bytes", rank="0", **group)
    assert gateway.values("vramscope_samples_total", **group)  # the run's own series beside them


@pytest.mark.slow
def test_run_push_carries_a_lightning_trainers_steps(gateway: Gateway, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from test_lightning import LIGHTNING_SCRIPT

    (tmp_path / "train.py").write_text(LIGHTNING_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "vramscope", "run", "--push", gateway.url, "--quiet", "--log", "pl.csv",
         "--push-job", "zero-code-lightning", "--", sys.executable, "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    group = {"job": "zero-code-lightning", "instance": HOST, "run": "pl", "rank": "0"}
    assert gateway.wait_for_value("vramscope_training_steps_total", **group) == 3
    assert gateway.values("vramscope_host_rss_bytes", **group)
