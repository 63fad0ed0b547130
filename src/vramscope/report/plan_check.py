"""A distributed run's report against its plan: the strategy the monitor saw, each rank's peak beside the
per-rank plan (``vramscope plan --gpus N --strategy S --json``).

The monitor writes the strategy beside its log (``<log stem>.strategy.json``, by
:meth:`vramscope.integrations.loop.MemoryMonitor.note_strategy`); this module only reads files and compares
numbers already in the report's summary.

Like for like: a log's peaks are the whole run's (loading, evaluation, saves), so they are held against the plan's
whole run (:class:`~vramscope.planner.document.PlannedGpu`: every phase of the one-GPU plan, the step and the
loading of each GPU of a per-GPU plan), and its training steps' peaks against the plan's step. A plan that gives
the step's figures alone (an older file, a traced plan) stands for the whole run with them, and the note says so.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from vramscope.analysis.devices import RUN, START, TRAIN
from vramscope.analysis.results import AnalysisResult, DeviceDetail, PeakAt
from vramscope.logs.inputfile import FileTooLargeError, NotRegularFileError, read_json_file
from vramscope.output.names import STRATEGY_SUFFIX, sibling
from vramscope.planner.distributed import STRATEGY_NAMES as PLANNED_STRATEGY_NAMES
from vramscope.planner.document import PlanDocument, PlanDocumentError, PlannedGpu, PlannedGpus
from vramscope.planner.run_types import PHASE_WORDS
from vramscope.types import RunStrategy

SIDE_FILE_LIMIT = 16 << 20  # a plan or a strategy file is a few kB; 16 MiB is not one
# The planner's names, and the ways a run may be seen spread that the planner does not plan.
STRATEGY_NAMES = {**PLANNED_STRATEGY_NAMES, "zero1": "ZeRO-1", "zero": "ZeRO", "single": "one process"}
# A log's phases as the plan names them: the monitor's start row carries loading's peak (the allocator's counter
# runs from the process's start until that row), the steps are "train", an evaluation "eval" (Lightning's "test").
PLANNED_PHASE_OF_LOGGED = {START: "load", TRAIN: "train", "eval": "eval", "test": "eval"}


class PlanFileError(ValueError):
    """A --plan file that is not a plan: the message says what to pass."""


# A saved plan as per-GPU figures: the plan document's own reading (vramscope.planner.document).
SavedPlan = PlannedGpus


@dataclass(frozen=True)
class RankCheck:
    """One rank's (or, for a split, one GPU's) measured peaks beside the plan's, and the plan's error.

    The first figures are the whole log's (loading, evaluation and saves included) beside the plan's whole run,
    each with the phase that sets it (the log's phase as logged, the plan's as planned); the ``step`` ones the
    log's training steps beside the plan's step (None where the log has no steps, or a rank's GPU is not its own).
    """

    kind: str  # "rank" or "gpu"
    index: int
    measured_peak_allocated_bytes: int | None
    planned_peak_allocated_bytes: int | None
    allocated_error: float | None  # (planned - measured) / measured
    measured_device_bytes: int | None
    planned_process_bytes: int | None
    device_error: float | None
    measured_peak_phase: str | None = None
    planned_peak_phase: str | None = None
    measured_device_phase: str | None = None
    planned_process_phase: str | None = None
    measured_step_peak_allocated_bytes: int | None = None
    planned_step_peak_allocated_bytes: int | None = None
    step_allocated_error: float | None = None
    measured_step_device_bytes: int | None = None
    planned_step_process_bytes: int | None = None
    step_device_error: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.index, "measured_peak_allocated_bytes": self.measured_peak_allocated_bytes,
                "planned_peak_allocated_bytes": self.planned_peak_allocated_bytes,
                "allocated_error": self.allocated_error, "measured_device_bytes": self.measured_device_bytes,
                "planned_process_bytes": self.planned_process_bytes, "device_error": self.device_error,
                "measured_peak_phase": self.measured_peak_phase, "planned_peak_phase": self.planned_peak_phase,
                "measured_device_phase": self.measured_device_phase,
                "planned_process_phase": self.planned_process_phase,
                "measured_step_peak_allocated_bytes": self.measured_step_peak_allocated_bytes,
                "planned_step_peak_allocated_bytes": self.planned_step_peak_allocated_bytes,
                "step_allocated_error": self.step_allocated_error,
                "measured_step_device_bytes": self.measured_step_device_bytes,
                "planned_step_process_bytes": self.planned_step_process_bytes,
                "step_device_error": self.step_device_error}


@dataclass(frozen=True)
class ParallelismCheck:
    """The strategy seen beside the log and, with a plan, each rank against it (``summary["parallelism"]``)."""

    strategy: RunStrategy | None  # what the monitor recorded beside the log
    plan: SavedPlan | None
    ranks: tuple[RankCheck, ...] = ()
    note: str | None = None  # where the plan and the run differ (strategy, world size)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strategy": None if self.strategy is None else self.strategy.to_json()}
        if self.plan is None:
            return out
        out.update(plan_strategy=self.plan.strategy, plan_world_size=self.plan.world_size,
                   ranks=[r.to_json() for r in self.ranks], note=self.note,
                   plan_whole_run=all(g.whole_run for g in self.plan.per_gpu))
        return out


def strategy_beside(log_path: str | os.PathLike[str]) -> RunStrategy | None:
    """The strategy the monitor recorded beside ``log_path`` (``mem.csv`` -> ``mem.strategy.json``), if any.
    The monitor's name rule (:func:`vramscope.output.names.sibling`)."""
    try:
        candidate = sibling(log_path, suffix=STRATEGY_SUFFIX)
        # Bounded like every input: a FIFO or device of that name is passed over, never read or waited on.
        data = read_json_file(candidate, "a strategy file", SIDE_FILE_LIMIT)
        return RunStrategy.from_json(data)
    except (OSError, ValueError):
        return None


def read_plan(path: str | os.PathLike[str]) -> SavedPlan:
    """A plan saved by ``vramscope plan ... --json`` (with or without ``--gpus``), as a per-GPU plan.

    Raises:
        PlanFileError: unreadable, not JSON, or not a plan.
    """
    hint = "save one with: vramscope plan ... --gpus N --strategy S --json > plan.json"
    try:
        data = read_json_file(path, "a plan from 'vramscope plan ... --json'", SIDE_FILE_LIMIT)
    except (NotRegularFileError, FileTooLargeError) as exc:  # /dev/zero, a FIFO, a huge file
        raise PlanFileError(f"--plan: {exc}") from None
    except FileNotFoundError:
        raise PlanFileError(f"--plan {path}: no such file; {hint}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlanFileError(f"--plan {path} cannot be read as JSON ({type(exc).__name__}); {hint}") from None
    try:
        planned = PlanDocument.from_json(data).planned()
    except PlanDocumentError:
        raise PlanFileError(f"--plan {path} is not a plan; {hint}") from None
    if planned is None:
        raise PlanFileError(f"--plan {path} holds no per-GPU figures; {hint}")
    return planned


def _error(measured: int | None, planned: int | None) -> float | None:
    if measured is not None and planned is not None and measured > 0:
        return round((planned - measured) / measured, 4)
    return None


@dataclass(frozen=True)
class _Measured:
    """One rank's or GPU's peaks: the whole log's, with their phases, and its training steps'."""

    kind: str
    index: int
    allocated: int | None
    device: int | None
    allocated_phase: str | None = None
    device_phase: str | None = None
    step_allocated: int | None = None
    step_device: int | None = None


def _column(peaks: Mapping[str, PeakAt], *columns: str) -> str | None:
    """The first of ``columns`` the peaks have (a device's memory: the process's, else the GPU's)."""
    return next((c for c in columns if c in peaks), None)


def _of_device(kind: str, index: int, detail: DeviceDetail, device_columns: tuple[str, ...]) -> _Measured:
    allocated = detail.peaks.get("peak_allocated_bytes")
    column = _column(detail.peaks, *device_columns)
    device = None if column is None else detail.peaks[column]
    steps = detail.phases.get(TRAIN)
    step_allocated = None if steps is None else steps.peaks.get("peak_allocated_bytes")
    # the steps' device memory from the column the whole log's came from: like for like
    step_device = None if steps is None or column is None else steps.peaks.get(column)
    return _Measured(kind, index, None if allocated is None else allocated.bytes,
                     None if device is None else device.bytes, None if allocated is None else allocated.phase,
                     None if device is None else device.phase,
                     None if step_allocated is None else step_allocated.bytes,
                     None if step_device is None else step_device.bytes)


def _measured(result: AnalysisResult) -> list[_Measured]:
    """Each rank's peaks, or each GPU's for a log of one process."""
    details = {d.key: d.detail for d in result.devices if d.detail is not None}
    if result.ranks is not None and result.ranks.ranks:
        out = []
        holders = Counter(g for r in result.ranks.ranks for g in r.gpus)
        for r in result.ranks.ranks:
            own = details.get(str(r.gpus[0])) if len(r.gpus) == 1 and holders[r.gpus[0]] == 1 else None
            whole = _Measured("rank", r.rank, r.peaks.get("peak_allocated_bytes"),
                              r.peaks.get("peak_device_used_bytes"))
            if own is None:  # the GPU's rows are not this rank's alone: its phases are not the rank's
                out.append(whole)
                continue
            seen = _of_device("rank", r.rank, own, ("device_used_bytes",))
            # the rank's own figures stand; its GPU's rows (the same rows) give their phases and its steps
            out.append(replace(seen, allocated=whole.allocated, device=whole.device))
        return out
    return [_of_device("gpu", int(d.key), d.detail, ("process_bytes", "device_used_bytes"))
            for d in result.devices if d.key != "host" and d.detail is not None]


def _row(seen: _Measured, planned: PlannedGpu) -> RankCheck:
    run_allocated, run_process = planned.run_allocated_bytes, planned.run_process_bytes
    return RankCheck(
        seen.kind, seen.index, seen.allocated, run_allocated, _error(seen.allocated, run_allocated), seen.device,
        run_process, _error(seen.device, run_process), seen.allocated_phase,
        "train" if planned.run_allocated is None else planned.run_allocated.phase, seen.device_phase,
        "train" if planned.run_process is None else planned.run_process.phase,
        seen.step_allocated, planned.peak_allocated_bytes if seen.step_allocated is not None else None,
        _error(seen.step_allocated, planned.peak_allocated_bytes), seen.step_device,
        planned.process_bytes if seen.step_device is not None else None,
        _error(seen.step_device, planned.process_bytes))


def _phase_notes(rows: tuple[RankCheck, ...], plan: SavedPlan) -> list[str]:
    """Where the plan's whole run is only its step, or the log's peak is in a phase the plan does not plan."""
    notes = []
    if not all(g.whole_run for g in plan.per_gpu):
        notes.append("the plan gives the training step's figures only (a file from before the planner planned "
                     "the whole run, or a traced plan): the log's whole peaks are held against the step's")
        return notes
    planned_phases = plan.per_gpu[0].run_phases
    # a log without steps or phases (``vramscope run``'s) is one stretch, the whole run: no phase to tell apart
    unplanned = sorted({phase for r in rows for phase in (r.measured_peak_phase, r.measured_device_phase)
                        if phase not in (None, RUN) and PLANNED_PHASE_OF_LOGGED.get(phase) not in planned_phases})
    if unplanned:
        names = ", ".join(PHASE_WORDS.get(p, p) for p in planned_phases)
        notes.append(f"the log's peak is in its {' and '.join(repr(p) for p in unplanned)} rows, a phase the "
                     f"plan does not plan (it plans {names})")
    return notes


def check(result: AnalysisResult, plan: SavedPlan | None, strategy: RunStrategy | None) -> ParallelismCheck:
    """Each rank's (or, for a split, each GPU's) measured peak allocated and device memory beside the plan's:
    the whole log's beside the plan's whole run, and its training steps' beside the plan's step."""
    if plan is None:
        return ParallelismCheck(strategy, None)
    rows = []
    for i, measured in enumerate(_measured(result)):
        p = plan.per_gpu[min(i, len(plan.per_gpu) - 1)] if plan.strategy == "split" else plan.per_gpu[0]
        rows.append(_row(measured, p))
    seen = None if strategy is None else strategy.strategy
    planned = plan.strategy
    notes = []
    if seen and planned and seen != planned and not (seen == "single" and planned == "single"):
        notes.append(f"the plan is for {STRATEGY_NAMES.get(planned, planned)}, the run was "
                     f"{STRATEGY_NAMES.get(seen, seen)}")
    world = None if strategy is None else strategy.world_size
    if world is not None and plan.world_size is not None and world != plan.world_size and planned != "split":
        notes.append(f"the plan is for {plan.world_size} GPUs, the run had {world} ranks")
    notes.extend(_phase_notes(tuple(rows), plan))
    return ParallelismCheck(strategy, plan, tuple(rows), "; ".join(notes) or None)


__all__ = ["ParallelismCheck", "PlanFileError", "PlannedGpu", "SavedPlan", "check", "read_plan", "strategy_beside"]
