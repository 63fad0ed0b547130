"""Plain-text renderings: for pipes, logs and `--once` without a terminal."""

from __future__ import annotations

from collections.abc import Sequence

from vramscope.logs.schema import iso_time
from vramscope.output.safetext import printable
from vramscope.types import GpuReading, HostReading, Sample
from vramscope.units import gib, human

SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int = 30, top: float | None = None) -> str:
    """The last ``width`` values as bars scaled to ``top`` (default: their maximum); gaps for unknowns."""
    tail = list(values)[-width:]
    known = [v for v in tail if v is not None]
    if not known:
        return ""
    ceiling = top if top else max(known)
    if ceiling <= 0:
        return SPARK[0] * len(tail)
    out = []
    for v in tail:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARK[min(len(SPARK) - 1, max(0, int(v / ceiling * (len(SPARK) - 1) + 0.5)))])
    return "".join(out)


def gpu_line(gpu: GpuReading) -> str:
    pct = f" ({100 * gpu.used_bytes / gpu.total_bytes:.0f}%)" if gpu.used_bytes is not None and gpu.total_bytes else ""
    util = f"{gpu.utilization_pct}%" if gpu.utilization_pct is not None else "?"
    line = f"GPU {gpu.index} {gpu.name or '?'}: used {gib(gpu.used_bytes)} / {gib(gpu.total_bytes)}{pct}, util {util}"
    if gpu.error:
        line += f" [{gpu.error}]"
    return line


def host_line(host: HostReading) -> str:
    return f"host memory: used {gib(host.system_used_bytes)} / {gib(host.system_total_bytes)}"


def snapshot_lines(sample: Sample) -> list[str]:
    lines = [f"{iso_time(sample.time)}"]
    for gpu in sample.gpus:
        lines.append(gpu_line(gpu))
        for proc in sorted(gpu.processes, key=lambda p: -(p.gpu_bytes or 0)):
            cmd = printable(proc.cmdline or proc.name or "?")
            lines.append(f"  pid {proc.pid:>7} {human(proc.gpu_bytes):>9}  {cmd[:100]}")
    lines.append(host_line(sample.host))
    return lines
