"""The ``vramscope plan --json`` document: written here, and read back here (``vramscope report --plan``).

One JSON object, in this order:

* ``schema_version`` (:data:`PLAN_SCHEMA_VERSION`);
* the one-GPU plan, as the planner writes it: :meth:`Plan.to_dict <vramscope.planner.api.Plan.to_dict>`, or for
  ``--trace`` :meth:`TracePlan.to_dict <vramscope.planner.trace.engine.TracePlan.to_dict>` (``"engine": "trace"``);
* with ``--gpus N``: ``gpus`` (``table``, every strategy: :meth:`FitTable.to_dict
  <vramscope.planner.multigpu.FitTable.to_dict>`; with ``--strategy`` also ``plan``, each GPU:
  :meth:`DistributedEstimate.to_dict <vramscope.planner.distributed.DistributedEstimate.to_dict>`) and ``per_gpu``.
  With ``--strategy`` the top-level figures become those of the largest GPU (what the terminal prints) and the
  one-GPU plan's own are kept under ``one_gpu`` (:class:`LargestGpu`);
* from a pasted command: ``command`` (its reading), ``assumed``, ``unsupported``, ``alternatives``
  (:class:`CommandSection`);
* with ``--dataset``: ``dataset`` (the lengths found, or why they could not be read).

The planner's results keep writing their own parts; this module composes them (:func:`plan_document`), and
:meth:`PlanDocument.from_json` takes a saved document apart again, leniently, for a reader that wants only the
per-GPU figures (:meth:`PlanDocument.planned`) from a file a person may have written by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the builders read these results' attributes; the reader needs none of them
    from vramscope.planner.api import Plan
    from vramscope.planner.distributed import DistributedEstimate
    from vramscope.planner.multigpu import FitTable
    from vramscope.planner.trace.engine import TracePlan

JsonObject = dict[str, Any]

# Bumped when a field changes meaning or goes away (report, watch and run carry theirs; tune --json its own).
PLAN_SCHEMA_VERSION = 1

# The one-GPU plan's keys that describe one GPU's peak and verdict: with --strategy they are replaced by the
# largest GPU's figures (the ones the terminal prints) and kept whole under "one_gpu".
PER_GPU_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "process_bytes", "peak_phase", "breakdown", "fits",
                "max_batch_size", "cannot_fit_reason", "recommendations")
_COMMAND_KEYS = ("command", "assumed", "unsupported", "alternatives")
# The keys this document adds around the one-GPU plan; every other top-level key is the plan's own.
_DOCUMENT_KEYS = frozenset({"schema_version", "gpus", "one_gpu", "per_gpu", "world_size", "strategy", "offload",
                            "device_bytes", "host_bytes", "host_bytes_machine", "load_device_bytes",
                            "loading_sets_peak", "dataset", *_COMMAND_KEYS})


class PlanDocumentError(ValueError):
    """JSON that is not a plan document at all (not an object)."""


def _whole(value: object) -> int | None:
    """``value`` when it is a whole number (JSON's true and false are not)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _object(value: object) -> JsonObject | None:
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class PlannedPeak:
    """One of the whole run's figures and the plan's phase that sets it (``train``, ``load``, ``eval``, ...)."""

    bytes: int
    phase: str


def _largest(figures: dict[str, int | None]) -> PlannedPeak | None:
    """The largest known figure and its phase; the step (the first key) keeps a tie."""
    known = [(name, value) for name, value in figures.items() if value is not None]
    if not known:
        return None
    name, value = max(known, key=lambda item: item[1])  # max keeps the first of equals
    return PlannedPeak(value, name)


@dataclass(frozen=True)
class PlannedGpu:
    """What the plan predicts for one GPU (None where the file does not say it as a whole number).

    ``peak_allocated_bytes`` and ``process_bytes`` are the training step's; ``run_allocated`` and ``run_process``
    the whole run's (loading, evaluation, ... as the document plans them) and the phase that sets each, None in a
    file that gives the step's alone (one written before the planner planned the run, a traced plan);
    ``run_phases`` the phases the whole-run figures cover.
    """

    peak_allocated_bytes: int | None
    process_bytes: int | None
    run_allocated: PlannedPeak | None = None
    run_process: PlannedPeak | None = None
    run_phases: tuple[str, ...] = ()

    @property
    def whole_run(self) -> bool:
        """Whether the file plans the whole run (else its step's figures stand for it)."""
        return self.run_allocated is not None or self.run_process is not None

    @property
    def run_allocated_bytes(self) -> int | None:
        """The whole run's peak allocated, the step's where the file has no whole-run figure."""
        return self.peak_allocated_bytes if self.run_allocated is None else self.run_allocated.bytes

    @property
    def run_process_bytes(self) -> int | None:
        return self.process_bytes if self.run_process is None else self.run_process.bytes

    @classmethod
    def from_json(cls, entry: object) -> PlannedGpu:
        """One GPU of ``gpus.plan.per_gpu`` (:meth:`RankEstimate.to_dict
        <vramscope.planner.distributed.RankEstimate.to_dict>`): its step, and its loading where the file has it.

        The loading's ``load_device_bytes`` is allocated with the CUDA context beside it (reserved as allocated,
        nothing paged: :mod:`vramscope.planner.parallel_loading`), so it stands for the loading's process figure,
        and less the breakdown's ``cuda_context`` for its allocated one."""
        if not isinstance(entry, dict):
            return cls(None, None)
        allocated, process = _whole(entry.get("peak_allocated_bytes")), _whole(entry.get("process_bytes"))
        load = _whole(entry.get("load_device_bytes"))
        if load is None or not load:  # a file from before loading was planned per GPU (or it wrote 0)
            return cls(allocated, process)
        context = _whole((_object(entry.get("breakdown")) or {}).get("cuda_context"))
        load_allocated = None if context is None or allocated is None else load - context
        return cls(allocated, process,
                   _largest({"train": allocated, "load": load_allocated}) if load_allocated is not None else None,
                   None if process is None else _largest({"train": process, "load": load}), ("load", "train"))

    @classmethod
    def of_one_gpu(cls, plan: JsonObject) -> PlannedGpu:
        """The one-GPU plan (:meth:`Plan.to_dict <vramscope.planner.api.Plan.to_dict>`): its step is the ``train``
        phase and its whole run every phase of ``phases``; a file without them (or a traced plan, whose
        ``phases`` are the step's moments) gives its top-level figures, the step's, alone."""
        top_allocated, top_process = _whole(plan.get("peak_allocated_bytes")), _whole(plan.get("process_bytes"))
        phases = {name: entry for name, entry in (_object(plan.get("phases")) or {}).items()
                  if isinstance(entry, dict)}
        if "train" not in phases:
            return cls(top_allocated, top_process)
        ordered = {"train": phases["train"], **phases}  # the step first: it keeps a tie
        run_allocated = _largest({k: _whole(v.get("peak_allocated_bytes")) for k, v in ordered.items()})
        run_process = _largest({k: _whole(v.get("process_bytes")) for k, v in ordered.items()})
        return cls(_whole(phases["train"].get("peak_allocated_bytes")), _whole(phases["train"].get("process_bytes")),
                   run_allocated, run_process, tuple(phases))


@dataclass(frozen=True)
class PlannedGpus:
    """A saved plan as a per-GPU plan: one GPU (``"single"``) for a plan without ``--gpus --strategy``."""

    strategy: str | None  # "ddp", "fsdp", "split", "single", ...
    world_size: int | None
    per_gpu: tuple[PlannedGpu, ...]


@dataclass(frozen=True)
class LargestGpu:
    """With ``--strategy``: the largest GPU's figures, which stand at the top level in place of the one-GPU plan's.

    ``fits`` is against the table's capacity (None without one); ``max_batch_size`` is the table's for this
    strategy and offload (None where the table has no such row).
    """

    world_size: int
    strategy: str
    offload: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    device_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    host_bytes: int  # this GPU's rank
    host_bytes_machine: int  # every rank of the machine
    fits: bool | None
    max_batch_size: int | None
    load_device_bytes: int = 0  # what this GPU holds while the model loads (0 in a file from before it was planned)

    @property
    def loading_sets_peak(self) -> bool:
        return self.load_device_bytes > self.device_bytes

    @classmethod
    def of(cls, dist: DistributedEstimate, table: FitTable) -> LargestGpu:
        w, par = dist.worst, dist.parallelism
        row = next((r for r in table.rows if r.strategy == par.strategy and r.offload == par.offload), None)
        capacity = table.capacity_bytes
        # the GPU must hold its loading as well as its step: the verdict is on the larger (the terminal's)
        return cls(par.world_size, par.strategy, par.offload, w.peak_allocated_bytes, w.peak_reserved_bytes,
                   w.process_bytes, w.device_bytes, w.peak_phase, dict(w.parts), w.host_bytes, dist.host_bytes,
                   None if capacity is None else w.peak_device_bytes <= capacity,
                   None if row is None else row.max_batch, w.load_device_bytes)

    def to_json(self) -> JsonObject:
        """The top-level keys, in the order they have always been written (``update`` keeps a present key's place)."""
        return {"world_size": self.world_size, "strategy": self.strategy, "offload": self.offload,
                "peak_allocated_bytes": self.peak_allocated_bytes, "peak_reserved_bytes": self.peak_reserved_bytes,
                "process_bytes": self.process_bytes, "device_bytes": self.device_bytes,
                "peak_phase": self.peak_phase, "breakdown": dict(self.breakdown), "host_bytes": self.host_bytes,
                "host_bytes_machine": self.host_bytes_machine, "fits": self.fits,
                "max_batch_size": self.max_batch_size,
                # the per-GPU plan gives no reason and no changes of its own: the one-GPU plan's are under one_gpu
                "cannot_fit_reason": None, "recommendations": [],
                "load_device_bytes": self.load_device_bytes, "loading_sets_peak": self.loading_sets_peak}

    @classmethod
    def from_json(cls, data: JsonObject) -> LargestGpu | None:
        """From a document's top level; None where a figure is missing or of the wrong kind."""
        counts = [_whole(data.get(k)) for k in ("world_size", "peak_allocated_bytes", "peak_reserved_bytes",
                                                 "process_bytes", "device_bytes", "host_bytes", "host_bytes_machine")]
        words = [data.get(k) for k in ("strategy", "offload", "peak_phase")]
        breakdown, fits, max_batch = data.get("breakdown"), data.get("fits"), data.get("max_batch_size")
        if (any(c is None for c in counts) or not all(isinstance(w, str) for w in words)
                or not isinstance(breakdown, dict) or not (fits is None or isinstance(fits, bool))
                or not (max_batch is None or _whole(max_batch) is not None)):
            return None
        world, allocated, reserved, process, device, host, machine = (int(c) for c in counts if c is not None)
        strategy, offload, phase = (str(w) for w in words)
        return cls(world, strategy, offload, allocated, reserved, process, device, phase, dict(breakdown), host,
                   machine, fits, max_batch, _whole(data.get("load_device_bytes")) or 0)


@dataclass(frozen=True)
class GpusSection:
    """``--gpus N``: the table of every strategy and, with ``--strategy``, its per-GPU estimate."""

    table: JsonObject | None  # FitTable.to_dict() (None only in a file written by hand)
    estimate: JsonObject | None = None  # DistributedEstimate.to_dict(): "gpus.plan"
    largest: LargestGpu | None = None  # with --strategy: the figures the top level carries

    @classmethod
    def of(cls, dist: DistributedEstimate | None, table: FitTable) -> GpusSection:
        if dist is None:
            return cls(table.to_dict())
        return cls(table.to_dict(), dist.to_dict(), LargestGpu.of(dist, table))

    def to_json(self) -> JsonObject:
        out: JsonObject = {}
        if self.table is not None:
            out["table"] = self.table
        if self.estimate is not None:
            out["plan"] = self.estimate
        return out


@dataclass(frozen=True)
class Alternative:
    """Another reading of a pasted command and what it would need on one GPU (``alternatives``)."""

    label: str
    world_size: int | None
    device_bytes: int | None
    fits: bool | None

    def to_json(self) -> JsonObject:
        return {"label": self.label, "world_size": self.world_size, "device_bytes": self.device_bytes,
                "fits": self.fits}

    @classmethod
    def from_json(cls, entry: object) -> Alternative:
        data = _object(entry) or {}
        fits = data.get("fits")
        return cls(str(data.get("label", "")), _whole(data.get("world_size")), _whole(data.get("device_bytes")),
                   fits if isinstance(fits, bool) else None)


@dataclass(frozen=True)
class CommandSection:
    """The plan of a pasted training command: its reading (the command reader's own JSON), what was assumed,
    what vramscope cannot plan, and the other readings worth a look."""

    reading: JsonObject
    assumed: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()

    def to_json(self) -> JsonObject:
        return {"command": self.reading, "assumed": list(self.assumed), "unsupported": list(self.unsupported),
                "alternatives": [a.to_json() for a in self.alternatives]}

    @classmethod
    def from_json(cls, data: JsonObject) -> CommandSection | None:
        reading = _object(data.get("command"))
        if reading is None:
            return None

        def texts(key: str) -> tuple[str, ...]:
            value = data.get(key)
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        alternatives = data.get("alternatives")
        return cls(reading, texts("assumed"), texts("unsupported"),
                   tuple(Alternative.from_json(a) for a in alternatives) if isinstance(alternatives, list) else ())


def dataset_failure(source: str, error: str | None, batch_size: int, seq_len: int) -> JsonObject:
    """``dataset`` when the data could not be read: where from, why, and the shape planned instead."""
    return {"source": source, "error": error, "planned_at": f"{batch_size} x {seq_len}"}


@dataclass(frozen=True)
class PlanDocument:
    """One ``vramscope plan --json`` output (see the module's docstring for its layout)."""

    plan: JsonObject  # the one-GPU plan: Plan.to_dict() or TracePlan.to_dict()
    gpus: GpusSection | None = None
    command: CommandSection | None = None
    dataset: JsonObject | None = None  # DatasetLengths.to_json(), or dataset_failure(...)
    schema_version: int = PLAN_SCHEMA_VERSION

    @property
    def engine(self) -> str:
        """``trace`` for ``plan --trace``, else ``analytic``."""
        return "trace" if self.plan.get("engine") == "trace" else "analytic"

    def to_json(self) -> JsonObject:
        out: JsonObject = {"schema_version": self.schema_version, **self.plan}
        if self.gpus is not None:
            out["gpus"] = self.gpus.to_json()
            largest = self.gpus.largest
            if largest is None:
                out["per_gpu"] = False
            else:
                out["one_gpu"] = {key: self.plan.get(key) for key in PER_GPU_KEYS}
                out.update(per_gpu=True, **largest.to_json())
        if self.command is not None:
            out.update(self.command.to_json())
        if self.dataset is not None:
            out["dataset"] = self.dataset
        return out

    def dumps(self) -> str:
        """The document as ``plan --json`` prints it."""
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def from_json(cls, data: object) -> PlanDocument:
        """A saved document, taken apart; what a hand-written file lacks is left empty, not refused.

        Raises:
            PlanDocumentError: ``data`` is not a JSON object.
        """
        if not isinstance(data, dict):
            raise PlanDocumentError("not a JSON object")
        gpus_data = _object(data.get("gpus"))
        largest = LargestGpu.from_json(data) if gpus_data is not None and data.get("per_gpu") is True else None
        gpus = None if gpus_data is None else GpusSection(_object(gpus_data.get("table")),
                                                          _object(gpus_data.get("plan")), largest)
        keys = list(data)
        if largest is not None:
            # The largest GPU's figures stand in the plan's places, and the ones the plan lacked come after
            # "gpus": the plan is what precedes it, with its own figures back from one_gpu.
            one_gpu = _object(data.get("one_gpu")) or {}
            plan = {k: one_gpu[k] if k in PER_GPU_KEYS and k in one_gpu else data[k]
                    for k in keys[:keys.index("gpus")] if k not in _DOCUMENT_KEYS}
        else:
            plan = {k: v for k, v in data.items() if k not in _DOCUMENT_KEYS}
        version = _whole(data.get("schema_version"))
        return cls(plan, gpus, CommandSection.from_json(data), _object(data.get("dataset")),
                   PLAN_SCHEMA_VERSION if version is None else version)

    def planned(self) -> PlannedGpus | None:
        """The per-GPU figures a run is held against: each GPU under the plan's strategy, or the one GPU of a plan
        without one; None when the document holds neither."""
        estimate = None if self.gpus is None else self.gpus.estimate
        per_gpu = None if estimate is None else estimate.get("per_gpu")
        if estimate is not None and isinstance(per_gpu, list) and per_gpu:
            strategy = estimate.get("strategy")
            return PlannedGpus(strategy if isinstance(strategy, str) else None, _whole(estimate.get("world_size")),
                               tuple(PlannedGpu.from_json(g) for g in per_gpu))
        top = self.to_json()  # the figures the top level carries (the largest GPU's, with --strategy)
        if isinstance(top.get("peak_allocated_bytes"), int) and isinstance(top.get("process_bytes"), int):
            if self.gpus is not None and self.gpus.largest is not None:  # a hand-written file: no GPU's phases
                return PlannedGpus("single", 1, (PlannedGpu.from_json(top),))
            return PlannedGpus("single", 1, (PlannedGpu.of_one_gpu(top),))
        return None


def plan_document(plan: Plan | TracePlan, *, distributed: DistributedEstimate | None = None,
                  table: FitTable | None = None, command: CommandSection | None = None,
                  dataset: JsonObject | None = None) -> PlanDocument:
    """The document of the planner's results: the one-GPU plan, and with ``table`` (``--gpus``) the strategies
    (and with ``distributed``, ``--strategy``, each GPU)."""
    gpus = None if table is None else GpusSection.of(distributed, table)
    return PlanDocument(plan.to_dict(), gpus, command, dataset)


__all__ = ["PER_GPU_KEYS", "PLAN_SCHEMA_VERSION", "Alternative", "CommandSection", "GpusSection", "LargestGpu",
           "PlanDocument", "PlanDocumentError", "PlannedGpu", "PlannedGpus", "PlannedPeak", "dataset_failure",
           "plan_document"]
