"""The evaluation pass of a tuning trial, inside the trial child (see :mod:`vramscope.tune.command_trial`).

When the user's command evaluates, a run's peak may be its evaluation's, not its step's: the evaluation runs
beside the weights and optimizer states at ``per_device_eval_batch_size``, and with ``compute_metrics`` (and no
``eval_accumulation_steps``) the Trainer piles every batch's logits up on the GPU until the eval set ends. So,
after the trial's last training step, and before the child exits, the trial runs the user's own
``trainer.evaluate()`` where the real run's first evaluation runs (``on_step_end``, optimizer states in place),
on a slice of the user's eval set, every batch tiled to ``eval_batch_size`` rows of the trial's length.

How many eval batches: as many as the real evaluation holds on the GPU at once (the whole eval set when logits
are kept without accumulation; ``eval_accumulation_steps`` + 1 with it; 2 when only the loss is kept), capped at
:data:`EVAL_STEPS_CAP`. When the cap cuts it short, the peak of the held batches is extrapolated from the
measured growth of the last two batches (each batch adds its logits and, for a moment, the concatenation's copy);
the record says so (``extrapolated_steps``).

The user's ``compute_metrics`` is swapped for one that returns nothing while the trial evaluates: its GPU memory
is the logits the loop gathers, which it still gathers; the metric itself runs on the host over tiled batches,
and would only cost time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from vramscope.tune.trial_record import TrialEval

EVAL_STEPS_CAP = 8  # eval batches run at most; beyond, the held logits are extrapolated
LOSS_ONLY_STEPS = 2  # loss only: nothing accumulates; the second batch runs with the first's memory freed


def logits_mode(trainer: Any) -> str:
    """What the user's evaluation keeps on the GPU per batch, read from the trainer as the loop reads it.

    ``none`` (no ``compute_metrics`` or ``prediction_loss_only``: the loss alone), ``per_batch``
    (``batch_eval_metrics``: each batch's logits go to the metric and are freed), ``preprocessed``
    (``preprocess_logits_for_metrics``: what it returns, e.g. argmax ids), ``kept`` (the full logits).
    """
    args = trainer.args
    if getattr(trainer, "compute_metrics", None) is None or getattr(args, "prediction_loss_only", False):
        return "none"
    if getattr(args, "batch_eval_metrics", False):
        return "per_batch"
    if getattr(trainer, "preprocess_logits_for_metrics", None) is not None:
        return "preprocessed"
    return "kept"


def eval_steps(mode: str, total_steps: int | None, accumulation_steps: int | None,
               cap: int = EVAL_STEPS_CAP) -> tuple[int, int]:
    """``(batches to run, batches whose memory the real evaluation holds at its peak)``.

    ``total_steps`` is the real eval set's batches on this rank (None: unknown, an iterable eval set).
    """
    if mode in ("none", "per_batch"):
        held = LOSS_ONLY_STEPS
    elif accumulation_steps:
        held = accumulation_steps + 1  # the N-th batch concatenates onto N-1 before they move to the host
    else:
        held = total_steps if total_steps is not None else cap
    if total_steps is not None:
        held = min(held, total_steps)
    held = max(1, held)
    return min(held, cap), held


def extrapolate(peaks: list[int], held: int) -> int:
    """The peak at batch ``held``, from the measured per-batch peaks (growth of the last two, never negative)."""
    if not peaks:
        return 0
    run = len(peaks)
    if held <= run or run < 2:
        return max(peaks)
    growth = max(0, peaks[-1] - peaks[-2])
    return max(peaks) + growth * (held - run)


def _cut_iterable(dataset: Any, count: int) -> Any:
    """The first ``count`` items of an iterable eval set (which has no length to slice)."""
    import torch

    class First(torch.utils.data.IterableDataset):  # type: ignore[misc,type-arg]
        def __iter__(self) -> Iterator[Any]:
            return itertools.islice(iter(dataset), count)

    return First()


def eval_slice(dataset: Any, count: int) -> Any:
    """The first ``count`` examples of the eval set, of the kind it is (a ``datasets`` table, a torch dataset)."""
    try:
        length = len(dataset)
    except TypeError:
        return _cut_iterable(dataset, count)
    count = min(count, length)
    if hasattr(dataset, "select"):
        return dataset.select(range(count))
    import torch

    return torch.utils.data.Subset(dataset, range(count))


def first_eval_set(trainer: Any) -> tuple[str | None, Any]:
    """The dataset the run's evaluation starts with, and its name when the Trainer holds several."""
    data = getattr(trainer, "eval_dataset", None)
    if isinstance(data, dict):
        for name, value in data.items():
            return str(name), value
        return None, None
    return None, data


class EvalPass:
    """One evaluation pass of a trial: what to run, and what it measured (filled by the trial's callback)."""

    def __init__(self, rows: int, cuda: bool) -> None:
        self.rows, self.cuda = rows, cuda
        self.step_peaks: list[int] = []
        self.step_reserved: list[int] = []
        self.shapes: list[list[int]] = []
        self.active = False
        self.settings = TrialEval(batch_size=rows)  # what it runs at, once read from the Trainer

    def step_done(self) -> None:
        """After each eval batch (``on_prediction_step``): its peaks, then a fresh peak for the next batch."""
        if not (self.active and self.cuda):
            return
        import torch

        self.step_peaks.append(int(torch.cuda.max_memory_allocated()))
        self.step_reserved.append(int(torch.cuda.max_memory_reserved()))
        torch.cuda.reset_peak_memory_stats()

    def run(self, trainer: Any) -> TrialEval:
        """Run the user's evaluation on a slice of its eval set; returns the record's ``eval`` entry.

        An out-of-memory error propagates (the trial's handling attributes it to evaluation); any other
        failure is recorded as ``status: "failed"`` with its message, for the tuner to fall back on the plan.
        """
        name, dataset = first_eval_set(trainer)
        mode = logits_mode(trainer)
        args = trainer.args
        out = TrialEval(batch_size=self.rows, logits=mode,
                        eval_accumulation_steps=getattr(args, "eval_accumulation_steps", None), eval_set=name)
        if dataset is None:
            return replace(out, status="no_eval_dataset")
        world = max(1, int(getattr(args, "world_size", 1) or 1))
        try:
            examples: int | None = len(dataset)
        except TypeError:
            examples = None
        total = None if examples is None else math.ceil(examples / (self.rows * world))
        run, held = eval_steps(mode, total, out.eval_accumulation_steps)
        out = replace(out, eval_examples=examples, steps_total=total, steps_held=held, steps_run=run)
        self.settings = out
        collator = trainer.data_collator
        saved = (getattr(args, "per_device_eval_batch_size", None), getattr(collator, "rows", None),
                 trainer.compute_metrics)
        model = getattr(trainer, "model", None)
        hook = model.register_forward_pre_hook(self._seen, with_kwargs=True) if model is not None else None
        try:
            args.per_device_eval_batch_size = self.rows
            if saved[1] is not None:
                collator.rows = self.rows
            if mode != "none":
                trainer.compute_metrics = _no_metrics
            if self.cuda:
                import torch

                torch.cuda.reset_peak_memory_stats()
            self.active = True
            try:
                trainer.evaluate(eval_dataset=eval_slice(dataset, run * self.rows * world))
            except Exception as exc:
                from vramscope.oom.classify import oom_kind

                if oom_kind(exc) is not None:
                    raise
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                return replace(out, status="failed", error=f"{type(exc).__name__}: {first}",
                               inputs=self._inputs())
        finally:
            self.active = False
            if hook is not None:
                hook.remove()
            args.per_device_eval_batch_size = saved[0]
            if saved[1] is not None:
                collator.rows = saved[1]
            trainer.compute_metrics = saved[2]
        out = replace(out, status="done", inputs=self._inputs())
        if self.step_peaks:
            peak = extrapolate(self.step_peaks, held)
            out = replace(out, step_peaks=tuple(self.step_peaks), peak_allocated_bytes=peak,
                          peak_reserved_bytes=max(self.step_reserved) + (peak - max(self.step_peaks)),
                          measured_peak_allocated_bytes=max(self.step_peaks),
                          extrapolated_steps=max(0, held - len(self.step_peaks)))
        return out

    def _inputs(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(shape) for shape in self.shapes)

    def _seen(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self.active or module.training:
            return
        ids = kwargs.get("input_ids") if isinstance(kwargs, dict) else None
        if ids is None and args:
            ids = args[0]
        shape = getattr(ids, "shape", None)
        if shape is not None:
            self.shapes.append([int(d) for d in shape[:2]])


def _no_metrics(*_: Any, **__: Any) -> dict[str, float]:
    """Stands in for the user's metric: the logits are gathered all the same, the metric is not computed."""
    return {}
