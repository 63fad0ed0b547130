"""Byte formatting and parsing. Inside vramscope memory is an int of bytes; GiB is for people."""

from __future__ import annotations

import math
import re

GIB = 1024**3
MIB = 1024**2

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": MIB,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": GIB,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$", re.ASCII)
# The largest size accepted: an exbibyte is a million times any GPU, and keeps every size an exact int64.
MAX_BYTES = 1024**6
_MAX_SIZE_CHARS = 40  # checked before the regex and float(): a 400-digit size is refused, not inf


def parse_bytes(text: str) -> int:
    """``"24GiB"`` -> 25769803776; ``"80GB"`` -> 80e9; a bare number is bytes.

    Raises:
        ValueError: with a message that shows the accepted forms; also for a size above :data:`MAX_BYTES`, a
            text over 40 characters, or digits of other scripts ("٢٤GiB": ASCII only, as every number flag).
    """
    shown = repr(text) if len(text) <= _MAX_SIZE_CHARS else f"{text[:_MAX_SIZE_CHARS]!r}... ({len(text)} characters)"
    match = _SIZE.match(text) if len(text) <= _MAX_SIZE_CHARS else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        why = "too long" if len(text) > _MAX_SIZE_CHARS else "cannot read"
        raise ValueError(f"{why} {shown} as a memory size; write it like 24GiB, 80GB or 16384MiB (ASCII digits)")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory size must be positive, got {shown}")
    if value > MAX_BYTES:
        raise ValueError(f"memory size must be at most 1024 PiB, got {shown}")
    return int(value)


def gib(n: int | float | None, digits: int = 2, unknown: str = "?") -> str:
    """``None`` -> ``unknown`` (``"?"``); otherwise ``"12.34 GiB"``."""
    if n is None:
        return unknown
    return f"{n / GIB:.{digits}f} GiB"


def human(n: int | float | None) -> str:
    """Pick a unit that keeps the number short: ``"812 MiB"``, ``"12.3 GiB"``."""
    if n is None:
        return "?"
    size = abs(n)
    if size >= GIB:
        return f"{n / GIB:.1f} GiB"
    if size >= MIB:
        return f"{n / MIB:.0f} MiB"
    if size >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{int(n)} B"


def human_fixed(n: int | float | None, digits: int = 2) -> str:
    """``digits`` decimals in the unit that suits: ``"1.50 MiB"``, ``"12.34 GiB"``, ``"512 B"`` (bytes stay whole).

    For costs that span units (a per-token cost is KiB, a per-sample one MiB or GiB) with a steady width.
    """
    if n is None:
        return "?"
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} B"


def human_precise(n: int | float | None) -> str:
    """Like :func:`human`, with three significant digits so that small amounts keep their size:
    ``"40 B"``, ``"1.50 KiB"``, ``"256 KiB"``, ``"3.00 MiB"``, ``"12.3 GiB"``."""
    if n is None:
        return "?"
    unit, scale = next(((u, s) for u, s in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)) if abs(n) >= s), ("B", 1))
    if scale == 1:
        return f"{n:.0f} B"
    value = n / scale
    text = f"{value:.{2 if abs(value) < 10 else 1 if abs(value) < 100 else 0}f}"
    if abs(float(text)) >= 1024 and unit != "GiB":  # 1023.6 KiB rounds to 1024: that is 1.00 MiB
        return human_precise(math.copysign(scale * 1024, n))
    return f"{text} {unit}"
