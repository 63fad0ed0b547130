"""``vramscope tune -- <command>``: the largest per-device batch (or longest sequence) for the user's own command.

Each trial is the user's command itself, started as a child process with
:data:`~vramscope.tune.command_trial.ENV_TRIAL` set: the start-up hook makes its HF ``Trainer`` run a
couple of steps at the trial's batch and length, record the per-step peaks and exit (see
:mod:`vramscope.tune.command_trial`). An out-of-memory error ends that child only. The search is
:func:`vramscope.tune.search.search`, the same as ``vramscope tune --model-dir``: its trials here are
processes, each starting from the same loaded model, so nothing carries over between them (a trial's
``after`` equals its ``base``), and the capacity is what the first child's allocator could hold.

Imports no torch: the parent never touches the GPU, so the children get all of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vramscope.commands import ParsedCommand
from vramscope.planner.batching import split_batch
from vramscope.run.inject import ENV_PACKAGE_PARENT, ENV_TRAINER_HOOKS, PACKAGE_PARENT, SITE_DIR
from vramscope.tune.command_trial import ENV_TRIAL, OOM_EXIT_CODE
from vramscope.tune.groups import Stopped, end_group, held, stop_on_signals
from vramscope.tune.phase_limit import (
    Limit,
    PhasePeaks,
    eval_batch_for,
    eval_follows_train,
    eval_plan_check,
    limiting,
    phase_peaks,
)
from vramscope.tune.search import NoSizeFitsError, Trial, TuneResult, search
from vramscope.tune.trial_record import TrialRecord, TrialRequest, read_records

DEFAULT_TRIAL_STEPS = 2  # the first step creates the optimizer state; the second runs with it in place
DEFAULT_TRIAL_TIMEOUT_S = 900.0
_TAIL_LINES = 40


class TrialFailed(RuntimeError):
    """A trial child failed for a reason other than memory, or never started a Trainer; the message says which."""


@dataclass(frozen=True)
class CommandTrial:
    """One child's outcome: the tuner's :class:`~vramscope.tune.search.Trial` plus what the child recorded."""

    trial: Trial
    capacity_bytes: int | None
    record: TrialRecord  # rank 0's
    log_path: str
    phases: PhasePeaks = field(default_factory=lambda: PhasePeaks(None, None))  # train and eval peaks


def child_environment(request: TrialRequest, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a trial child: the user's, plus the start-up hook and the trial request."""
    env = dict(os.environ if environ is None else environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *paths])
    env[ENV_PACKAGE_PARENT] = PACKAGE_PARENT
    env[ENV_TRIAL] = request.to_env()
    env[ENV_TRAINER_HOOKS] = "vramscope.tune.command_trial:install"  # the start-up hook runs the trial
    env.pop("VRAMSCOPE_INJECT", None)  # a trial measures the step alone, without the monitor's callback
    return env


def _tail(path: str) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_TAIL_LINES:])


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def run_trial_child(argv: Sequence[str], request: TrialRequest, *, log_path: str, cwd: str | None = None,
                    environ: Mapping[str, str] | None = None,
                    timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S) -> CommandTrial:
    """Run the command once as a trial child and read what it recorded.

    Raises:
        TrialFailed: the child failed with an error that is not out-of-memory, timed out, or finished
            without a Trainer reaching its first step (a command vramscope cannot tune).
    """
    env = child_environment(request, environ)
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        # Its own session, so that the terminal's signals reach the tuner alone and the trial's process group
        # holds everything it started (torchrun's workers, DataLoader workers): that group ends with the trial.
        proc: subprocess.Popen[bytes] | None = None
        try:
            with held():  # a signal to the tuner right now is raised once the child is ours to end
                proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TrialFailed(f"the trial at {_size(request)} ran past {timeout_s:.0f} s and was stopped; "
                              f"its output is in {log_path}") from None
        finally:
            if proc is not None:  # after any end: helpers left by a crash or an OOM would hold the GPU into the next
                end_group(proc)
    seconds = time.perf_counter() - t0
    records = read_records(request.record)  # a torn record is skipped (tune.trial_record says what reads as one)
    tail = _tail(log_path)
    if not records:
        if code == 0:
            raise TrialFailed("the command finished without starting an HF Trainer (no trial record); "
                              "vramscope tune -- runs Trainer-based commands (HF Trainer, TRL, axolotl)")
        oom = "OutOfMemoryError" in tail or "CUDA out of memory" in tail
        if not oom:
            raise TrialFailed(f"the command exited with {code} before training began: {_last_line(tail)} "
                              f"(output: {log_path})")
        records = [TrialRecord(status="oom", error=f"out of memory before training began: {_last_line(tail)}")]
    statuses = {r.status for r in records}
    first = records[0]
    base = first.base_allocated_bytes or 0
    base_reserved = first.base_reserved_bytes
    capacity = first.capacity_bytes
    phases = phase_peaks(records)
    if "oom" in statuses or (code == OOM_EXIT_CODE and "done" not in statuses):
        oom_error = next((str(r.error) for r in records if r.status == "oom"), "out of memory")
        trial = Trial(size=0, ok=False, base_bytes=base, peak_bytes=None, seconds=seconds, error=oom_error,
                      after_bytes=base, base_reserved_bytes=base_reserved, after_reserved_bytes=base_reserved)
        if phases.oom_phase == "eval":
            trial = replace(trial, error=f"in evaluation: {oom_error}")
        return CommandTrial(trial, capacity, first, log_path, phases)
    if statuses != {"done"}:
        error = next((r.error for r in records if r.error), None)
        raise TrialFailed(f"the trial at {_size(request)} failed: {error or _last_line(tail)} (exit {code}; "
                          f"output: {log_path})")
    # Per device: the worst rank and the worst step (the first one also creates the optimizer state), and the
    # evaluation pass's peak where it ran: the trial's peak is the larger of the two phases.
    trial = Trial(size=0, ok=True, base_bytes=base, peak_bytes=phases.peak_allocated, seconds=seconds,
                  after_bytes=base, base_reserved_bytes=base_reserved, peak_reserved_bytes=phases.peak_reserved,
                  after_reserved_bytes=base_reserved)
    return CommandTrial(trial, capacity, first, log_path, phases)


def _size(request: TrialRequest) -> str:
    return f"batch {request.batch_size} x {request.seq_len or 'the data'}'s tokens"


@dataclass(frozen=True)
class CommandTuneResult:
    """The search's result for a command, and the setting to put into it."""

    result: TuneResult
    unit: str  # "batch" or "seq_len"
    batch_size: int  # the per-device batch the answer is for (the answer itself in batch mode)
    seq_len: int | None  # the length the answer is for (the answer itself in seq_len mode)
    setting: str  # "--per_device_train_batch_size 6", "micro_batch_size: 6 (in config.yml)"
    keep_effective: str | None  # how to keep the command's effective batch, when it accumulates
    trials: tuple[CommandTrial, ...]
    notes: tuple[str, ...]
    limit: Limit | None = None  # the phase that limits the answer (None: the command does not evaluate)
    eval_follows: bool = False  # the eval batch is the batch tried (axolotl without eval_batch_size)

    @property
    def chosen_phases(self) -> PhasePeaks | None:
        """The per-phase peaks of the trial at the answer."""
        own = [t for t in self.trials if t.trial.ok and t.trial.size == self.result.size]
        return own[-1].phases if own else None

    def to_dict(self) -> dict[str, Any]:
        out = self.result.to_dict()
        out.update(unit=self.unit, batch_size=self.batch_size, seq_len=self.seq_len, setting=self.setting,
                   keep_effective=self.keep_effective, logs=[t.log_path for t in self.trials])
        chosen = self.chosen_phases
        out["limiting_phase"] = self.limit.phase if self.limit is not None else "train"
        out["limit"] = None if self.limit is None else {
            "phase": self.limit.phase, "at_size": self.limit.at_size, "out_of_memory": self.limit.ran_out,
            "words": self.limit.words(self.result.size, "length" if self.unit == "seq_len" else "batch",
                                      self.eval_follows)}
        out["phase_peaks"] = None if chosen is None else chosen.to_dict()
        for row, outcome in zip(out["trials"], self.trials, strict=False):
            row["phase"] = outcome.phases.phase
            row["phase_peaks"] = outcome.phases.to_dict()
        out["notes"] = [*out.get("notes", []), *self.notes]
        return out


def setting_for(parsed: ParsedCommand, unit: str, size: int) -> str:
    """The flag (or config key) that sets ``size`` in the command, in its own spelling."""
    if unit == "batch":
        return _set(parsed, parsed.batch_flag, size)
    if parsed.seq_parts:
        return f"{' and '.join(parsed.seq_parts)} summing to {size}"
    if parsed.seq_flag is not None:
        return _set(parsed, parsed.seq_flag, size)
    return f"a maximum length of {size} tokens (the command has no length flag vramscope knows)"


def _set(parsed: ParsedCommand, flag: str, value: int) -> str:
    """``flag value``, or ``key: value (in x.yml)`` where the command's settings are its config file's keys."""
    if parsed.flags_in_config:
        return f"{flag}: {value} (in {Path(parsed.config_path or 'config.yml').name})"
    return f"{flag} {value}"


@dataclass(frozen=True)
class SearchSettings:
    """How ``vramscope tune -- CMD`` searches, on one GPU or as one rank of ``--gpus N`` (one set of its flags).

    Attributes:
        max_seq_len: search the longest sequence (in steps of ``multiple_of``) instead of the largest batch.
        batch_size, seq_len: override the command's (the fixed dimension of the search; in batch mode ``seq_len``
            is the length every trial batch is tiled to, the command's own maximum by default).
        start: the first size tried; max_size: the largest (None: 4096 rows, or the model's positions).
        multiple_of: the length's step; margin: the share of the GPU kept free.
        max_trials: fresh runs of the command at most; trial_steps: the steps of each.
        timeout_s: the longest one trial may run; keep_logs: keep the trials' output after a success.
    """

    max_seq_len: bool = False
    batch_size: int | None = None
    seq_len: int | None = None
    start: int = 1
    max_size: int | None = None
    multiple_of: int = 64
    margin: float = 0.05
    max_trials: int = 3
    trial_steps: int = DEFAULT_TRIAL_STEPS
    timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    keep_logs: bool = False


def tune_command(
    parsed: ParsedCommand,
    settings: SearchSettings | None = None,
    *,
    memory_limit_bytes: int | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    on_trial: Callable[[CommandTrial, int], None] | None = None,
) -> CommandTuneResult:
    """Search the largest batch (or, with ``settings.max_seq_len``, the longest sequence) for the parsed command,
    as ``settings`` say (:class:`SearchSettings`; its defaults without).

    Raises:
        TrialFailed: a trial failed for a reason other than memory (the message points to its output).
        NoSizeFitsError: even the smallest size ran out of memory.
    """
    settings = settings or SearchSettings()
    max_seq_len, multiple_of = settings.max_seq_len, settings.multiple_of
    keep_logs = settings.keep_logs  # set once a trial fails for a reason the message points to its output for
    fixed_batch = settings.batch_size or parsed.batch_size
    length = settings.seq_len if settings.seq_len is not None else parsed.seq_len
    notes: list[str] = []
    if not max_seq_len and length is None:
        notes.append("the command sets no maximum length: trials used the data's own lengths, so a longer "
                     "example later needs more memory than measured")
    # SIGTERM/SIGHUP/SIGINT unwind through the blocks below like an exception: the running trial's group
    # ends, the folder goes, and then the signal ends the tuner as it would have (see tune.groups).
    with stop_on_signals():
        folder = tempfile.mkdtemp(prefix="vramscope-tune-")
        done: list[CommandTrial] = []
        capacity: list[int] = []

        def run(size: int) -> Trial:
            n = len(done) + 1
            rows = fixed_batch if max_seq_len else size
            request = TrialRequest(
                batch_size=rows,
                seq_len=size * multiple_of if max_seq_len else length,
                max_steps=settings.trial_steps,
                record=str(Path(folder) / f"trial{n}.json"),
                memory_limit_bytes=memory_limit_bytes,
                eval_batch_size=eval_batch_for(parsed, rows),  # the command evaluates: so does each trial
            )
            outcome = run_trial_child(parsed.argv, request, log_path=str(Path(folder) / f"trial{n}.log"), cwd=cwd,
                                      environ=environ, timeout_s=settings.timeout_s)
            outcome = replace(outcome, trial=replace(outcome.trial, size=size))
            if outcome.trial.ok and outcome.trial.peak_bytes is None:
                raise TrialFailed("the trial child saw no CUDA device (no memory peaks recorded); "
                                  "vramscope tune -- needs the command to train on a CUDA GPU")
            if outcome.capacity_bytes is not None and not capacity:
                capacity.append(int(outcome.capacity_bytes))
            done.append(outcome)
            if on_trial is not None:
                on_trial(outcome, size * multiple_of if max_seq_len else size)
            return outcome.trial

        try:
            begin = settings.start if not max_seq_len else max(1, (settings.seq_len or 256) // multiple_of)
            first = run(begin)
            if not capacity:
                raise TrialFailed("the first trial ran out of memory before it could measure the GPU; "
                                  f"free the GPU or start lower (output: {done[0].log_path})")
            pending = [first]

            def trial_runner(size: int) -> Trial:
                if pending and size == begin:
                    return pending.pop()
                return run(size)

            if max_seq_len:
                limit = max(begin, (settings.max_size or _max_positions(parsed)) // multiple_of)
            else:
                limit = settings.max_size or 4096
            result = search(trial_runner, capacity[0], start=begin, max_size=limit, margin=settings.margin,
                            max_trials=settings.max_trials,
                            degree=2 if max_seq_len and parsed.spec.attn == "eager" else 1,
                            scale=multiple_of if max_seq_len else 1)
        except BaseException:
            # Keep the children's output for the message that points to it (an out-of-memory search keeps nothing).
            if not keep_logs and not isinstance(sys.exc_info()[1], (NoSizeFitsError, KeyboardInterrupt, Stopped)):
                keep_logs = True
            raise
        finally:
            if not keep_logs:
                shutil.rmtree(folder, ignore_errors=True)
    if max_seq_len:
        m = multiple_of
        result = replace(result, size=result.size * m, limit_size=result.limit_size * m,
                         predicted_max=None if result.predicted_max is None else result.predicted_max * m,
                         bytes_per_unit=None if result.bytes_per_unit is None else result.bytes_per_unit / m,
                         trials=tuple(replace(t, size=t.size * m) for t in result.trials), unit="seq_len")
    # The budget is 3 fresh runs of the command: "stopped after 3 trials" is the usual end, not a warning;
    # say what the fitted line allows instead.
    result = replace(result, notes=tuple(
        (f"{len(result.trials)} trials is the budget; with no margin the fitted line allows {result.predicted_max}"
         if n.startswith("stopped after") and result.predicted_max is not None else n) for n in result.notes))
    unit = "seq_len" if max_seq_len else "batch"
    phase_limit: Limit | None = None
    if parsed.eval.evaluates:
        usable = result.capacity_bytes * (1.0 - settings.margin)
        sized = [(t.size, t.ok, t.limited()[1], o.phases) for t, o in zip(result.trials, done, strict=False)]
        phase_limit = limiting(sized, result.size, usable, step=multiple_of if max_seq_len else 1,
                               capped=result.capped)
        missing = eval_notes(done)
        if missing:  # the trials could not evaluate: the planner's eval phase at the answer is the check
            recorded = next((o.phases.eval for o in done if o.phases.eval is not None), None)
            check = eval_plan_check(parsed, fixed_batch if max_seq_len else result.size,
                                    result.size if max_seq_len else length, result.capacity_bytes, recorded,
                                    eval_follows_train(parsed))
            notes.extend([*missing, check] if check else missing)
    keep: str | None = None
    if unit == "batch" and parsed.grad_accum > 1:
        effective = parsed.batch_size * parsed.grad_accum
        micro, steps = split_batch(effective, result.size)
        keep = (f"the command's effective batch {effective}: {setting_for(parsed, 'batch', micro).split(' (')[0]} "
                f"with {_set(parsed, parsed.accum_flag, steps).split(' (')[0]}")
    return CommandTuneResult(
        result=result,
        unit=unit,
        batch_size=fixed_batch if max_seq_len else result.size,
        seq_len=result.size if max_seq_len else length,
        setting=setting_for(parsed, unit, result.size),
        keep_effective=keep,
        trials=tuple(done),
        notes=tuple(notes),
        limit=phase_limit,
        eval_follows=eval_follows_train(parsed),
    )


def eval_notes(done: Sequence[CommandTrial]) -> list[str]:
    """What the trials could not measure of the evaluation (no eval set in the Trainer, a failed pass)."""
    notes: list[str] = []
    for outcome in done:
        evaluation = outcome.phases.eval
        if evaluation is None and outcome.trial.ok:
            notes.append("the command evaluates but the trials' Trainer ran no evaluation pass: the answer is for "
                         "the training step alone; check the evaluation with vramscope plan -- <command>")
        elif evaluation is not None and evaluation.status == "no_eval_dataset":
            notes.append("the command evaluates but its Trainer got no eval_dataset in the trial: the answer is for "
                         "the training step alone; check the evaluation with vramscope plan -- <command>")
        elif evaluation is not None and evaluation.status == "failed":
            notes.append(f"the trial's evaluation pass failed ({evaluation.error}): the answer is for the "
                         "training step alone; check the evaluation with vramscope plan -- <command>")
        else:
            continue
        break
    return notes


def _max_positions(parsed: ParsedCommand) -> int:
    config = parsed.model_config or {}
    value = config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else 131072
