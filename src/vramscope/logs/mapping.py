"""The ``--columns`` mapping: which column of someone else's CSV fills which vramscope column, in which unit.

Parsed without reading any file (and without numpy), so that the command line checks it at once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from vramscope.units import GIB, MIB

# --columns field -> the vramscope column it fills. Byte fields take a unit.
BYTE_FIELDS = {
    "allocated": "allocated_bytes",
    "reserved": "reserved_bytes",
    "peak": "peak_allocated_bytes",
    "used": "device_used_bytes",
    "total": "device_total_bytes",
    "process": "process_bytes",
    "rss": "host_rss_bytes",
}
OTHER_FIELDS = {"time": "time", "elapsed": "elapsed_s", "step": "step", "gpu": "gpu", "rank": "rank",
                "tokens": "tokens", "phase": "phase"}
# Longer names people may write for the same fields (the schema's own names among them).
FIELD_ALIASES = {
    **{column: name for name, column in {**BYTE_FIELDS, **OTHER_FIELDS}.items()},
    "peak_allocated": "peak", "max_allocated": "peak", "device_used": "used", "memory.used": "used",
    "device_total": "total", "memory.total": "total", "capacity": "total", "host_rss": "rss",
    "timestamp": "time", "index": "gpu",
}
BYTE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": MIB, "gb": 1000**3, "gib": GIB,
              "tb": 1000**4, "tib": 1024**4}
TIME_UNITS = {"s": 1.0, "ms": 0.001}  # for a time given as a number (Unix time) or an elapsed time
_UNIT_NAMES = {"b": "B", "kb": "KB", "kib": "KiB", "mb": "MB", "mib": "MiB", "gb": "GB", "gib": "GiB",
               "tb": "TB", "tib": "TiB", "s": "s", "ms": "ms"}
EXAMPLE = "--columns time=0,step=1,allocated=2:GiB,reserved=3:GiB"
GPU_FIELDS = ("allocated", "reserved", "peak", "used", "total", "process")


class ColumnsError(ValueError):
    """A ``--columns`` mapping that cannot be read, with what to write instead."""


@dataclass(frozen=True)
class ColumnSpec:
    """One field of a mapping: which column of the file (0-based index or header name), in which unit."""

    field: str
    ref: int | str
    unit: str | None = None

    def __str__(self) -> str:
        unit = f":{_UNIT_NAMES[self.unit]}" if self.unit else ""
        return f"{self.field}={self.ref}{unit}"


def parse_columns(text: str) -> list[ColumnSpec]:
    """``"time=0,step=1,allocated=2:GiB"`` -> specs (fields by name, columns by index or header name).

    Raises:
        ColumnsError: an item without ``=``, an unknown field or unit, a field twice, no memory field.
    """
    specs: list[ColumnSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, eq, where = item.partition("=")
        if not eq or not where.strip():
            raise ColumnsError(f"--columns item {item!r} is not FIELD=COLUMN; write it like {EXAMPLE[10:]}")
        key = name.strip().lower()
        key = FIELD_ALIASES.get(key, key)
        known = [*OTHER_FIELDS, *BYTE_FIELDS]
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ColumnsError(f"--columns: unknown field {name.strip()!r}; {hint}fields: {', '.join(known)}")
        if any(s.field == key for s in specs):
            raise ColumnsError(f"--columns names {key} twice; give each field one column")
        ref_text, colon, unit_text = where.strip().rpartition(":") if ":" in where else (where.strip(), "", "")
        unit = _unit(key, unit_text.strip()) if colon else None
        ref_text = ref_text.strip()
        ref: int | str = int(ref_text) if ref_text.isdigit() else ref_text
        if not ref_text:
            raise ColumnsError(f"--columns {item!r}: say which column, by 0-based index or header name")
        specs.append(ColumnSpec(key, ref, unit))
    if not any(s.field in BYTE_FIELDS for s in specs):
        raise ColumnsError(f"--columns needs at least one memory column ({', '.join(BYTE_FIELDS)}), e.g. {EXAMPLE}")
    return specs


def _unit(key: str, text: str) -> str:
    unit = text.lower()
    if key in BYTE_FIELDS:
        if unit not in BYTE_UNITS:
            raise ColumnsError(f"--columns {key}: unknown unit {text!r}; use B, KB, KiB, MB, MiB, GB or GiB")
        return unit
    if key in ("time", "elapsed") and unit in TIME_UNITS:
        return unit
    raise ColumnsError(f"--columns {key} takes no unit {text!r}" + ("; s or ms for a number of seconds"
                                                                    if key in ("time", "elapsed") else ""))
