"""The sampler, the collector and the file sinks, on the real host backend and NVML scenarios."""

from __future__ import annotations

import csv
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest

import fake_nvml
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.reader import read_log
from vramscope.logs.schema import CORE_COLUMNS
from vramscope.logs.sinks import CsvSink, JsonlSink, LogPathError, log_sink
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.types import AllocatorReading, Sample


def test_collector_reads_real_host_memory() -> None:
    sample = Collector(host=HostBackend()).collect()
    assert sample.host.rss_bytes is not None and sample.host.rss_bytes > 10 * 1024**2
    assert sample.host.system_total_bytes is not None and sample.host.system_total_bytes > sample.host.rss_bytes
    assert os.getpid() in (sample.watched_pids or set())
    assert sample.gpus == ()


def test_process_bytes_counts_only_the_watched_tree() -> None:
    nvml = fake_nvml.two_healthy_gpus(pid=os.getpid())
    sample = Collector(nvml=NvmlBackend(nvml=nvml), host=HostBackend()).collect()
    assert sample.process_bytes(0) == 18 * fake_nvml.GIB  # not the other process's 1 GiB
    assert sample.process_bytes(1) == 0  # we hold nothing there
    assert sample.process_bytes(5) is None  # no such GPU


def test_process_bytes_is_unknown_when_nvml_cannot_list_processes() -> None:
    nvml = fake_nvml.not_supported_fields()
    sample = Collector(nvml=NvmlBackend(nvml=nvml), host=HostBackend()).collect()
    assert sample.process_bytes(0) is None  # never a fake 0


class Exploding:
    def read(self) -> tuple[AllocatorReading, ...]:
        raise RuntimeError("driver hiccup")


def test_a_failing_backend_is_reported_once_and_sampling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    collector = Collector(allocator=Exploding(), host=HostBackend())
    with caplog.at_level(logging.WARNING):
        samples = [collector.collect() for _ in range(3)]
    assert all(s.allocator == () and s.host.rss_bytes for s in samples)
    assert len([r for r in caplog.records if "torch allocator" in r.getMessage()]) == 1


class BrokenSink:
    def __init__(self) -> None:
        self.calls = 0

    def write(self, sample: Sample) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        pass


def test_a_failing_sink_does_not_stop_the_others(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broken = BrokenSink()
    good = CsvSink(tmp_path / "m.csv")
    sampler = Sampler(Collector(host=HostBackend()), [broken, good], interval=0.05)
    with caplog.at_level(logging.WARNING):
        for _ in range(4):
            sampler.sample_now()
    sampler.close()
    assert broken.calls == 4
    assert len(read_log(tmp_path / "m.csv")) == 4
    assert len([r for r in caplog.records if "No space left" in r.getMessage()]) == 1


def test_background_sampler_keeps_the_interval_and_stops(tmp_path: Path) -> None:
    sink = CsvSink(tmp_path / "m.csv")
    sampler = Sampler(Collector(host=HostBackend()), [sink], interval=0.05, history=5)
    sampler.start()
    time.sleep(0.6)
    sampler.close()
    assert not any(t.name == "vramscope-sampler" for t in threading.enumerate())
    rows = len(read_log(tmp_path / "m.csv"))
    assert 6 <= rows <= 16  # ~12 at 20 Hz plus the final sample; loose for a loaded CI machine
    assert len(sampler.history) == 5  # bounded


@pytest.mark.parametrize("interval", [0.0, -1.0, 0.01])
def test_interval_below_the_minimum_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match=r"at least 0\.05"):
        Sampler(Collector(), interval=interval)


def test_csv_is_long_one_row_per_gpu_with_the_core_columns(tmp_path: Path) -> None:
    nvml = fake_nvml.two_healthy_gpus(pid=os.getpid())
    path = tmp_path / "m.csv"
    sink = CsvSink(path)
    sink.write(Collector(nvml=NvmlBackend(nvml=nvml), host=HostBackend()).collect(step=7))
    sink.close()
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert list(reader.fieldnames or [])[: len(CORE_COLUMNS)] == list(CORE_COLUMNS)
        rows = list(reader)
    assert [r["gpu"] for r in rows] == ["0", "1"]
    assert rows[0]["step"] == "7"
    assert rows[0]["device_used_bytes"] == str(20 * fake_nvml.GIB)
    assert rows[0]["process_bytes"] == str(18 * fake_nvml.GIB)
    assert rows[0]["allocated_bytes"] == ""  # unknown is empty, never 0
    assert rows[0]["time"].endswith("+00:00")


def test_rows_are_on_disk_after_each_sample_even_without_close(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    sink = CsvSink(path)
    collector = Collector(host=HostBackend())
    sink.write(collector.collect())
    sink.write(collector.collect())
    # Read through another file handle while the sink is still open: what a kill -9 would leave.
    assert len(path.read_text().splitlines()) == 3
    sink.close()


def test_jsonl_has_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    sink = log_sink(path)
    assert isinstance(sink, JsonlSink)
    sink.write(Collector(host=HostBackend()).collect(step=3, phase="train"))
    sink.close()
    row = json.loads(path.read_text().splitlines()[0])
    assert row["step"] == 3 and row["phase"] == "train" and row["gpu"] is None
    assert row["host_rss_bytes"] > 0
    table = read_log(path)
    assert table.ints("step") == [3]


def test_unwritable_log_paths_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(LogPathError, match=r"does not exist; create it first"):
        CsvSink(tmp_path / "missing" / "m.csv")
    with pytest.raises(LogPathError, match="is a directory"):
        CsvSink(tmp_path)


def test_a_training_process_logs_only_the_gpus_its_allocator_uses() -> None:
    from vramscope.logs.schema import sample_rows

    nvml = fake_nvml.two_healthy_gpus(pid=os.getpid())
    gpus = NvmlBackend(nvml=nvml).read()
    mine = AllocatorReading(device=0, allocated_bytes=5, reserved_bytes=8, uuid=gpus[1].uuid)
    rows = sample_rows(Sample(time=0.0, elapsed_s=0.0, gpus=gpus, allocator=(mine,)))
    assert [r["gpu"] for r in rows] == [1]  # torch's device 0 is NVML's GPU 1 here (joined by UUID)
    assert rows[0]["allocated_bytes"] == 5
    # Without allocator readings (a `vramscope run` log) every GPU is logged.
    assert [r["gpu"] for r in sample_rows(Sample(time=0.0, elapsed_s=0.0, gpus=gpus))] == [0, 1]
