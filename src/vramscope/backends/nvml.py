"""GPU readings from NVML through nvidia-ml-py (the only module that imports ``pynvml``).

Never parses nvidia-smi. Every NVML call goes through :meth:`NvmlBackend._query`, which turns an
``NVMLError`` into a missing value, so one bad GPU or one unsupported field gives ``None`` for that
field, not a failed listing. Importing this module never touches the driver: the first reading does,
and an init failure is remembered and reported as "no NVIDIA GPU", like gpustat and nvitop do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

from vramscope.types import GpuReading, ProcessGpuReading

log = logging.getLogger(__name__)
T = TypeVar("T")

# NVML return codes (nvml.h); named here so that a fake module need not define them.
NOT_SUPPORTED = 3
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
# NVML's version tag of nvmlMemory_v2_t: (sizeof(struct) | 2 << 24).
MEMORY_V2 = 0x02000028

_ERROR_NAMES = {
    NOT_SUPPORTED: "not supported",
    FUNCTION_NOT_FOUND: "function missing in this driver",
    GPU_IS_LOST: "GPU is lost",
}


def _load_pynvml() -> ModuleType | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    module: ModuleType = pynvml
    return module


class NvmlBackend:
    """Reads every GPU's memory, utilization and compute processes.

    Args:
        nvml: the NVML module; defaults to ``pynvml``. Tests pass a scenario fake here.
        gpus: indices to read; ``None`` reads every GPU.
    """

    def __init__(self, nvml: ModuleType | Any | None = None, gpus: Iterable[int] | None = None) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._wanted = None if gpus is None else sorted(set(gpus))
        self._lock = threading.Lock()
        self._initialised = False
        self._init_error: str | None = None if self._nvml is not None else "nvidia-ml-py is not installed"
        self._warned: set[tuple[int, str]] = set()
        self._v2_memory = True  # False once the driver lacks the v2 call: every GPU uses v1
        self._v1_only: set[int] = set()  # GPUs that answered NotSupported to v2 (the others keep v2)
        self._handles: dict[int, Any] = {}
        # A GPU's UUID and name never change while NVML is up: read once each (two NVML calls a row saved on
        # the per-step path), and again only after close().
        self._identity: dict[int, tuple[Any, Any]] = {}
        self._count: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def _ensure_init(self) -> bool:
        with self._lock:
            if self._initialised:
                return True
            if self._init_error is not None:
                return False
            assert self._nvml is not None
            try:
                self._nvml.nvmlInit()
            except Exception as exc:  # NVMLError, OSError from a broken library, ...
                self._init_error = _describe(exc)
                return False
            self._initialised = True
            return True

    @property
    def init_error(self) -> str | None:
        """Why NVML is unavailable, or None when it works (initialises on first use)."""
        self._ensure_init()
        return self._init_error

    def is_available(self) -> bool:
        """True when NVML initialised and sees at least one GPU."""
        return self.device_count() > 0

    def device_count(self) -> int:
        if not self._ensure_init():
            return 0
        if self._count is None:
            # The driver's GPU count is fixed for the life of the NVML session (no hot-plug under CUDA).
            count = self._query(-1, "count", self._nvml.nvmlDeviceGetCount)  # type: ignore[union-attr]
            if count is None:
                return 0
            self._count = int(count)
        return self._count

    def indices(self) -> list[int]:
        count = self.device_count()
        if self._wanted is None:
            return list(range(count))
        return [i for i in self._wanted if i < count]

    def close(self) -> None:
        with self._lock:
            if self._initialised and self._nvml is not None:
                try:
                    self._nvml.nvmlShutdown()
                except Exception:  # shutting down twice or after a lost GPU is harmless
                    pass
            self._initialised = False
            self._handles.clear()
            self._identity.clear()
            self._count = None

    # -- reading ---------------------------------------------------------------------------------
    def read(self) -> tuple[GpuReading, ...]:
        """One reading of every selected GPU; empty when there is no NVIDIA GPU."""
        if not self._ensure_init():
            return ()
        return tuple(self._read_gpu(i) for i in self.indices())

    def _read_gpu(self, index: int) -> GpuReading:
        nvml = self._nvml
        assert nvml is not None
        handle = self._handles.get(index)
        if handle is None:
            handle = self._query(index, "handle", nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                return GpuReading(index=index, error="GPU unreachable")
            self._handles[index] = handle

        errors: list[str] = []
        used = total = free = reserved = None
        memory = self._memory_info(index, handle, errors)
        if memory is not None:
            used, total, free = int(memory.used), int(memory.total), int(memory.free)
            reserved = int(memory.reserved) if hasattr(memory, "reserved") else None

        util = self._query(index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle, errors=errors)
        uuid, name = self._identity.get(index, (None, None))
        if uuid is None or name is None:
            uuid = self._query(index, "uuid", nvml.nvmlDeviceGetUUID, handle, errors=errors)
            name = self._query(index, "name", nvml.nvmlDeviceGetName, handle, errors=errors)
            if uuid is not None and name is not None:
                self._identity[index] = (uuid, name)
        procs = self._query(index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle, errors=errors)
        return GpuReading(
            index=index,
            uuid=_text(uuid),
            name=_text(name),
            used_bytes=used,
            total_bytes=total,
            free_bytes=free,
            reserved_bytes=reserved,
            utilization_pct=int(util.gpu) if util is not None else None,
            processes=tuple(_process(p) for p in procs or ()),
            processes_known=procs is not None,
            error="; ".join(sorted(set(errors))) or None,
        )

    def _memory_info(self, index: int, handle: Any, errors: list[str]) -> Any:
        """v2 memory info where the driver has it (its ``used`` excludes the driver's reserve)."""
        nvml = self._nvml
        assert nvml is not None
        if self._v2_memory and index not in self._v1_only:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=MEMORY_V2)
            except Exception as exc:
                code = getattr(exc, "value", None)
                if code == FUNCTION_NOT_FOUND or isinstance(exc, TypeError):
                    # An old driver, or an nvidia-ml-py without the version argument: use v1 from now on.
                    self._v2_memory = False
                    log.info("NVML v2 memory info unavailable (%s); using v1", _describe(exc))
                elif code == NOT_SUPPORTED:
                    # This GPU only: switching every GPU to v1 would shift their "used" by the driver's
                    # reserve mid-run, a jump that looks like growth.
                    self._v1_only.add(index)
                    log.info("GPU %d: NVML v2 memory info not supported; using v1", index)
                else:
                    self._warn_once(index, "memory", exc)
                    errors.append(f"memory: {_describe(exc)}")
                    return None
        return self._query(index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle, errors=errors)

    def _query(
        self, index: int, what: str, func: Callable[..., T], *args: Any, errors: list[str] | None = None
    ) -> T | None:
        try:
            return func(*args)
        except Exception as exc:
            self._warn_once(index, what, exc)
            if errors is not None:
                errors.append(f"{what}: {_describe(exc)}")
            return None

    def _warn_once(self, index: int, what: str, exc: BaseException) -> None:
        key = (index, _describe(exc))  # one line per GPU and cause: a lost GPU fails every call
        if key not in self._warned:
            self._warned.add(key)
            where = "NVML" if index < 0 else f"GPU {index}"
            log.warning("%s: cannot read %s (%s); it will show as unknown", where, what, _describe(exc))


def _process(raw: Any) -> ProcessGpuReading:
    used = getattr(raw, "usedGpuMemory", None)
    return ProcessGpuReading(pid=int(raw.pid), gpu_bytes=int(used) if used is not None else None)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    if isinstance(code, int) and code in _ERROR_NAMES:
        return _ERROR_NAMES[code]
    if isinstance(code, int) and code in (DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND):
        return "no NVIDIA driver"
    text = str(exc).strip()
    return text or type(exc).__name__
