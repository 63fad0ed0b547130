"""Zero code gives the same series as the callback: ``vramscope run --prometheus`` carries the Trainers' series.

The command's Trainers (their injected callbacks) send each sample and each change of their live analysis to
the parent's unix datagram socket (exporters/relay.py); the parent's exporter serves them beside its own
process-level series, with the same names and a ``rank`` label. The end-to-end test runs a real, unmodified
HF Trainer on CPU under a real ``vramscope run --prometheus`` and scrapes the real endpoint over HTTP while it
trains. Every wait is bounded.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_prometheus import GIB, training_sample
from vramscope.exporters import PrometheusSink
from vramscope.exporters.relay import (
    ENV_RELAY,
    MAX_DATAGRAM,
    RelayReceiver,
    RelaySink,
    decode,
    encode_analysis,
    encode_sample,
)
from vramscope.run.inject import _callback_options
from vramscope.types import HostReading, Sample

PYTHON = sys.executable
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def values(series: Series, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]


def wait_until(probe, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


# -- the datagram and its two ends ----------------------------------------------------------------------------


def test_a_sample_and_an_analysis_survive_the_datagram() -> None:
    sample = training_sample(step=42)
    back = decode(encode_sample("3", sample))
    assert back is not None and back.rank == "3" and back.sample is not None
    assert back.sample.step == 42 and back.sample.phase == sample.phase
    assert back.sample.allocator == sample.allocator  # every allocator field, uuid included
    assert back.sample.host == sample.host
    assert [(g.index, g.uuid) for g in back.sample.gpus] == [(g.index, g.uuid) for g in sample.gpus]
    table = decode(encode_analysis("3", {0: (1024.0, 700.0), None: (None, 5.0)}))
    assert table is not None and table.analysis == {0: (1024.0, 700.0), None: (None, 5.0)}


@pytest.mark.parametrize("data", [b"", b"not json", b"[]", b'{"v": 2, "rank": "0", "sample": {}}',
                                  b'{"v": 1, "rank": "0", "sample": {"time": "x"}}',
                                  b'{"v": 1, "rank": "0", "analysis": [[0, 1]]}', b"x" * (MAX_DATAGRAM + 1)])
def test_anything_else_is_dropped(data: bytes) -> None:
    assert decode(data) is None


def test_relayed_ranks_reach_the_parents_endpoint_beside_its_own_series() -> None:
    parent = PrometheusSink("127.0.0.1:0", labels={"run": "r1"})
    receiver = RelayReceiver([parent])
    senders = [RelaySink(receiver.path), RelaySink(receiver.path)]
    try:
        # The parent's own process-level sample: the GPUs as NVML sees them, the tree's host memory.
        parent.write(Sample(time=time.time(), elapsed_s=1.0, gpus=training_sample().gpus,
                            host=HostReading(rss_bytes=3 * GIB)))
        for rank, sender in enumerate(senders):
            first = training_sample(step=10 + rank)
            sender.write(replace(first, extra={"rank": rank}))
            sender.set_analysis(2.0 * 1024**2, 500.0 + rank, gpu=0)

        def both() -> Series | None:
            found = scrape(parent.url)
            ready = len(values(found, "vramscope_forecast_steps_to_oom")) == 2
            return found if ready and len(values(found, "vramscope_training_step")) == 2 else None

        series = wait_until(both, "both ranks")
    finally:
        receiver.close()
        for sender in senders:
            sender.close()
        parent.close()
    assert values(series, "vramscope_training_step", rank="0", run="r1") == [10]
    assert values(series, "vramscope_training_steps_total", rank="1") == [11]
    assert values(series, "vramscope_forecast_steps_to_oom", rank="1", gpu="0") == [501]
    assert values(series, "vramscope_leak_slope_bytes_per_step", rank="0", gpu="0") == [2.0 * 1024**2]
    assert values(series, "vramscope_allocator_reserved_bytes", rank="0", gpu="0") == [12 * GIB]
    assert values(series, "vramscope_allocator_peak_allocated_bytes", rank="1", gpu="0")
    # The GPU-wide series are the parent's own, once, without a rank; the tree's RSS too.
    assert len(values(series, "vramscope_gpu_memory_used_bytes", gpu="0")) == 1
    assert [ls for (n, ls), _ in series.items() if n == "vramscope_gpu_memory_used_bytes"
            and dict(ls).get("rank")] == []
    assert 3 * GIB in values(series, "vramscope_host_rss_bytes")
    assert receiver.received == 4


def test_a_rank_only_sends_its_own_rows_and_withdraws_its_analysis() -> None:
    collector_sink = PrometheusSink("127.0.0.1:0")
    receiver = RelayReceiver([collector_sink])
    sender = RelaySink(receiver.path)
    try:
        sender.write(replace(training_sample(step=5), extra={"rank": 1}))
        sender.write(replace(training_sample(step=99), extra={"rank": 3}))  # a gathered row
        sender.set_analysis(1.0, 2.0, gpu=None)
        sender.set_analysis(None, None, gpu=None)  # no leak any more
        receiver.close()  # takes what is queued
        series = scrape(collector_sink.url)
    finally:
        sender.close()
        collector_sink.close()
    assert values(series, "vramscope_training_step") == [5]
    assert values(series, "vramscope_leak_slope_bytes_per_step") == []


def test_a_full_socket_drops_without_waiting_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    folder = Path(os.environ.get("TMPDIR", "/tmp"))
    path = str(folder / f"vramscope-test-{os.getpid()}.sock")
    nobody_reads = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    nobody_reads.bind(path)
    sender = RelaySink(path)
    try:
        with caplog.at_level(logging.WARNING, logger="vramscope.exporters"):
            sample = training_sample()
            started = time.monotonic()
            for _ in range(2000):
                sender.write(sample)
            took = time.monotonic() - started
        assert sender.dropped > 0  # the queue filled up
        assert took < 10.0  # and the "training" never waited for it
        assert len([r for r in caplog.records if "not every sample" in r.getMessage()]) == 1
    finally:
        sender.close()
        nobody_reads.close()
        os.unlink(path)


def test_a_parent_that_is_gone_costs_nothing(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    sender = RelaySink(str(tmp_path / "gone.sock"))
    with caplog.at_level(logging.WARNING, logger="vramscope.exporters"):
        for step in range(3):
            sender.write(training_sample(step=step))
    sender.close()
    assert sender.dropped == 3
    assert len(caplog.records) == 1


def test_the_relay_socket_is_the_users_alone() -> None:
    receiver = RelayReceiver([])
    folder = os.path.dirname(receiver.path)
    try:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert stat.S_ISSOCK(os.stat(receiver.path).st_mode)
        assert receiver.env == {ENV_RELAY: receiver.path}
    finally:
        receiver.close()
    assert not os.path.exists(folder)  # removed at the end


def test_the_injected_callback_relays_only_when_the_run_exports() -> None:
    assert "export" not in _callback_options({})
    assert _callback_options({ENV_RELAY: "/x/relay.sock"})["export"] == {"relay": "/x/relay.sock"}


def test_the_users_own_callback_relays_too_and_keeps_the_rest(tmp_path: Path) -> None:
    from test_inject import _tiny_trainer
    from vramscope.integrations.hf import MemoryMonitorCallback
    from vramscope.run.inject import attach

    mine = MemoryMonitorCallback(log=str(tmp_path / "mine.csv"), warn=False, export={"prometheus": "127.0.0.1:0"})
    trainer = _tiny_trainer(tmp_path, callbacks=[mine])
    assert attach(trainer, environ={ENV_RELAY: "/x/relay.sock"}) is None  # still the user's own, alone
    assert dict(mine.monitor.settings.export) == {"prometheus": "127.0.0.1:0", "relay": "/x/relay.sock"}
    assert mine.monitor.settings.log == str(tmp_path / "mine.csv")
    assert attach(_tiny_trainer(tmp_path, callbacks=[MemoryMonitorCallback(warn=False)]), environ={}) is None


# -- the whole path: a real HF Trainer under a real `vramscope run --prometheus` -------------------------------

TRAIN_SCRIPT = textwrap.dedent(
    """
    import os, time
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)

    class Leak(TrainerCallback):
        # Keeps 1 MiB of touched host memory per step (a leak the live analysis must see), and trains on
        # until the test has scraped what it looks for (the file "release"), at most 600 steps.
        def __init__(self):
            self.kept = []
        def on_step_end(self, args, state, control, **kwargs):
            self.kept.append(b"x" * (1024 * 1024))
            time.sleep(0.02)
            if os.path.exists("release"):
                control.should_training_stop = True

    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=32)
    data = [{"input_ids": torch.randint(0, 32, (8,)), "labels": torch.randint(0, 32, (8,))} for _ in range(8)]
    args = TrainingArguments(output_dir="out", max_steps=600, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=1000)
    Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data, callbacks=[Leak()]).train()
    """
)


@pytest.mark.slow
def test_vramscope_run_serves_the_trainers_series_while_it_trains(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from test_prometheus_server import free_port

    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    run = subprocess.Popen(
        [PYTHON, "-m", "vramscope", "run", "--prometheus", f"127.0.0.1:{port}", "--log", "tiny.csv", "--",
         PYTHON, "train.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def training_with_a_leak() -> Series | None:
        if run.poll() is not None:
            pytest.fail(f"vramscope run ended early: {run.communicate()[1][-2000:]}")
        try:
            series = scrape(url)
        except OSError:  # not listening yet
            return None
        return series if values(series, "vramscope_leak_slope_bytes_per_step", rank="0") else None

    try:
        series = wait_until(training_with_a_leak, "the Trainer's leak on the endpoint", timeout=300)
        assert run.poll() is None  # scraped while it trains
    finally:
        (tmp_path / "release").touch()
        _out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-2000:]
    mine = {"rank": "0", "run": "tiny"}
    # What a CPU run has, from the Trainer's own monitor: the step, its phase, its host RSS and peak ...
    step = values(series, "vramscope_training_step", **mine)
    assert step and step[0] >= 66  # the leak test needs that many steps
    assert values(series, "vramscope_training_steps_total", **mine) == step
    assert values(series, "vramscope_training_phase_info", phase="train", **mine) == [1]
    rss = values(series, "vramscope_host_rss_bytes", **mine)
    peak = values(series, "vramscope_host_rss_peak_bytes", **mine)
    assert rss and peak and peak[0] >= rss[0] > 50 * 1024**2
    # ... the live analysis: about 1 MiB per step, and a forecast against the host's memory ...
    slope = values(series, "vramscope_leak_slope_bytes_per_step", **mine)
    assert 0.5 * 1024**2 < slope[0] < 2 * 1024**2
    assert values(series, "vramscope_forecast_steps_to_oom", **mine)[0] > 0
    # ... and no allocator series on CPU; the parent's own process-level series beside them, without a rank.
    assert not [n for (n, _), _ in series.items() if n.startswith("vramscope_allocator_")]
    tree = [v for (n, ls), v in series.items() if n == "vramscope_host_rss_bytes" and "rank" not in dict(ls)]
    assert len(tree) == 1 and tree[0] > 0
    assert values(series, "vramscope_samples_total", run="tiny")
