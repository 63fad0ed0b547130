"""The log schema: how a :class:`Sample` becomes rows.

The log is *long*: one row per GPU per sample (``gpu`` empty when there is no GPU). The columns up to
``host_rss_bytes`` are the stable core that other tools may rely on; later columns may be added,
never renamed. Empty cell = unknown.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from vramscope.types import AllocatorReading, Sample, allocator_of

CORE_COLUMNS: tuple[str, ...] = (
    "time",
    "elapsed_s",
    "step",
    "gpu",
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "device_used_bytes",
    "device_total_bytes",
    "process_bytes",
    "host_rss_bytes",
)
EXTRA_COLUMNS: tuple[str, ...] = (
    "phase",
    "tokens",
    "rank",
    "gpu_uuid",
    "active_bytes",
    "inactive_split_bytes",
    "num_alloc_retries",
    "num_ooms",
    "device_free_bytes",
    "utilization_pct",
    "system_used_bytes",
)
COLUMNS: tuple[str, ...] = CORE_COLUMNS + EXTRA_COLUMNS
# What each column holds, for readers that parse numbers as they read: text, seconds, the rest integers.
TEXT_COLUMNS: tuple[str, ...] = ("time", "phase", "gpu_uuid")
FLOAT_COLUMNS: tuple[str, ...] = ("elapsed_s",)
INT_COLUMNS: tuple[str, ...] = tuple(c for c in COLUMNS if c not in TEXT_COLUMNS + FLOAT_COLUMNS)

Row = dict[str, Any]


def iso_time(unix: float) -> str:
    """ISO 8601 in UTC with milliseconds, e.g. ``2026-11-29T18:40:09.123+00:00``."""
    return datetime.fromtimestamp(unix, tz=timezone.utc).isoformat(timespec="milliseconds")


def sample_rows(sample: Sample) -> list[Row]:
    """One row per GPU of the sample; a single row with ``gpu`` None when there is no GPU."""
    base: Row = {
        "time": iso_time(sample.time),
        "elapsed_s": round(sample.elapsed_s, 3),
        "step": sample.step,
        "phase": sample.phase,
        "tokens": sample.tokens,
        "rank": sample.extra.get("rank"),
        "host_rss_bytes": sample.host.rss_bytes,
        "system_used_bytes": sample.host.system_used_bytes,
    }
    for key, value in sample.extra.items():
        base.setdefault(key, value)

    rows: list[Row] = []
    gpus = sample.gpus
    if sample.allocator:
        # A training process logs the GPUs it uses (those its allocator has touched), not every GPU NVML
        # lists: under DDP each rank's rows are its own GPU's, not a second copy of its neighbours'.
        own = tuple(g for g in gpus if allocator_of(g, sample.allocator) is not None)
        gpus = own or gpus
    if gpus:
        for gpu in gpus:
            row = dict(base)
            row.update(
                gpu=gpu.index,
                gpu_uuid=gpu.uuid,
                device_used_bytes=gpu.used_bytes,
                device_total_bytes=gpu.total_bytes,
                device_free_bytes=gpu.free_bytes,
                utilization_pct=gpu.utilization_pct,
                process_bytes=sample.process_bytes(gpu.index),
            )
            _put_allocator(row, allocator_of(gpu, sample.allocator))
            rows.append(row)
    elif sample.allocator:  # torch sees GPUs that NVML cannot (no NVML in a container, say)
        for reading in sample.allocator:
            row = dict(base, gpu=reading.device, gpu_uuid=reading.uuid)
            _put_allocator(row, reading)
            rows.append(row)
    else:
        rows.append(dict(base, gpu=None))
    return rows


def _put_allocator(row: Row, reading: AllocatorReading | None) -> None:
    if reading is None:
        return
    row.update(
        allocated_bytes=reading.allocated_bytes,
        reserved_bytes=reading.reserved_bytes,
        peak_allocated_bytes=reading.peak_allocated_bytes,
        active_bytes=reading.active_bytes,
        inactive_split_bytes=reading.inactive_split_bytes,
        num_alloc_retries=reading.num_alloc_retries,
        num_ooms=reading.num_ooms,
    )
