"""A log column as numbers or labels for whole-column work, and the per-cell rules every reader agrees with.

:class:`Column` (values with a known-mask) and :class:`Labels` (codes into distinct texts) are what the
analysis reads (:mod:`vramscope.logs.table`). :func:`int_of` / :func:`float_of` define what a cell
means as a number; the readers apply them to whole columns with pyarrow
(:mod:`vramscope.logs.arrow_columns`) and call them one by one only for cells that are not plain.

A cell is a number only when it is ASCII and within int64 (:func:`int_of`): a 400-digit cell from a
damaged or hostile log would overflow every float the analysis makes of it, and ``int()`` also reads
other scripts' digits ("٤"), which no writer of these logs produces. Such cells are unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite

import numpy as np

MAX_CELL_INT = 2**63 - 1


@dataclass(frozen=True)
class Column:
    """One log column as numbers for whole-column work: ``values[i]`` means something only where ``known[i]``.

    Unknown cells (empty, damaged, out of range) hold 0 in ``values``; ``values`` is int64 for the byte,
    step and count columns and float64 for seconds.
    """

    values: np.ndarray
    known: np.ndarray  # bool, one per row

    def __len__(self) -> int:
        return len(self.values)

    def any_known(self) -> bool:
        return bool(self.known.any())

    def all_known(self) -> bool:
        return bool(self.known.all())

    def tolist(self) -> list[int | float | None]:
        """The cells as Python numbers, None where unknown (the JSON edge, tests)."""
        if self.known.all():
            return self.values.tolist()  # type: ignore[no-any-return]
        if not self.known.any():
            return [None] * len(self.values)
        out = np.full(len(self.values), None, dtype=object)
        out[self.known] = self.values[self.known].tolist()
        return out.tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Labels:
    """A text column as codes into its distinct cells: ``names[codes[i]]``, code -1 for an empty cell."""

    codes: np.ndarray  # int32
    names: list[str]

    def __len__(self) -> int:
        return len(self.codes)

    def tolist(self) -> list[str | None]:
        table: list[str | None] = [*self.names, None]  # code -1 picks the None at the end
        return [table[c] for c in self.codes.tolist()]


def unknown_column(n: int, dtype: type) -> Column:
    return Column(np.zeros(n, dtype=dtype), np.zeros(n, dtype=bool))


def int_of(text: str) -> int | None:
    """A cell as an int: ``"1024"``, and ``"1.2e9"`` or ``"1024.0"`` from another writer; None if not a number
    (empty, damaged, not ASCII, beyond int64)."""
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        number = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            return None  # a damaged cell is unknown, not a failed report
        if not isfinite(value) or abs(value) > MAX_CELL_INT:
            return None
        number = int(value)
    return number if abs(number) <= MAX_CELL_INT else None


def float_of(text: str) -> float | None:
    """A cell as a finite float, or None (empty, damaged, not ASCII, inf or nan)."""
    if not text or not text.isascii() or len(text) > 64:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if isfinite(value) else None


def merge_labels(parts: Sequence[Labels]) -> Labels:
    """Labels of consecutive row blocks as one column's (names in order of first appearance)."""
    index: dict[str, int] = {}
    pieces = []
    for part in parts:
        remap = np.array([index.setdefault(name, len(index)) for name in part.names] + [-1], dtype=np.int32)
        pieces.append(remap[part.codes])  # code -1 picks the -1 at the end
    codes = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return Labels(codes.astype(np.int32, copy=False), list(index))
