"""One reading as a JSON object: what ``vramscope watch --once --json`` prints (and ``--json`` per reading).

For scripts and monitoring agents that want the snapshot ``nvidia-smi -q -x`` would give, in vramscope's
units: every size is an int of bytes, ``null`` is unknown (never a fake 0), and ``schema_version`` changes
only when a field changes meaning or goes away (new fields may appear).
"""

from __future__ import annotations

from typing import Any

from vramscope.logs.schema import iso_time
from vramscope.types import GpuReading, Sample

SNAPSHOT_SCHEMA_VERSION = 1


def snapshot_dict(sample: Sample, nvml_error: str | None = None) -> dict[str, Any]:
    """The sample as plain JSON data; ``nvml_error`` says why there are no GPUs, when there are none."""
    return {
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        "time": iso_time(sample.time),
        "unix_time": sample.time,
        "gpus": [_gpu(g) for g in sample.gpus],
        "nvml_error": nvml_error if not sample.gpus else None,
        "host": {
            "system_used_bytes": sample.host.system_used_bytes,
            "system_total_bytes": sample.host.system_total_bytes,
        },
    }


def _gpu(gpu: GpuReading) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "used_bytes": gpu.used_bytes,
        "total_bytes": gpu.total_bytes,
        "free_bytes": gpu.free_bytes,
        "driver_reserved_bytes": gpu.reserved_bytes,
        "utilization_pct": gpu.utilization_pct,
        "error": gpu.error,
        # false: NVML could not list them, and the empty list means unknown rather than none
        "processes_known": gpu.processes_known,
        "processes": [
            {"pid": p.pid, "gpu_bytes": p.gpu_bytes, "name": p.name or None, "cmdline": p.cmdline or None}
            for p in sorted(gpu.processes, key=lambda p: -(p.gpu_bytes or 0))
        ],
    }
