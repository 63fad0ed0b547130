"""The trial child's request and record: one owner for the JSON that ``tune -- CMD`` and its children exchange.

The tuner hands each trial child a :class:`TrialRequest` (JSON in ``$VRAMSCOPE_TRIAL``); the child
(:mod:`vramscope.tune.command_trial`) writes a :class:`TrialRecord` per rank, rewritten whole at each change, to
the request's ``record`` (rank 0) and ``<stem>.rank<k><suffix>`` beside it (:func:`record_path`); the tuner reads
them back with :func:`read_records`.

A torn record reads as no record: a file that is missing, unreadable or not one JSON object (a child killed
before its first write) is skipped, and a record cut short (killed mid-trial) reads with what it holds, every
field it lacks (or holds in another type) unknown: ``None``, its steps so far.

Imported inside the user's training process (by the trial child): the standard library and
:mod:`vramscope.output.names` only.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vramscope.output.names import sibling

# Rank k > 0 writes <stem>.rank<k><suffix>, the name a rank's log has (training.ranks.rank_path): the writer's name
# and the reader's pattern are both made from it.
RANKS_TAG = "rank"


@dataclass(frozen=True)
class TrialRequest:
    """What one trial child must do; travels as JSON in ``$VRAMSCOPE_TRIAL``."""

    batch_size: int
    seq_len: int | None  # None: keep the data's own lengths
    max_steps: int
    record: str  # absolute path of the JSON record to write
    memory_limit_bytes: int | None = None  # cap the allocator as on a smaller GPU
    eval_batch_size: int | None = None  # run an evaluation pass at this eval batch after the last step; None: none

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRequest:
        """Raises: KeyError, TypeError, ValueError: not a request (a field missing or of another kind)."""
        return cls(
            batch_size=int(data["batch_size"]),
            seq_len=None if data.get("seq_len") is None else int(data["seq_len"]),
            max_steps=int(data["max_steps"]),
            record=str(data["record"]),
            memory_limit_bytes=None if data.get("memory_limit_bytes") is None else int(data["memory_limit_bytes"]),
            eval_batch_size=None if data.get("eval_batch_size") is None else int(data["eval_batch_size"]),
        )

    def to_env(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_env(cls, text: str) -> TrialRequest:
        return cls.from_json(json.loads(text))


@dataclass(frozen=True)
class TrialStep:
    """One optimizer step of a trial: what the model received and the peaks since the step before.

    The memory fields are None where they were not read: no CUDA (then only ``rss_bytes``), or NVML not listing
    the process (``process_gpu_bytes``)."""

    step: int | None  # the Trainer's global step
    inputs: tuple[tuple[int, ...], ...] = ()  # (rows, tokens) of each forward pass in the step
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    allocated_bytes: int | None = None  # at the step's end
    reserved_bytes: int | None = None
    device_used_bytes: int | None = None  # the whole GPU's use: this process with its CUDA context
    process_gpu_bytes: int | None = None  # NVML's figure for this process (nvidia-smi's)
    rss_bytes: int | None = None  # host memory: what CPU offload keeps there

    def __post_init__(self) -> None:
        assert self.step is None or self.step >= 0, f"a step number is never negative: {self.step}"
        assert all(d >= 0 for shape in self.inputs for d in shape), f"a shape is never negative: {self.inputs}"
        for name in _STEP_BYTES:
            value = getattr(self, name)
            assert value is None or value >= 0, f"{name} is never negative: {value}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "inputs": [list(shape) for shape in self.inputs]}
        out.update((name, getattr(self, name)) for name in _STEP_BYTES if getattr(self, name) is not None)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialStep:
        """A step of a record's JSON; a field of another type (or a negative count) reads as unknown."""
        shapes = data.get("inputs")
        inputs = tuple(s for s in map(_shape, shapes) if s is not None) if isinstance(shapes, list) else ()
        return cls(step=_count(data.get("step")), inputs=inputs, **{k: _count(data.get(k)) for k in _STEP_BYTES})


_STEP_BYTES = ("peak_allocated_bytes", "peak_reserved_bytes", "allocated_bytes", "reserved_bytes",
               "device_used_bytes", "process_gpu_bytes", "rss_bytes")  # TrialStep's memory fields, in file order


@dataclass(frozen=True)
class TrialRecord:
    """What one rank of a trial child recorded: the format of its record file.

    ``status`` goes ``started`` -> ``training`` (-> ``evaluating``) -> ``done``, or ends ``oom`` (``phase`` says
    whether in ``train`` or ``eval``) or ``error`` (with ``error``). The CUDA fields (``device`` ...
    ``base_reserved_bytes``) are None where the child saw no CUDA device; the model's fields where the Trainer
    handed the callback no model. ``eval`` is the evaluation pass's entry, as
    :meth:`vramscope.tune.trial_eval.EvalPass.run` returns it (its batch, logits mode, batches run and held, peaks).
    """

    status: str | None = None  # None: a record without one (torn, or not the child's)
    request: TrialRequest | None = None
    rank: int | None = None
    pid: int | None = None
    steps: tuple[TrialStep, ...] = ()
    cuda: bool | None = None  # torch saw a CUDA device (set when training began)
    model_class: str | None = None
    parameters: int | None = None  # the model's parameters (FSDP2: their whole size)
    parameters_held: int | None = None  # of which this rank holds (FSDP2's local shards)
    device: int | None = None
    device_name: str | None = None
    total_bytes: int | None = None  # the device's memory
    capacity_bytes: int | None = None  # what the allocator could hold when training began (capped by the request)
    base_allocated_bytes: int | None = None  # before the first step: the loaded model
    base_reserved_bytes: int | None = None
    phase: str | None = None  # "eval" while (and where) the evaluation pass runs; "train" or "eval" on an OOM
    eval: Mapping[str, Any] | None = None
    error: str | None = None  # the first line of the error that ended the trial

    def __post_init__(self) -> None:
        for name in _RECORD_COUNTS:
            value = getattr(self, name)
            assert value is None or value >= 0, f"{name} is never negative: {value}"

    def to_json(self) -> dict[str, Any]:
        """The record file's JSON: the fields that are known (a field the child never set is not written)."""
        out: dict[str, Any] = {}
        for name in _RECORD_ORDER:
            value = getattr(self, name)
            if name == "steps":
                out["steps"] = [s.to_json() for s in self.steps]
            elif name == "request":
                if self.request is not None:
                    out["request"] = self.request.to_json()
            elif name == "eval":
                if self.eval is not None:
                    out["eval"] = dict(self.eval)
            elif value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: object) -> TrialRecord:
        """The record in a record file's JSON; a field of another type (or a negative count) reads as unknown.

        Raises:
            ValueError: not a record (not one JSON object).
        """
        if not isinstance(data, dict):
            raise ValueError("not a trial record: not a JSON object")
        request = data.get("request")
        try:
            parsed = TrialRequest.from_json(request) if isinstance(request, dict) else None
        except (KeyError, TypeError, ValueError):
            parsed = None
        steps = data.get("steps")
        evaluation = data.get("eval")
        cuda = data.get("cuda")
        return cls(
            status=_text(data.get("status")),
            request=parsed,
            steps=tuple(TrialStep.from_json(s) for s in steps if isinstance(s, dict)) if isinstance(steps, list)
            else (),
            cuda=cuda if isinstance(cuda, bool) else None,
            model_class=_text(data.get("model_class")),
            device_name=_text(data.get("device_name")),
            **{k: _count(data.get(k)) for k in _RECORD_COUNTS},
            phase=_text(data.get("phase")),
            eval=evaluation if isinstance(evaluation, dict) else None,
            error=_text(data.get("error")),
        )


# The file's keys in the order the child first writes them; the counts among them are never negative.
_RECORD_ORDER = ("status", "request", "rank", "pid", "steps", "cuda", "model_class", "parameters", "parameters_held",
                 "device", "device_name", "total_bytes", "capacity_bytes", "base_allocated_bytes",
                 "base_reserved_bytes", "phase", "eval", "error")
_RECORD_COUNTS = ("rank", "pid", "parameters", "parameters_held", "device", "total_bytes", "capacity_bytes",
                  "base_allocated_bytes", "base_reserved_bytes")


def _count(value: object) -> int | None:
    """A JSON integer that counts something (bytes, steps, ranks); anything else (a bool, a float, < 0) is unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _shape(value: object) -> tuple[int, ...] | None:
    """A forward pass's (rows, tokens); None where it is not a list of counts."""
    if not isinstance(value, list):
        return None
    dims = [_count(d) for d in value]
    return tuple(d for d in dims if d is not None) if all(d is not None for d in dims) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def record_path(record: str, rank: int) -> str:
    """Rank 0 writes ``record``; rank k > 0 writes ``<stem>.rank<k><suffix>`` beside it, as a rank's log."""
    return record if rank == 0 else sibling(record, tag=f"{RANKS_TAG}{rank}")


def rank_record_paths(record: str) -> list[str]:
    """Where the ranks of a trial wrote: ``record`` (rank 0), then each ``<stem>.rank<k><suffix>`` found beside it.

    The record's name is escaped, so that a ``[`` in a folder or file name is not read as a pattern."""
    return [record, *sorted(glob.glob(sibling(glob.escape(record), tag=f"{RANKS_TAG}*")))]


def read_record(path: str) -> TrialRecord | None:
    """The record at ``path``, or None where there is none to read (missing, unreadable, not one JSON object)."""
    try:
        return TrialRecord.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def read_records(record: str) -> list[TrialRecord]:
    """Rank 0's record and those of any other ranks beside it, skipping what cannot be read (see the module)."""
    return [r for r in map(read_record, rank_record_paths(record)) if r is not None]

