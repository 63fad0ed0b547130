"""Peaks: the peaks of a log's whole columns, read one cache-sized stretch of rows at a time.
(The running peaks of a stream of samples, :class:`PeakTracker`, are :mod:`vramscope.sampling.peaks`.)"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Hashable, Iterable, Sequence
from functools import partial
from operator import is_not, lt
from typing import Any

from vramscope.sampling.peaks import GpuPeak, PeakTracker  # noqa: F401  (moved to sampling/; old imports still work)

# -- peaks of whole columns ------------------------------------------------------------------------
#
# A report reads a day of rows: a million cells per column, and each question asked of a column (its
# peak and where, each chart bucket's smallest and largest value, each phase's peak) would be a pass
# of its own. So a column is read once, one stretch of consecutive rows at a time (a slice of a few
# hundred cells, which stays in the CPU cache while min(), max() and index() run over it), cut
# wherever any of those questions needs a cut; the answers combine the stretches' own: ints have a
# total order, so the largest of the stretches' largest values is the column's, and the first stretch
# that holds it holds its first occurrence.

Stretch = tuple[Any, int, Any, int]  # (smallest known value, its first position, largest, its first position)


def has_known(values: Sequence[Any]) -> bool:
    """True when some cell is known (not None)."""
    # The first or the last cell settles it as a rule; the count runs only when both are unknown.
    if values and (values[0] is not None or values[-1] is not None):
        return True
    return values.count(None) != len(values)


def top_and_gap(values: Sequence[Any]) -> tuple[Any, bool]:
    """The largest known value (None when none is known), and whether some cell is unknown (None).

    One C pass when the column has no gap (the usual case): ``max`` raises on a None among numbers, so
    a ``max`` that returns a number has also proven that no cell is None, without a pass of its own.
    """
    try:
        top = max(values)
    except ValueError:  # empty
        return None, False
    except TypeError:  # a None among numbers
        if not has_known(values):
            return None, True
        return max(filter(_known, values)), True
    return top, top is None  # max([None]) is None


def runs(labels: Sequence[Hashable], limit: int | None = None) -> list[tuple[Any, int, int]] | None:
    """Stretches of consecutive equal labels, ``(label, start, end)``; None when there are more than ``limit``.

    ``limit`` keeps the per-stretch Python work bounded: a log whose phase changes every few rows
    is better read with a C pass per phase.
    """
    out: list[tuple[Any, int, int]] = []
    start = 0
    for label, group in itertools.groupby(labels):
        if limit is not None and len(out) == limit:
            return None
        end = start + len(list(group))
        out.append((label, start, end))
        start = end
    return out


def stretch_maxima(values: Sequence[Any], bounds: Sequence[int]) -> tuple[list[tuple[Any, int] | None], bool]:
    """The largest known value of each stretch ``values[bounds[k]:bounds[k + 1]]`` with the position of its
    first occurrence (None for a stretch with nothing known), and whether some cell is unknown (None)."""
    out: list[tuple[Any, int] | None] = []
    gap = False
    for lo, hi in itertools.pairwise(bounds):
        part = values[lo:hi]
        try:
            top = max(part)  # a None among numbers raises; [None] alone does not
        except TypeError:
            top = None
        if top is None:
            gap = True
            top = max(filter(_known, part), default=None)
            if top is None:
                out.append(None)
                continue
        out.append((top, lo + part.index(top)))  # max() keeps the first of equals; index() finds it
    return out, gap


def stretch_extremes(values: Sequence[Any], bounds: Sequence[int]) -> tuple[list[Stretch | None], bool]:
    """:func:`stretch_maxima` with each stretch's smallest known value too (what a min/max chart keeps)."""
    out: list[Stretch | None] = []
    gap = False
    for lo, hi in itertools.pairwise(bounds):
        part = values[lo:hi]
        try:
            low, high = min(part), max(part)
        except TypeError:
            low = high = None
        if low is None or high is None:
            gap = True
            known = list(filter(_known, part))
            if not known:
                out.append(None)
                continue
            low, high = min(known), max(known)
        out.append((low, lo + part.index(low), high, lo + part.index(high)))
    return out, gap


def combine(stretches: Iterable[Stretch | None]) -> Stretch | None:
    """The smallest and largest of consecutive stretches, each at its first occurrence (None: nothing known)."""
    best: Stretch | None = None
    for s in stretches:
        if s is None:
            continue
        if best is None:
            best = s
            continue
        low, i_low, high, i_high = best
        if s[0] < low:  # strict: an equal value further on is a later occurrence
            low, i_low = s[0], s[1]
        if s[2] > high:
            high, i_high = s[2], s[3]
        best = (low, i_low, high, i_high)
    return best


def regroup(
    stretches: Sequence[Stretch | None], cuts: Sequence[int], edges: Iterable[int]
) -> list[list[Stretch | None]]:
    """The stretches (cut at ``cuts``) of each range between two consecutive ``edges``, a coarser cut: every
    edge must be one of ``cuts``."""
    return [list(stretches[bisect.bisect_left(cuts, lo) : bisect.bisect_left(cuts, hi)])
            for lo, hi in itertools.pairwise(edges)]


_known = partial(is_not, None)  # a C-level "is not None" for filter()


class ColumnFacts:
    """What is known of whole columns, each fact worked out once and shared by all who read the same column
    objects: a report's charts and its analysis read the same cached columns of a table, and each fact
    (the largest or smallest known value, whether a cell is unknown, the stretches of a phase, the
    stretches' extremes) is a pass over a million cells.

    A column is known by its identity and held on to, so no other list can take its place in memory;
    the columns must not change while the facts are in use (a report only reads them).
    """

    def __init__(self) -> None:
        self._held: dict[int, tuple[Sequence[Any], dict[str, Any]]] = {}

    def _of(self, values: Sequence[Any]) -> dict[str, Any]:
        held = self._held.get(id(values))
        if held is None:
            held = self._held[id(values)] = (values, {})
        return held[1]

    def top(self, values: Sequence[Any]) -> Any:
        """The largest known value; None when none is known."""
        facts = self._of(values)
        if "top" not in facts:
            if facts.get("rising"):
                facts["top"], facts["gap"] = values[-1], False
            else:
                facts["top"], gap = top_and_gap(values)
                facts.setdefault("gap", gap)
        return facts["top"]

    def rising(self, values: Sequence[Any]) -> bool:
        """True when every cell is known and each is larger than the one before (a log's steps, its seconds).

        One C pass, cut short at the first fall; it then also gives the column's first and last value as
        its smallest and largest, and its length as its count of distinct values.
        """
        facts = self._of(values)
        if "rising" not in facts:
            if len(values) < 2:
                rising = bool(values) and values[0] is not None
            else:
                try:
                    rising = all(map(lt, values, itertools.islice(values, 1, None)))
                except TypeError:  # a None met before any fall
                    rising = False
            facts["rising"] = rising
        return bool(facts["rising"])

    def gap(self, values: Sequence[Any]) -> bool:
        """True when some cell is unknown (None)."""
        facts = self._of(values)
        if "gap" not in facts:
            self.top(values)
        return bool(facts["gap"])

    def learn_gap(self, values: Sequence[Any], gap: bool) -> None:
        """Keep what a pass over the whole column found out about its gaps."""
        self._of(values).setdefault("gap", gap)

    def low(self, values: Sequence[Any]) -> Any:
        """The smallest known value; None when none is known."""
        facts = self._of(values)
        if "low" not in facts:
            if facts.get("rising"):
                facts["low"] = values[0]
            elif self.top(values) is None:
                facts["low"] = None
            else:
                facts["low"] = min(filter(_known, values)) if facts["gap"] else min(values)
        return facts["low"]

    def runs(self, labels: Sequence[Hashable], limit: int | None = None) -> list[tuple[Any, int, int]] | None:
        """:func:`runs` of a label column."""
        facts = self._of(labels)
        if "runs" in facts:
            found: list[tuple[Any, int, int]] = facts["runs"]
            return found if limit is None or len(found) <= limit else None
        if limit is not None and limit <= facts.get("runs_over", -1):
            return None  # more than a larger limit already
        counted = runs(labels, limit)
        if counted is None:
            facts["runs_over"] = limit
        else:
            facts["runs"] = counted
        return counted

    def read(self, values: Sequence[Any], cuts: list[int]) -> list[Stretch | None]:
        """:func:`stretch_extremes` of a column of ints cut at ``cuts``, read once; its largest known value
        and whether it has a gap come with it."""
        facts = self._of(values)
        if facts.get("cuts") is not cuts:
            stretches, gap = stretch_extremes(values, cuts)
            found = combine(stretches)
            facts.update(cuts=cuts, stretches=stretches)
            facts.setdefault("top", None if found is None else found[2])
            facts.setdefault("gap", gap)
        return facts["stretches"]  # type: ignore[no-any-return]

    def stretches(self, values: Sequence[Any]) -> tuple[list[int], list[Stretch | None]] | None:
        """The cuts and the extremes of the column's stretches, when someone has :meth:`read` it."""
        facts = self._of(values)
        return (facts["cuts"], facts["stretches"]) if "stretches" in facts else None
