"""A stand-in for the ``pynvml`` module, at the hardware boundary only.

Each scenario is a :class:`FakeNvml` built from plain data (GPUs with memory, processes, and the
errors some calls raise), passed to ``NvmlBackend(nvml=...)``. Errors carry NVML's real return codes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 1024**3

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    total: int = 141 * GIB
    used: int = 1 * GIB
    reserved: int = 512 * 1024**2
    util: int = 0
    uuid: str = ""
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes (None: not available)
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


class FakeNvml:
    """Module-like: the functions NvmlBackend calls, over a list of FakeGpu."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None, has_v2: bool = True) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.has_v2 = has_v2
        self.calls: list[str] = []
        self.initialised = False
        for i, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"

    def _check(self, func: str, index: int | None = None) -> None:
        self.calls.append(func)
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if index is not None:
            code = self.gpus[index].errors.get(func)
            if code is not None:
                raise NVMLError(code)

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        if version is not None:
            self._check("nvmlDeviceGetMemoryInfo_v2", handle)
            if not self.has_v2:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        else:
            self._check("nvmlDeviceGetMemoryInfo", handle)
        gpu = self.gpus[handle]
        if version is not None:
            return SimpleNamespace(
                total=gpu.total, used=gpu.used, free=gpu.total - gpu.used - gpu.reserved, reserved=gpu.reserved
            )
        # v1 counts the driver's reserve as used
        return SimpleNamespace(total=gpu.total, used=gpu.used + gpu.reserved, free=gpu.total - gpu.used - gpu.reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._check("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=self.gpus[handle].util, memory=0)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check("nvmlDeviceGetUUID", handle)
        return self.gpus[handle].uuid

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check("nvmlDeviceGetName", handle)
        return self.gpus[handle].name

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[handle].processes.items()]


# -- named scenarios ---------------------------------------------------------------------------------


def two_healthy_gpus(pid: int = 4242) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(used=20 * GIB, util=87, processes={pid: 18 * GIB, 999_001: 1 * GIB}),
            FakeGpu(used=2 * GIB, util=3, processes={}),
        ]
    )


def one_gpu_lost() -> FakeNvml:
    lost = {
        f: NVML_ERROR_GPU_IS_LOST
        for f in (
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetComputeRunningProcesses",
        )
    }
    return FakeNvml([FakeGpu(used=10 * GIB), FakeGpu(errors=lost)])


def not_supported_fields() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                used=5 * GIB,
                processes={1234: None},
                errors={
                    "nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED,
                    "nvmlDeviceGetComputeRunningProcesses": NVML_ERROR_NOT_SUPPORTED,
                },
            )
        ]
    )


def old_driver_without_v2() -> FakeNvml:
    return FakeNvml([FakeGpu(used=7 * GIB, reserved=300 * 1024**2)], has_v2=False)


def no_driver() -> FakeNvml:
    return FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
