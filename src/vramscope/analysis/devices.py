"""The one place that groups a log's rows by device and by phase, and finds each column's peaks.

A device is a GPU (``"0"``, ``"1"``, ...) or, for rows without one, ``"host"``. Each row's phase is the
logged one; a row without one is ``"train"`` when it has a step (the training loop logged it) and
``"run"`` otherwise: a ``vramscope run`` log (no steps, no phases) is one stretch of the command's run,
and the report draws no band for either. The peaks are the first of equals, overall and per phase.
"""

from __future__ import annotations

import numpy as np

from vramscope.analysis.columns import LogColumns, argmax_known
from vramscope.analysis.results import PeakAt, PhaseStretch
from vramscope.logs.cells import Column

TRAIN = "train"
START = "start"  # the monitor's first row, before any step: its peak is loading's (the allocator counts from the start)
RUN = "run"  # the rows of a log without steps or phases: the watched command's run
TRAIN_PHASES = (None, "", "train")  # the logged phases whose rows the leak test reads

Selector = slice | np.ndarray  # a device's rows: a slice (every row, or a regular interleave) or positions

_LOWEST = np.iinfo(np.int64).min


def device_rows(cols: LogColumns) -> dict[str, Selector]:
    """Each device's rows, in order of first appearance: a slice when the devices' rows interleave
    regularly (the usual case; then the device's cells are views, not copies), else the positions."""
    gpu = cols.column("gpu")
    n = cols.n
    if not n:
        return {}
    if gpu.known.all() and gpu.values.min() == gpu.values.max():  # one GPU: two reductions, no array of every row
        return {_key(int(gpu.values[0])): slice(None)}
    # The lowest int64 is no GPU's index: it stands for the host (a row without a GPU).
    ids = np.where(gpu.known, gpu.values, _LOWEST)
    first = int(ids[0])
    if (ids == first).all():
        return {_key(first): slice(None)}
    distinct, where = np.unique(ids, return_index=True)
    order = np.argsort(where, kind="stable")
    found = [int(g) for g in distinct[order]]
    k = len(found)
    if all((ids[j::k] == g).all() for j, g in enumerate(found)):
        return {_key(g): slice(j, None, k) for j, g in enumerate(found)}
    return {_key(g): np.flatnonzero(ids == g) for g in found}


def _key(gpu: int) -> str:
    return "host" if gpu == _LOWEST else str(gpu)


class DeviceRows:
    """One device's rows of the log's columns: its cells of each column (read once), its phase labels and
    their stretches, and the peaks of any column within them."""

    def __init__(self, key: str, sel: Selector, cols: LogColumns) -> None:
        self.key = key
        self.sel = sel
        self.cols = cols
        # The table row of each of the device's rows (a slice's: its interleave alone), made when asked for.
        self._positions: np.ndarray | None = None
        if isinstance(sel, slice):
            self.n = len(range(*sel.indices(cols.n)))
        else:
            self._positions = np.arange(cols.n)[sel]
            self.n = len(self._positions)
        self.every = self.n == cols.n  # the device has every row: its cells are the columns themselves
        self._cells: dict[str, Column] = {}
        self._training_phase: np.ndarray | None = None
        step = self.column("step")
        self.has_steps = bool(step.known.any())
        self.codes, self.names = self._phase_labels()
        change = np.flatnonzero(self.codes[1:] != self.codes[:-1]) + 1
        self.starts = np.concatenate(([0], change)).astype(np.int64) if self.n else np.zeros(0, np.int64)
        self.ends = np.concatenate((change, [self.n])).astype(np.int64) if self.n else np.zeros(0, np.int64)

    @property
    def positions(self) -> np.ndarray:
        """The table row of each of the device's rows."""
        if self._positions is None:
            assert isinstance(self.sel, slice)  # positions are made at once for any other selector
            self._positions = np.arange(*self.sel.indices(self.cols.n))
        return self._positions

    def row(self, j: int) -> int:
        """The table row of the device's row ``j`` (itself when the device has every row: no positions made)."""
        return j if self.every else int(self.positions[j])

    def column(self, name: str) -> Column:
        found = self._cells.get(name)
        if found is None:
            whole = self.cols.column(name)
            found = self._cells[name] = whole if self.every else Column(whole.values[self.sel], whole.known[self.sel])
        return found

    def filled(self, name: str) -> bool:
        """The column has a value somewhere in the log (not only on this device's rows)."""
        return self.cols.filled(name)

    # -- phases ---------------------------------------------------------------------------------
    def _phase_labels(self) -> tuple[np.ndarray, list[str]]:
        logged = self.cols.labels("phase")
        codes = logged.codes if self.every else logged.codes[self.sel]
        names = list(logged.names)
        empty = codes < 0
        if not empty.any():
            return codes, names
        step = self.column("step")
        codes = codes.copy()
        for label, rows in ((TRAIN, empty & step.known), (RUN, empty & ~step.known)):
            if rows.any():
                if label not in names:
                    names.append(label)
                codes[rows] = names.index(label)
        return codes, names

    def label(self, j: int) -> str:
        return self.names[int(self.codes[j])]

    def stretches(self) -> tuple[PhaseStretch, ...]:
        return tuple(PhaseStretch(self.names[int(self.codes[s])], int(s), int(e))
                     for s, e in zip(self.starts.tolist(), self.ends.tolist(), strict=True))

    def phase_rows(self) -> dict[str, int]:
        """Each phase's row count, in order of its first row."""
        out: dict[str, int] = {}
        for s, e in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            label = self.names[int(self.codes[s])]
            out[label] = out.get(label, 0) + e - s
        return out

    def training_phase(self) -> np.ndarray:
        """The rows of a training phase (logged as ``train`` or with no phase): not eval's, predict's or a
        start-up's, whose batches and memory are their own. Made once (the leak test, the batches and the forecast
        each ask); read-only."""
        if self._training_phase is None:
            logged = self.cols.labels("phase")
            codes = logged.codes if self.every else logged.codes[self.sel]
            # One lookup per row (the last entry is code -1's, no phase: training), not isin's passes.
            in_phase = np.array([name in TRAIN_PHASES for name in logged.names] + [True])
            in_train: np.ndarray = in_phase[codes]
            in_train.flags.writeable = False
            self._training_phase = in_train
        return self._training_phase

    def training(self) -> np.ndarray:
        """The rows the leak test reads: a training phase (empty or ``train``) with a known step."""
        rows: np.ndarray = np.logical_and(self.training_phase(), self.column("step").known)
        return rows

    # -- peaks ------------------------------------------------------------------------------------
    def argmax(self, name: str) -> int | None:
        """The device's first row of the column's largest known value."""
        col = self.column(name)
        return argmax_known(col.values, col.known)

    def phase_maxima(self, name: str) -> dict[str, int]:
        """Each phase's first row of its largest known value, in order of the phase's first known value."""
        col = self.column(name)
        if not self.n or not col.known.any():
            return {}
        masked = col.values if col.known.all() else np.where(col.known, col.values, _LOWEST)
        if len(self.starts) == 1:
            return {self.names[int(self.codes[0])]: int(np.argmax(masked))}
        # One pass gives each stretch's largest; each phase's is the largest of its stretches, and its first
        # occurrence lies in the first stretch that holds it.
        tops = np.maximum.reduceat(masked, self.starts)
        known_in = np.logical_or.reduceat(col.known, self.starts)
        stretch_codes = self.codes[self.starts]
        out: dict[str, int] = {}
        order: list[int] = []
        best: dict[int, int] = {}
        for s, (code, top, ok) in enumerate(zip(stretch_codes.tolist(), tops.tolist(), known_in.tolist(),
                                                strict=True)):
            if not ok:
                continue
            if code not in best:
                order.append(code)
                best[code] = s
            elif top > tops[best[code]]:  # strict: the first of equals
                best[code] = s
        for code in order:
            s = best[code]
            lo, hi = int(self.starts[s]), int(self.ends[s])
            out[self.names[code]] = lo + int(np.argmax(masked[lo:hi]))
        return out

    def peak_at(self, name: str, j: int, since_start_s: float | None = None) -> PeakAt:
        """The reading of a column on the device's row ``j``, with where it was."""
        step = self.column("step")
        elapsed = self.column("elapsed_s")
        row = self.row(j)
        return PeakAt(row=row, bytes=int(self.column(name).values[j]),
                      step=int(step.values[j]) if step.known[j] else None, phase=self.label(j),
                      time=self.cols.text("time", row),
                      elapsed_s=float(elapsed.values[j]) if elapsed.known[j] else None, since_start_s=since_start_s)
