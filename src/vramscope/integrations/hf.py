"""Step-aligned memory for Hugging Face's ``Trainer``: :class:`MemoryMonitorCallback`.

::

    from vramscope.integrations.hf import MemoryMonitorCallback
    trainer = Trainer(..., callbacks=[MemoryMonitorCallback(log="memory_log.csv")])

The callback drives a :class:`~vramscope.training.monitor.MemoryMonitor`: one row per
``every_n_steps`` optimizer steps (``state.global_step``), evaluation as its own ``eval`` phase (it
begins at the first forward in eval mode, so the training steps before it keep their own peak), the
tokens of each step's batch from a forward pre-hook on the model, and its figures
(``mem/peak_allocated_gib``, ``mem/reserved_gib``, ``mem/leak_mib_per_step``, ...) added to the
Trainer's ``logs`` in ``on_log``, so they reach whatever ``report_to`` already has (TensorBoard, W&B,
MLflow) with no other code. ``vramscope run`` attaches it to every Trainer by itself (see
:mod:`vramscope.run.inject`).
"""

from __future__ import annotations

import atexit
import importlib.util
import inspect
import logging
import os
import weakref
from typing import Any

from vramscope.training.guard import never_stops_training
from vramscope.training.monitor import MemoryMonitor

# prometheus_address is re-exported: users and tests import it from here.
from vramscope.training.settings import MonitorParts, MonitorSettings, prometheus_address  # noqa: F401

log = logging.getLogger("vramscope.integrations.hf")  # the logger name users filter on, kept from before the move

if importlib.util.find_spec("transformers") is not None:
    from transformers import TrainerCallback as _CallbackBase
else:  # the class still imports, so that the error can say what to install
    _CallbackBase = object  # type: ignore[misc,assignment]

INSTALL_HINT = "transformers is not installed; run: pip install 'vramscope[hf]'"

# The figures that hold a peak since the previous log (on a GPU, and on a CPU-only run).
PEAK_FIGURES = ("mem/peak_allocated_gib", "mem/peak_rss_gib")
# A first training batch at most this long per sequence is a tokenizer that made (almost) nothing of the text.
SHORT_SEQUENCE_TOKENS = 2
SHORT_SEQUENCE_HINT = (
    "at most {n} tokens per sequence, so a causal LM has (almost) nothing to predict and the memory is not "
    "that of the run you meant (TRL's num_tokens says the same); check that the tokenizer turns the text into "
    "tokens: transformers 5 loads a Qwen2 checkpoint's tokenizer as Qwen2Tokenizer, which makes every word of "
    "a word-level vocabulary nothing, leaving only the EOS token"
)

_never_stops_training = never_stops_training


_GUARD_CODE = _never_stops_training(lambda: None).__code__  # the guard's frames, to look past them


class MemoryMonitorCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """A ``transformers.TrainerCallback`` that logs memory at training steps and warns about leaks.

    Args:
        log: CSV (or ``.jsonl``) log path; each rank > 0 writes ``<stem>.rank<k><suffix>``. None keeps
            the rows in memory (warnings and the ``logs`` figures still work).
        settings: the monitor's options as one :class:`~vramscope.training.settings.MonitorSettings`; the
            keyword arguments are put over it.
        log_to_trainer: add the figures to the Trainer's ``logs`` in ``on_log``.
        max_seq_length: the longest sequence the data can hold; with the batch size it sets the
            longest batch for the OOM warning (default: the longest batch seen so far).
        **options: any option of :class:`MemoryMonitor` (the fields of ``MonitorSettings``: ``every_n_steps``
            (optimizer steps), ``interval``, ``gpus``, ``oom_snapshot`` (True: into ``<log stem>.oom/``; a path:
            into that folder), ``prometheus`` (a port or ``"HOST:PORT"``), ``warn``, ``analyze_every``,
            ``capacity_bytes``, ``export={"push": "http://gw:9091", ...}`` (any exporter of
            ``vramscope.exporters.registry``), ...; and ``sinks``, ``nvml``, ``warn_stream``).
            ``prometheus_port`` is the old name of ``prometheus`` (works until the next release, with a
            FutureWarning).

    Raises:
        ImportError: transformers is not installed (with the install command).
        TypeError: an option the monitor does not have.
    """

    def __init__(
        self,
        log: str | os.PathLike[str] | None = None,
        *,
        settings: MonitorSettings | None = None,
        log_to_trainer: bool = True,
        max_seq_length: int | None = None,
        **options: Any,
    ) -> None:
        if _CallbackBase is object:
            raise ImportError(INSTALL_HINT)
        # Build the monitor now (its options are checked here), start it at the first event; a run after the
        # monitor closed (train() again, evaluate() after train()) gets a new one with the same options.
        self._parts = MonitorParts.take(options)
        if log is not None:
            options["log"] = log
        self.settings = MonitorSettings.build(settings, **options)
        self.monitor = MemoryMonitor(settings=self.settings, parts=self._parts)
        self.log_to_trainer = log_to_trainer
        self.max_seq_length = max_seq_length
        self._watched: weakref.ref[Any] | None = None
        self._eval_phase = False
        self._atexit = False
        self._rows_at_last_log = 0
        self._figures_step: int | None = None  # the step whose training figures were last written
        self._run_peaks: dict[str, float] = {}  # the largest peak figure of the run, per key
        self._batch_checked = False
        self._failed = False  # set by the failure guard: the callback has stepped aside

    # -- setup ----------------------------------------------------------------------------------------
    def _ensure_started(self, args: Any, state: Any, model: Any) -> MemoryMonitor:
        if self.monitor.closed:  # the last run ended: this one is a new segment (the log's claim says where)
            self.monitor = MemoryMonitor(settings=self.settings, parts=self._parts)
            self._watched = None
            self._rows_at_last_log = 0
            self._figures_step = None
            self._run_peaks = {}
        mon = self.monitor
        if not mon.started and not mon.closed:
            known: dict[str, int] = {}  # what the run tells of itself, once it begins
            if getattr(state, "max_steps", 0):
                known["total_steps"] = int(state.max_steps)
            if self.max_seq_length is not None and mon.settings.max_batch_tokens is None:
                batch = int(getattr(args, "per_device_train_batch_size", 1))
                known["max_batch_tokens"] = int(self.max_seq_length) * batch
            if known:
                mon.configure(**known)
            mon.start()
            if not self._atexit:
                # A run that never reaches on_train_end (an exception, a notebook interrupt) closes at exit.
                atexit.register(self._close_at_exit)
                self._atexit = True
        if model is not None and (self._watched is None or self._watched() is not model):
            mon.watch_model(model, phase_from_mode=True)
            self._watched = weakref.ref(model)
        return mon

    def _move_to_front(self) -> None:
        """Run first among the Trainer's callbacks, so that ``on_log`` adds the figures before the
        ``report_to`` integrations (added before any user callback) send the logs on.

        The Trainer does not pass its callback handler to callbacks; the handler is the ``self`` of
        the frame that called this event. Moving this callback from position k to 0 while that frame
        iterates over the list leaves the element after k where it was, so no callback is skipped
        or called twice. Where the frame is not a handler (another trainer), nothing changes.
        """
        frame = inspect.currentframe()
        try:
            caller = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
            if caller is not None and caller.f_code is _GUARD_CODE:
                caller = caller.f_back  # the failure guard's frame sits between the event and its caller
            handler = caller.f_locals.get("self") if caller is not None else None
            callbacks = getattr(handler, "callbacks", None)
            if type(handler).__name__ == "CallbackHandler" and isinstance(callbacks, list) and self in callbacks:
                index = callbacks.index(self)
                if index > 0:
                    callbacks.insert(0, callbacks.pop(index))
        finally:
            del frame

    # -- events -----------------------------------------------------------------------------------------
    @_never_stops_training
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._move_to_front()
        self._ensure_started(args, state, model).note_strategy(model, args)

    @_never_stops_training
    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        mon = self._ensure_started(args, state, model)
        mon.watch_optimizer(kwargs.get("optimizer"))  # for the memory breakdown: its states by category
        if mon.current_phase == "eval":  # an eval-mode forward outside evaluate(): back to training
            mon.exit_phase("eval")
        mon.step(int(state.global_step))
        if not self._batch_checked and mon.current_phase == "train":
            self._check_first_batch(mon, int(state.global_step))

    @_never_stops_training
    def on_prediction_step(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        # The forward hook normally entered the phase already; this covers models without hooks.
        mon = self._ensure_started(args, state, model)
        if mon.current_phase != "eval":
            mon.enter_phase("eval")

    @_never_stops_training
    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        mon = self._ensure_started(args, state, model)
        mon.exit_phase("eval")

    @_never_stops_training
    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self.monitor.exit_phase("eval")

    def _check_first_batch(self, mon: MemoryMonitor, step: int) -> None:
        """Warn once when the first training batch is ``b x 1`` or ``b x 2``: the tokens column is right, the
        data is not (issue 19's "tokens = batch size" was such a batch)."""
        shape = mon.last_batch_shape
        if shape is None:
            return
        self._batch_checked = True
        if len(shape) >= 2 and shape[-1] <= SHORT_SEQUENCE_TOKENS and mon.alerts is not None:
            batch = " x ".join(str(d) for d in shape)
            hint = SHORT_SEQUENCE_HINT.format(n=SHORT_SEQUENCE_TOKENS)
            mon.alerts.warn("short_sequences", f"the first training batch is {batch} tokens: {hint}", step)

    @_never_stops_training
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        mon = self.monitor
        if not self.log_to_trainer or logs is None or not mon.started:
            return
        step = int(getattr(state, "global_step", 0) or 0)
        if any(str(key).startswith("eval_") for key in logs):
            figures = self._eval_figures(mon)
        elif "train_runtime" in logs:
            # train()'s own summary: the run's peaks; the last step's figures went out with its own log.
            figures = dict(self._run_peaks)
            if self._figures_step != step:
                figures = {**self._window_figures(mon), **figures}
        elif self._figures_step == step:
            return  # a second log at the same step (a user's trainer.log): each step's memory is written once
        else:
            figures = self._window_figures(mon)
            self._figures_step = step
        if not figures:
            return
        logs.update(figures)
        # The Trainer copied the logs into its history before calling us; keep the figures there too.
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(figures)

    def _window_figures(self, mon: MemoryMonitor) -> dict[str, float]:
        """The figures since the previous log; the peaks only where a row was logged in between."""
        fresh = mon.rows_logged > self._rows_at_last_log  # a row since the previous log: its peak is known
        self._rows_at_last_log = mon.rows_logged
        figures = mon.figures(reset=True)
        for key in PEAK_FIGURES:
            if key not in figures:
                continue
            if fresh:
                self._run_peaks[key] = max(self._run_peaks.get(key, 0.0), figures[key])
            else:  # the monitor has no peak for an empty window (it would say 0)
                del figures[key]
        return figures

    def _eval_figures(self, mon: MemoryMonitor) -> dict[str, float]:
        """Evaluation's memory, named ``eval_mem/...``: HF's integrations file anything not starting with
        ``eval_`` under ``train/``. The window since the previous log is the evaluation's (HF logs the step's
        training figures first, then evaluates); the run's training peak is not raised by it. evaluate() logs
        its metrics before on_evaluate, so the eval phase ends here, with its row (on_evaluate is then a no-op)."""
        mon.exit_phase("eval")
        fresh = mon.rows_logged > self._rows_at_last_log
        self._rows_at_last_log = mon.rows_logged
        figures = mon.figures(reset=True)
        keep = {key: value for key, value in figures.items()
                if key not in ("mem/leak_mib_per_step", "mem/steps_to_oom") and (fresh or key not in PEAK_FIGURES)}
        return {f"eval_{key}": value for key, value in keep.items()}

    @_never_stops_training
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mon = self.monitor
        if not mon.started:
            return
        mon.flush()
        mon.save_breakdown()  # while the Trainer still holds its model and optimizer
        path = mon.save_analysis()
        if path is not None:
            log.info("vramscope: memory analysis written to %s", path)
        # The run is over: release the log (its lock, its last row), so that a notebook's next run, or
        # train() called again, starts a new one instead of finding this one still open.
        mon.close()

    def _close_at_exit(self) -> None:
        self.monitor.close()

    def close(self) -> None:
        """Close the monitor now (it is closed at exit otherwise)."""
        self.monitor.close()
