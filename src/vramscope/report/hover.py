"""The values under the pointer: a chart's x range cut into stretches, each with every series' smallest
and largest value there and the phase bands it crosses.

The page has no script, so a value on hover is an SVG ``<title>``: one per stretch (a transparent
column over the plot) rather than one per drawn point, which keeps a page of several GPUs small. The
lines are already min/max buckets of the log (:mod:`vramscope.report.downsample`), so a stretch's
range holds the log's true extremes there, spikes included.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Series(Protocol):
    """A drawn line (:class:`vramscope.report.model.Line`)."""

    metric: str
    label: str
    xs: list[float]
    ys: list[float]


class Band(Protocol):
    """A phase band (:class:`vramscope.report.model.Span`)."""

    start: float
    end: float

HOVER_COLUMNS = 120  # about 7 px each on a 960 px chart: fine enough to point at, few enough to stay small
MEASURED = ("trend", "forecast")  # lines drawn from the analysis, not readings: not listed on hover


@dataclass
class Hover:
    """One stretch of x, ``[x0, x1)``: each series' (label, smallest, largest) there, and the bands it
    crosses (positions in the chart's ``spans``)."""

    x0: float
    x1: float
    values: list[tuple[str, float, float]] = field(default_factory=list)
    spans: list[int] = field(default_factory=list)


def hover_buckets(series: Sequence[Series], bands: Sequence[Band], columns: int = HOVER_COLUMNS) -> list[Hover]:
    """A chart's hover stretches over the x range of its readings; empty for a chart with none."""
    lines = [line for line in series if line.xs and line.metric not in MEASURED]
    if not lines:
        return []
    # The ends of a line are its extremes only while its x grows: a clock stepped back (an nvidia-smi stamp
    # before the one above it) puts a reading outside them.
    lo = min(min(line.xs) for line in lines)
    hi = max(max(line.xs) for line in lines)
    if hi <= lo:
        # One x for every reading: a stretch of one unit, or of one representable step above it where a
        # unit is lost in rounding (an x near 2**53 plus 1.0 is the same x).
        hi = max(lo + 1.0, math.nextafter(lo, math.inf))
    width = (hi - lo) / columns
    out = [Hover(lo + i * width, lo + (i + 1) * width) for i in range(columns)]
    for line in lines:
        tops: list[float | None] = [None] * columns
        lows: list[float | None] = [None] * columns
        for x, y in zip(line.xs, line.ys, strict=False):
            i = min(columns - 1, int((x - lo) / width))
            top, low = tops[i], lows[i]
            tops[i] = y if top is None or y > top else top
            lows[i] = y if low is None or y < low else low
        for i in range(columns):
            low, top = lows[i], tops[i]
            if low is not None and top is not None:
                out[i].values.append((line.label, low, top))
    starts = [h.x0 for h in out]
    for k, band in enumerate(bands):
        first = max(0, bisect.bisect_right(starts, band.start) - 1)
        last = max(first, bisect.bisect_right(starts, band.end) - 1)
        for i in range(first, min(last, columns - 1) + 1):
            out[i].spans.append(k)
    return [h for h in out if h.values or h.spans]
