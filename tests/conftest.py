"""Shared fixtures: NVML scenarios (fakes at the hardware boundary) and the `gpu` marker's skip."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # so tests can `import fake_nvml`

import fake_nvml

# One intra-op thread for torch in the test processes and every child they start (unless the caller chose):
# the models here are tiny, so a second thread buys nothing, and with pytest-xdist's workers and their children
# all on the same few cores, OpenMP threads waiting on each other at every barrier only burn time.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (what `make test` runs): half again as many workers as cores, at least one more than them.

    About a quarter of the suite's time is spent waiting, not computing: on a child process's start-up, a
    real server's interval, a signal's grace period, a sampler's ticks. With one worker per core, a core
    sits idle while its worker waits; the extra workers run other tests meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS
    still chooses, as pytest-xdist documents.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + (cores + 1) // 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def nvml_two_gpus() -> fake_nvml.FakeNvml:
    return fake_nvml.two_healthy_gpus()


@pytest.fixture
def nvml_gpu_lost() -> fake_nvml.FakeNvml:
    return fake_nvml.one_gpu_lost()


@pytest.fixture
def nvml_not_supported() -> fake_nvml.FakeNvml:
    return fake_nvml.not_supported_fields()


@pytest.fixture
def nvml_old_driver() -> fake_nvml.FakeNvml:
    return fake_nvml.old_driver_without_v2()


@pytest.fixture
def nvml_no_driver() -> fake_nvml.FakeNvml:
    return fake_nvml.no_driver()
