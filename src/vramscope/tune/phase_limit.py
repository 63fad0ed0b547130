"""Which phase of the run limits the tuner's answer: the training step or the evaluation.

A trial child records its training steps' peaks and, when the command evaluates, its evaluation pass's
(:mod:`vramscope.tune.trial_eval`). A trial's peak is the larger of the two; the phase that limits the answer is
the one that broke the next size up (the size that ran out of memory, or ate into the margin), or, when no larger
size ran, the one that set the chosen size's peak. Pure: records (:class:`~vramscope.tune.trial_record.TrialRecord`)
in, typed figures and words out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vramscope.commands import ParsedCommand
from vramscope.planner.run_types import PHASE_WORDS
from vramscope.tune.trial_record import TrialEval, TrialRecord

HF_EVAL_BATCH = 8  # TrainingArguments.per_device_eval_batch_size's default
_LOGITS_WORDS = {"kept": "logits kept", "preprocessed": "preprocessed logits kept", "none": "loss only",
                 "per_batch": "metrics per batch"}


def eval_batch_for(parsed: ParsedCommand, train_batch: int) -> int | None:
    """The eval batch a trial at ``train_batch`` evaluates at, or None when the command does not evaluate.

    The command's ``per_device_eval_batch_size`` when it says one; else the batch being tried where the program's
    eval batch follows its micro-batch (``ParsedCommand.eval_batch_follows_train``: axolotl's), else HF Trainer's
    default, 8.
    """
    if not parsed.eval.evaluates:
        return None
    if parsed.eval.per_device_eval_batch_size is not None:
        return parsed.eval.per_device_eval_batch_size
    return train_batch if parsed.eval_batch_follows_train else HF_EVAL_BATCH


def eval_follows_train(parsed: ParsedCommand) -> bool:
    """The eval batch is the batch being tried (so the search moves it too)."""
    return (parsed.eval.evaluates and parsed.eval.per_device_eval_batch_size is None
            and parsed.eval_batch_follows_train)


@dataclass(frozen=True)
class PhasePeaks:
    """One trial's peaks per phase, over its ranks (allocated and reserved bytes; None where not measured)."""

    train_allocated: int | None
    train_reserved: int | None
    eval_allocated: int | None = None
    eval_reserved: int | None = None
    eval: TrialEval | None = None  # rank 0's eval entry (batch, logits, batches run and held)
    oom_phase: str | None = None  # the phase that ran out of memory, for a trial that did

    @property
    def peak_allocated(self) -> int | None:
        return _larger(self.train_allocated, self.eval_allocated)

    @property
    def peak_reserved(self) -> int | None:
        return _larger(self.train_reserved, self.eval_reserved)

    @property
    def phase(self) -> str:
        """The phase that set this trial's peak (or that ran out of memory)."""
        if self.oom_phase is not None:
            return self.oom_phase
        # Allocated, not reserved: the evaluation runs in the reserve the training step left cached, so its reserve
        # peak is at least the step's even when it needs less; what each phase allocates is its own.
        train = self.train_allocated if self.train_allocated is not None else self.train_reserved
        other = self.eval_allocated if self.eval_allocated is not None else self.eval_reserved
        return "eval" if other is not None and (train is None or other > train) else "train"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"train": {"peak_allocated_bytes": self.train_allocated,
                                         "peak_reserved_bytes": self.train_reserved}}
        if self.eval is not None:
            out["eval"] = {"peak_allocated_bytes": self.eval_allocated, "peak_reserved_bytes": self.eval_reserved,
                           **{k: getattr(self.eval, k) for k in ("status", "batch_size", "logits", "steps_run",
                                                                 "steps_held", "extrapolated_steps", "error")
                              if getattr(self.eval, k) is not None}}
        return out


def _larger(a: int | None, b: int | None) -> int | None:
    return max(a, b) if a is not None and b is not None else (a if b is None else b)


def _most(values: Sequence[Any]) -> int | None:
    return max((int(v) for v in values if v is not None), default=None)


def phase_peaks(records: Sequence[TrialRecord]) -> PhasePeaks:
    """The per-phase peaks of a trial from its ranks' records (the worst rank and step of each phase)."""
    steps = [s for r in records for s in r.steps]
    evals = [r.eval for r in records if r.eval is not None]
    oom = next((r.phase or "train" for r in records if r.status == "oom"), None)
    return PhasePeaks(
        train_allocated=_most([s.peak_allocated_bytes for s in steps]),
        train_reserved=_most([s.peak_reserved_bytes for s in steps]),
        eval_allocated=_most([e.peak_allocated_bytes for e in evals]),
        eval_reserved=_most([e.peak_reserved_bytes for e in evals]),
        eval=evals[0] if evals else None,
        oom_phase=oom,
    )


def describe_eval(evaluation: TrialEval | None, follows: bool = False) -> str:
    """``per_device_eval_batch_size 8, logits kept`` (what the evaluation ran at); empty for an entry that says
    nothing (none, or an empty one)."""
    if evaluation is None or evaluation == TrialEval():
        return ""
    batch = evaluation.batch_size
    parts = [f"eval batch {batch}, the batch tried" if follows else f"per_device_eval_batch_size {batch}"]
    if evaluation.logits in _LOGITS_WORDS:
        parts.append(_LOGITS_WORDS[evaluation.logits])
    if evaluation.extrapolated_steps:
        parts.append(f"{evaluation.steps_run} of {evaluation.steps_held} held eval batches run, "
                     "the rest extrapolated")
    return ", ".join(parts)


@dataclass(frozen=True)
class Limit:
    """The phase that limits the answer, and the size where it does (None: no larger size was run)."""

    phase: str
    at_size: int | None  # None: the search reached its upper bound
    ran_out: bool  # at_size ran out of memory (else it ate into the margin, or was not run)
    eval: TrialEval | None
    measured: bool = True  # at_size was run; else it is the next size, which the trials' fitted line rules out

    def words(self, answer: int, unit: str = "batch", follows: bool = False) -> str:
        """``batch 6 fits; evaluation (per_device_eval_batch_size 8, logits kept) limits it at 7``."""
        name = PHASE_WORDS.get(self.phase, self.phase)
        described = describe_eval(self.eval, follows)
        if self.phase == "eval" and described:
            name += f" ({described})"
        if self.at_size is None:
            return f"{unit} {answer} fits; {name} sets its peak"
        how = ("out of memory" if self.ran_out else "into the margin") if self.measured else \
            "by the trials' fitted line; not run"
        return f"{unit} {answer} fits; {name} limits it at {self.at_size} ({how})"


def limiting(sized: Sequence[tuple[int, bool, int | None, PhasePeaks]], answer: int, usable: float,
             *, step: int = 1, capped: bool = False) -> Limit:
    """The limit of the search's answer from its trials as ``(size, ok, peak reserved, phases)``.

    The smallest size above the answer that failed or broke the margin names the phase; with none, the answer's
    own trial does, at the next size (``answer + step``) that the search's line ruled out (unless ``capped``:
    the search stopped at its upper bound, and the phase only sets the answer's peak).
    """
    above = sorted((t for t in sized if t[0] > answer and (not t[1] or (t[2] is not None and t[2] > usable))),
                   key=lambda t: t[0])
    if above:
        size, ok, _, peaks = above[0]
        return Limit(peaks.phase, size, not ok, peaks.eval)
    own = [t for t in sized if t[0] == answer and t[1]]
    peaks = own[-1][3] if own else PhasePeaks(None, None)
    return Limit(peaks.phase, None if capped else answer + step, False, peaks.eval, measured=False)


def eval_plan_check(parsed: ParsedCommand, batch: int, seq: int | None, capacity: int,
                    trial_eval: TrialEval | None, follows: bool = False) -> str:
    """The planner's evaluation phase at the answer, for a command whose trials could not run an evaluation.

    The logits kept (and the eval set's size) are the trial Trainer's when its record says them, else the command's
    reading (loss only: a pasted command cannot say whether its script passes ``compute_metrics``; one eval batch
    held). One sentence, for the answer's notes.
    """
    from dataclasses import replace

    from vramscope.commands.phases import run_phases
    from vramscope.planner import PlanInputError, plan

    run = run_phases(parsed)
    if run.eval_batch is None:
        return ""
    if follows:
        run = replace(run, eval_batch=batch)
    trial_logits = trial_eval.logits if trial_eval is not None else None
    if trial_logits in ("kept", "preprocessed"):
        run = replace(run, eval_logits="kept" if trial_logits == "kept" else "argmax")
    examples = trial_eval.eval_examples if trial_eval is not None else None
    if examples:
        run = replace(run, eval_examples=examples)
    model: Any = parsed.model_config if parsed.model_config is not None else parsed.model
    if model is None or seq is None:
        return "the planner cannot check the evaluation either (the command names no model or no length)"
    try:
        planned = plan(model, batch, seq, parsed.spec, gpu_memory=capacity, read_from_command=True, run=run)
    except (PlanInputError, KeyError, ValueError) as exc:
        return f"the planner cannot check the evaluation either ({exc})"
    phases = planned.run.phases if planned.run is not None else {}
    evaluation = phases.get("eval")
    if evaluation is None:
        return ""
    verdict = "fits" if evaluation.peak_reserved_bytes <= capacity else "does not fit"
    return (f"checked against the planner's eval plan instead: evaluation at per_device_eval_batch_size "
            f"{run.eval_batch} ({_LOGITS_WORDS.get(run.eval_logits, run.eval_logits)}) is planned at "
            f"{evaluation.peak_reserved_bytes / 2**30:.2f} GiB reserved of {capacity / 2**30:.2f} GiB: it {verdict}")
