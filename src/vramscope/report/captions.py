"""How the report names what it draws, in the renderers' one voice (the judgements themselves are the analysis':
:mod:`vramscope.analysis.verdicts`, read from the typed results):

* :func:`capacity_source`: where a device's capacity comes from (``--gpu-memory``, or the log's total, named
  by its format: NVML's, nvidia-smi's ``memory.total``, the total column of the user's own log), so that every
  chart of a device draws one capacity and names it;
* :func:`forecast_limit_note`: why the forecast runs to a lower line than the capacity drawn.
"""

from __future__ import annotations

from vramscope.logs.formats import LogFormat
from vramscope.units import gib, human_precise


def capacity_source(given: bool, log_format: LogFormat, has_total: bool) -> str | None:
    """Where the capacity a device is held against comes from, as people read it; None when unknown.

    The log's total is named by what its format read it from (:attr:`LogFormat.total_from`)."""
    if given:
        return "--gpu-memory"
    if not has_total:
        return None
    return f"GPU total, {log_format.total_from}"


def forecast_limit_note(limit_bytes: int | None, capacity_bytes: int | None) -> str | None:
    """Why the forecast runs to a lower line than the capacity drawn, when it does.

    The allocator cannot reach what the CUDA context and other processes hold, so a forecast of
    torch's memory runs to the total less that (:func:`vramscope.analysis.forecast.allocator_capacity`).
    """
    if limit_bytes is None or capacity_bytes is None or limit_bytes >= capacity_bytes:
        return None
    held = capacity_bytes - limit_bytes
    return (f"the forecast runs to the {gib(limit_bytes, 1)} torch can allocate: the "
            f"{gib(capacity_bytes, 1)} capacity less {human_precise(held)} held outside torch's allocator "
            "(CUDA context, libraries, other processes)")
