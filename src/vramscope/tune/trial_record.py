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

# Rank k > 0 writes <stem>.rank<k><suffix>, the name a rank's log has (training.ranks.rank_path): the writer's name
# and the reader's pattern are both made from output.names.RANK_TAG.
from vramscope.output.names import RANK_TAG, sibling


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
class TrialEval:
    """The evaluation pass's entry in a record, as :meth:`vramscope.tune.trial_eval.EvalPass.run` fills it.

    What the pass ran at, once read from the Trainer (its batch, the logits it keeps, its accumulation, its eval
    set), how many batches (the real evaluation's, those it holds at its peak, those run), how it ended
    (``status``: ``done``; ``oom``; ``failed``, with ``error``; ``no_eval_dataset``), the eval batches' shapes and,
    with CUDA, its peaks (extrapolated to ``steps_held`` where the pass ran fewer: ``extrapolated_steps``).
    A field is None where the pass never got to it; ``inputs`` and ``step_peaks`` too (an empty tuple is a pass
    that got there and saw none)."""

    batch_size: int | None = None  # the eval batch the pass ran at: the request's
    logits: str | None = None  # what the evaluation keeps per batch (trial_eval.logits_mode's word)
    eval_accumulation_steps: int | None = None
    eval_set: str | None = None  # its name, where the Trainer holds several
    eval_examples: int | None = None  # None also for an iterable eval set, which has no length
    steps_total: int | None = None  # the real evaluation's batches on this rank (None: an iterable eval set)
    steps_held: int | None = None
    steps_run: int | None = None
    status: str | None = None
    error: str | None = None  # a failed pass's first line
    inputs: tuple[tuple[int, ...], ...] | None = None  # (rows, tokens) of each eval batch
    step_peaks: tuple[int, ...] | None = None  # each eval batch's allocated peak (CUDA)
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    measured_peak_allocated_bytes: int | None = None  # the largest of step_peaks, before the extrapolation
    extrapolated_steps: int | None = None

    def __post_init__(self) -> None:
        for name in _EVAL_COUNTS:
            value = getattr(self, name)
            assert value is None or value >= 0, f"{name} is never negative: {value}"
        assert all(d >= 0 for shape in self.inputs or () for d in shape), f"a shape is never negative: {self.inputs}"
        assert all(p >= 0 for p in self.step_peaks or ()), f"a peak is never negative: {self.step_peaks}"

    def to_json(self) -> dict[str, Any]:
        """The entry's JSON, in the order the pass learns its fields; what it never learnt is not written.

        Two fields are written even when None, once the pass got to them: ``eval_accumulation_steps`` with the
        settings (``logits`` known), ``steps_total`` with the batches (``steps_run`` known; None: an iterable set).
        """
        out: dict[str, Any] = {}
        for name in _EVAL_ORDER:
            value = getattr(self, name)
            if name == "inputs" and self.inputs is not None:
                out[name] = [list(shape) for shape in self.inputs]
            elif name == "step_peaks" and self.step_peaks is not None:
                out[name] = list(self.step_peaks)
            elif value is not None or (name == "eval_accumulation_steps" and self.logits is not None) or \
                    (name == "steps_total" and self.steps_run is not None):
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: object) -> TrialEval | None:
        """The entry in a record's JSON; None where it is not a JSON object. A field of another type (or a negative
        count) reads as unknown, a shape or peak among them that is not a count is left out."""
        if not isinstance(data, dict):
            return None
        shapes, peaks = data.get("inputs"), data.get("step_peaks")
        return cls(
            logits=_text(data.get("logits")),
            eval_set=_text(data.get("eval_set")),
            status=_text(data.get("status")),
            error=_text(data.get("error")),
            inputs=tuple(s for s in map(_shape, shapes) if s is not None) if isinstance(shapes, list) else None,
            step_peaks=tuple(p for p in map(_count, peaks) if p is not None) if isinstance(peaks, list) else None,
            **{k: _count(data.get(k)) for k in _EVAL_COUNTS},
        )


# TrialEval's keys in the order the pass writes them; the counts among them are never negative.
_EVAL_ORDER = ("batch_size", "logits", "eval_accumulation_steps", "eval_set", "eval_examples", "steps_total",
               "steps_held", "steps_run", "status", "error", "inputs", "step_peaks", "peak_allocated_bytes",
               "peak_reserved_bytes", "measured_peak_allocated_bytes", "extrapolated_steps")
_EVAL_COUNTS = ("batch_size", "eval_accumulation_steps", "eval_examples", "steps_total", "steps_held", "steps_run",
                "peak_allocated_bytes", "peak_reserved_bytes", "measured_peak_allocated_bytes", "extrapolated_steps")


@dataclass(frozen=True)
class TrialRecord:
    """What one rank of a trial child recorded: the format of its record file.

    ``status`` goes ``started`` -> ``training`` (-> ``evaluating``) -> ``done``, or ends ``oom`` (``phase`` says
    whether in ``train`` or ``eval``) or ``error`` (with ``error``). The CUDA fields (``device`` ...
    ``base_reserved_bytes``) are None where the child saw no CUDA device; the model's fields where the Trainer
    handed the callback no model. ``eval`` is the evaluation pass's entry (:class:`TrialEval`).
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
    eval: TrialEval | None = None
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
                    out["eval"] = self.eval.to_json()
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
            eval=TrialEval.from_json(data.get("eval")),
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
    return record if rank == 0 else sibling(record, tag=f"{RANK_TAG}{rank}")


def rank_record_paths(record: str) -> list[str]:
    """Where the ranks of a trial wrote: ``record`` (rank 0), then each ``<stem>.rank<k><suffix>`` found beside it.

    The record's name is escaped, so that a ``[`` in a folder or file name is not read as a pattern."""
    return [record, *sorted(glob.glob(sibling(glob.escape(record), tag=f"{RANK_TAG}*")))]


def read_record(path: str) -> TrialRecord | None:
    """The record at ``path``, or None where there is none to read (missing, unreadable, not one JSON object)."""
    try:
        return TrialRecord.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def read_records(record: str) -> list[TrialRecord]:
    """Rank 0's record and those of any other ranks beside it, skipping what cannot be read (see the module)."""
    return [r for r in map(read_record, rank_record_paths(record)) if r is not None]

