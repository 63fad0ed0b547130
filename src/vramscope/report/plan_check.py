"""A distributed run's report against its plan: the strategy the monitor saw, each rank's peak beside the
per-rank plan (``vramscope plan --gpus N --strategy S --json``).

The monitor writes the strategy beside its log (``<log stem>.strategy.json``, by
:meth:`vramscope.integrations.loop.MemoryMonitor.note_strategy`); this module only reads files and compares
numbers already in the report's summary.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from vramscope.analysis.results import AnalysisResult
from vramscope.logs.inputfile import FileTooLargeError, NotRegularFileError, read_regular_file
from vramscope.output.names import STRATEGY_SUFFIX, sibling
from vramscope.planner.distributed import STRATEGY_NAMES as PLANNED_STRATEGY_NAMES
from vramscope.planner.document import PlanDocument, PlanDocumentError, PlannedGpu, PlannedGpus
from vramscope.types import RunStrategy

SIDE_FILE_LIMIT = 16 << 20  # a plan or a strategy file is a few kB; 16 MiB is not one
# The planner's names, and the ways a run may be seen spread that the planner does not plan.
STRATEGY_NAMES = {**PLANNED_STRATEGY_NAMES, "zero1": "ZeRO-1", "zero": "ZeRO", "single": "one process"}


class PlanFileError(ValueError):
    """A --plan file that is not a plan: the message says what to pass."""


# A saved plan as per-GPU figures: the plan document's own reading (vramscope.planner.document).
SavedPlan = PlannedGpus


@dataclass(frozen=True)
class RankCheck:
    """One rank's (or, for a split, one GPU's) measured peaks beside the plan's, and the plan's error."""

    kind: str  # "rank" or "gpu"
    index: int
    measured_peak_allocated_bytes: int | None
    planned_peak_allocated_bytes: int | None
    allocated_error: float | None  # (planned - measured) / measured
    measured_device_bytes: int | None
    planned_process_bytes: int | None
    device_error: float | None

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.index, "measured_peak_allocated_bytes": self.measured_peak_allocated_bytes,
                "planned_peak_allocated_bytes": self.planned_peak_allocated_bytes,
                "allocated_error": self.allocated_error, "measured_device_bytes": self.measured_device_bytes,
                "planned_process_bytes": self.planned_process_bytes, "device_error": self.device_error}


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
                   ranks=[r.to_json() for r in self.ranks], note=self.note)
        return out


def strategy_beside(log_path: str | os.PathLike[str]) -> RunStrategy | None:
    """The strategy the monitor recorded beside ``log_path`` (``mem.csv`` -> ``mem.strategy.json``), if any.
    The monitor's name rule (:func:`vramscope.output.names.sibling`)."""
    try:
        candidate = sibling(log_path, suffix=STRATEGY_SUFFIX)
        # Bounded like every input: a FIFO or device of that name is passed over, never read or waited on.
        data = json.loads(read_regular_file(candidate, "a strategy file", limit=SIDE_FILE_LIMIT).decode("utf-8"))
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
        data = json.loads(read_regular_file(path, "a plan from 'vramscope plan ... --json'",
                                            limit=SIDE_FILE_LIMIT).decode("utf-8"))
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


def _measured(result: AnalysisResult) -> list[tuple[str, int, int | None, int | None]]:
    """(kind, index, peak allocated, device memory) of each rank, or of each GPU for a log of one process."""
    if result.ranks is not None and result.ranks.ranks:
        return [("rank", r.rank, r.peaks.get("peak_allocated_bytes"), r.peaks.get("peak_device_used_bytes"))
                for r in result.ranks.ranks]
    out = []
    for dev in result.devices:
        if dev.key == "host" or dev.detail is None:
            continue
        peaks = dev.detail.peaks
        device = peaks.get("process_bytes") or peaks.get("device_used_bytes")
        allocated = peaks.get("peak_allocated_bytes")
        out.append(("gpu", int(dev.key), None if allocated is None else allocated.bytes,
                    None if device is None else device.bytes))
    return out


def check(result: AnalysisResult, plan: SavedPlan | None, strategy: RunStrategy | None) -> ParallelismCheck:
    """Each rank's (or, for a split, each GPU's) measured peak allocated and device memory beside the plan's."""
    if plan is None:
        return ParallelismCheck(strategy, None)
    rows = []
    for i, (kind, index, allocated, device) in enumerate(_measured(result)):
        p = plan.per_gpu[min(i, len(plan.per_gpu) - 1)] if plan.strategy == "split" else plan.per_gpu[0]
        rows.append(RankCheck(kind, index, allocated, p.peak_allocated_bytes,
                              _error(allocated, p.peak_allocated_bytes), device, p.process_bytes,
                              _error(device, p.process_bytes)))
    seen = None if strategy is None else strategy.strategy
    planned = plan.strategy
    notes = []
    if seen and planned and seen != planned and not (seen == "single" and planned == "single"):
        notes.append(f"the plan is for {STRATEGY_NAMES.get(planned, planned)}, the run was "
                     f"{STRATEGY_NAMES.get(seen, seen)}")
    world = None if strategy is None else strategy.world_size
    if world is not None and plan.world_size is not None and world != plan.world_size and planned != "split":
        notes.append(f"the plan is for {plan.world_size} GPUs, the run had {world} ranks")
    return ParallelismCheck(strategy, plan, tuple(rows), "; ".join(notes) or None)


__all__ = ["ParallelismCheck", "PlanFileError", "PlannedGpu", "SavedPlan", "check", "read_plan", "strategy_beside"]
