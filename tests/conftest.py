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
