"""NvmlBackend over NVML scenarios faked at the module boundary."""

from __future__ import annotations

import logging

import pytest

import fake_nvml
from vramscope.backends.nvml import NvmlBackend

GIB = fake_nvml.GIB


def test_two_healthy_gpus_read_every_field(nvml_two_gpus: fake_nvml.FakeNvml) -> None:
    gpus = NvmlBackend(nvml=nvml_two_gpus).read()
    assert [g.index for g in gpus] == [0, 1]
    first = gpus[0]
    assert first.used_bytes == 20 * GIB  # v2: used excludes the driver's reserve
    assert first.reserved_bytes == 512 * 1024**2
    assert first.total_bytes == 141 * GIB
    assert first.free_bytes == first.total_bytes - first.used_bytes - first.reserved_bytes
    assert first.utilization_pct == 87
    assert first.name == "NVIDIA H200" and first.uuid and first.uuid.startswith("GPU-")
    assert {p.pid: p.gpu_bytes for p in first.processes} == {4242: 18 * GIB, 999_001: 1 * GIB}
    assert first.error is None


def test_gpu_selection_reads_only_the_chosen_gpus(nvml_two_gpus: fake_nvml.FakeNvml) -> None:
    gpus = NvmlBackend(nvml=nvml_two_gpus, gpus=[1, 7]).read()
    assert [g.index for g in gpus] == [1]  # 7 does not exist and is skipped


def test_lost_gpu_gives_unknowns_not_a_crash(
    nvml_gpu_lost: fake_nvml.FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    backend = NvmlBackend(nvml=nvml_gpu_lost)
    with caplog.at_level(logging.WARNING):
        first = backend.read()
        second = backend.read()
    assert first[0].used_bytes == 10 * GIB
    lost = first[1]
    assert lost.used_bytes is None and lost.total_bytes is None and lost.utilization_pct is None
    assert lost.error is not None and "lost" in lost.error
    assert second[1].used_bytes is None
    # Reported once per GPU and cause, not once per field and reading.
    assert len([r for r in caplog.records if "GPU 1" in r.getMessage()]) == 1


def test_not_supported_fields_are_none(nvml_not_supported: fake_nvml.FakeNvml) -> None:
    gpu = NvmlBackend(nvml=nvml_not_supported).read()[0]
    assert gpu.used_bytes == 5 * GIB
    assert gpu.utilization_pct is None
    assert gpu.processes == ()
    assert not gpu.processes_known  # unknown, not "no processes"
    assert gpu.error is not None and "not supported" in gpu.error


def test_process_memory_not_available_is_none() -> None:
    nvml = fake_nvml.FakeNvml([fake_nvml.FakeGpu(processes={1234: None, 5678: 3 * GIB})])
    procs = {p.pid: p.gpu_bytes for p in NvmlBackend(nvml=nvml).read()[0].processes}
    assert procs == {1234: None, 5678: 3 * GIB}


def test_old_driver_falls_back_to_v1_memory_info(nvml_old_driver: fake_nvml.FakeNvml) -> None:
    backend = NvmlBackend(nvml=nvml_old_driver)
    gpu = backend.read()[0]
    # v1 counts the driver's reserve as used and has no reserved field.
    assert gpu.used_bytes == 7 * GIB + 300 * 1024**2
    assert gpu.reserved_bytes is None
    backend.read()
    assert nvml_old_driver.calls.count("nvmlDeviceGetMemoryInfo_v2") == 1  # not retried every reading


def test_no_driver_means_no_gpus_and_a_reason(nvml_no_driver: fake_nvml.FakeNvml) -> None:
    backend = NvmlBackend(nvml=nvml_no_driver)
    assert backend.read() == ()
    assert backend.device_count() == 0
    assert not backend.is_available()
    assert backend.init_error == "no NVIDIA driver"


def test_close_shuts_nvml_down(nvml_two_gpus: fake_nvml.FakeNvml) -> None:
    backend = NvmlBackend(nvml=nvml_two_gpus)
    backend.read()
    backend.close()
    assert nvml_two_gpus.calls[-1] == "nvmlShutdown"
    assert backend.read()[0].used_bytes == 20 * GIB  # re-initialises on demand
