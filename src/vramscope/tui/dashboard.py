"""The live ``watch`` dashboard, drawn with rich from a history of samples."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from vramscope.logs.schema import iso_time
from vramscope.output.safetext import printable
from vramscope.tui.text import host_line, sparkline
from vramscope.types import Sample
from vramscope.units import gib, human

HISTORY_WIDTH = 30


def render(history: Sequence[Sample], interval: float) -> RenderableType:
    """One frame: a table of GPUs (bar, utilization, sparkline) and each GPU's processes."""
    if not history:
        return Text("waiting for the first reading...")
    latest = history[-1]
    gpus = Table(title=f"vramscope watch  {iso_time(latest.time)}  every {interval:g} s", expand=True)
    gpus.add_column("GPU", no_wrap=True)
    gpus.add_column("name")
    gpus.add_column("memory used", ratio=2)
    gpus.add_column("used / total", justify="right", no_wrap=True)
    gpus.add_column("util", justify="right")
    gpus.add_column(f"last {HISTORY_WIDTH}", no_wrap=True)
    procs = Table(title="processes", expand=True)
    procs.add_column("GPU", no_wrap=True)
    procs.add_column("pid", justify="right")
    procs.add_column("GPU memory", justify="right", no_wrap=True)
    procs.add_column("command", overflow="ellipsis", no_wrap=True, ratio=3)

    for gpu in latest.gpus:
        used, total = gpu.used_bytes, gpu.total_bytes
        bar: RenderableType = (
            ProgressBar(total=float(total), completed=float(used), width=None)
            if (used is not None and total)
            else Text("?")
        )
        series = [next((g.used_bytes for g in s.gpus if g.index == gpu.index), None) for s in history]
        util = f"{gpu.utilization_pct}%" if gpu.utilization_pct is not None else "?"
        name = escape(gpu.name or "?") + (f" [red]{escape(gpu.error)}[/]" if gpu.error else "")
        gpus.add_row(
            str(gpu.index),
            name,
            bar,
            f"{gib(used, 1)} / {gib(total, 1)}",
            util,
            sparkline(
                [float(v) if v is not None else None for v in series],
                HISTORY_WIDTH,
                top=float(total) if total else None,
            ),
        )
        for proc in sorted(gpu.processes, key=lambda p: -(p.gpu_bytes or 0)):
            # Text, not markup: a command line can hold '[' and ']' that rich would read as styles; and
            # printable(): rich passes escape sequences through to the terminal.
            cmd = printable(proc.cmdline or proc.name or "?")
            procs.add_row(str(gpu.index), str(proc.pid), human(proc.gpu_bytes), Text(cmd))
    parts: list[RenderableType] = [gpus]
    if procs.row_count:
        parts.append(procs)
    parts.append(Text(host_line(latest.host)))
    return Group(*parts)


def live(take: Callable[[], Sample], seen: Sequence[Sample], interval: float, ticks: int | None) -> None:
    """Redraw the dashboard every ``interval`` seconds, ``ticks`` times (None: until Ctrl-C)."""
    history: deque[Sample] = deque(seen, maxlen=64)
    with Live(render(history, interval), auto_refresh=False, screen=False) as screen:
        while ticks is None or ticks > 0:
            time.sleep(interval)
            history.append(take())
            screen.update(render(history, interval), refresh=True)
            ticks = None if ticks is None else ticks - 1
