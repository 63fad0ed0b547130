"""Step-aligned memory for PyTorch Lightning: :class:`MemoryMonitorCallback`.

::

    from vramscope.integrations.lightning import MemoryMonitorCallback
    trainer = L.Trainer(callbacks=[MemoryMonitorCallback(log="memory_log.csv")])

The same rows as the plain-loop monitor: one per ``every_n_steps`` optimizer steps
(``trainer.global_step``, so gradient accumulation counts once per step), validation as its own
``eval`` phase (sanity check included), the tokens of each batch read from the batch itself (an
``input_ids`` tensor in a dict, or the first tensor of token ids), and the figures (``mem/peak_allocated_gib``, ...)
written to whatever loggers the Trainer has, on the steps Lightning logs (``log_every_n_steps``).

Lightning keeps only the logged step's value of a metric, so a peak measured at every step and
logged with ``self.log`` was lost unless it fell on a logged step. The figures go to the loggers
directly instead, as Lightning's own ``DeviceStatsMonitor`` does, and only on logging steps; their
peak is the largest of every row since the previous logged step (the monitor keeps that maximum
until the figures are read). Steps after the last logging step are written once at the end of fit.
Works with ``lightning.pytorch`` and with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from vramscope.training.guard import never_stops_training
from vramscope.training.hooks import batch_tokens
from vramscope.training.monitor import MemoryMonitor
from vramscope.training.settings import MonitorParts, MonitorSettings

if importlib.util.find_spec("lightning") is not None:
    from lightning.pytorch import Callback as _CallbackBase
elif importlib.util.find_spec("pytorch_lightning") is not None:
    from pytorch_lightning import Callback as _CallbackBase  # type: ignore[assignment]
else:  # the class still imports, so that the error can say what to install
    _CallbackBase = object  # type: ignore[misc,assignment]

INSTALL_HINT = "lightning is not installed; run: pip install 'vramscope[lightning]'"
# The figures that hold a peak since they were last read (on a GPU, and on a CPU-only run).
PEAK_FIGURES = ("mem/peak_allocated_gib", "mem/peak_rss_gib")


def _is_token_ids(value: Any) -> bool:
    """A tensor of token ids: integers in 1 or 2 dimensions (not images, features or embeddings)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    return (shape is not None and 1 <= len(shape) <= 2 and dtype is not None
            and getattr(dtype, "is_floating_point", True) is False and getattr(dtype, "is_complex", True) is False)


def lightning_batch_tokens(batch: Any) -> tuple[int | None, tuple[int, ...] | None]:
    """(tokens, shape) of a Lightning batch: a dict's ``input_ids`` (or ``inputs_embeds``), else the
    first tensor of a list or tuple batch (or the batch itself) when it holds token ids. Anything
    else (an image batch, say) is unknown: the row's tokens stay empty rather than count pixels."""
    if isinstance(batch, dict):
        return batch_tokens((), batch)
    first = batch[0] if isinstance(batch, (list, tuple)) and batch else batch
    return batch_tokens((first,), {}) if _is_token_ids(first) else (None, None)


def _is_logging_step(trainer: Any) -> bool:
    """Whether Lightning writes to its loggers at this training batch (its own test, where it has one)."""
    connector = getattr(trainer, "_logger_connector", None)
    should = getattr(connector, "should_update_logs", None)
    if isinstance(should, bool):
        return should
    every = getattr(trainer, "log_every_n_steps", 50)
    return isinstance(every, int) and every > 0 and int(trainer.global_step) % every == 0


def _running(trainer: Any) -> str:
    """What the Trainer is running: "fit", "validate", "test" or "predict" (its ``state.fn``)."""
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return str(getattr(fn, "value", fn))


def _logger_step(trainer: Any) -> int:
    """The step Lightning's own metrics of this batch are written under (0-based optimizer steps)."""
    stepped = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None), "_batches_that_stepped", None)
    return stepped if isinstance(stepped, int) else max(0, int(trainer.global_step) - 1)


class MemoryMonitorCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """A Lightning ``Callback`` that logs memory at training steps and warns about leaks.

    Args:
        log: CSV (or ``.jsonl``) log path; rank *k* > 0 writes ``<stem>.rank<k><suffix>``.
        settings: the monitor's options as one :class:`~vramscope.training.settings.MonitorSettings`; the
            keyword arguments are put over it.
        log_to_trainer: write the figures to the Trainer's loggers on the steps Lightning logs.
        **options: any option of :class:`MemoryMonitor` (the fields of ``MonitorSettings``: ``every_n_steps``
            (optimizer steps), ``interval``, ``gpus``, ``oom_snapshot``, ``prometheus`` (a port or
            ``"HOST:PORT"``), ``warn``, ``export={"push": "http://gw:9091", ...}`` (any exporter of
            ``vramscope.exporters.registry``), ...; and ``sinks``, ``nvml``, ``warn_stream``).
            ``prometheus_port`` is the HF callback's old name of ``prometheus`` (accepted, with a FutureWarning).

    Raises:
        ImportError: lightning is not installed (with the install command).
        TypeError: an option the monitor does not have.
    """

    def __init__(
        self,
        log: str | os.PathLike[str] | None = None,
        *,
        settings: MonitorSettings | None = None,
        log_to_trainer: bool = True,
        **options: Any,
    ) -> None:
        if _CallbackBase is object:
            raise ImportError(INSTALL_HINT)
        super().__init__()
        # A run after the monitor closed (fit() again, validate()/test() after fit()) gets a new monitor with
        # these options; the log's claim (training/claims.py) gives it the next free name, in one warning.
        self._parts = MonitorParts.take(options)
        if log is not None:
            options["log"] = log
        self.settings = MonitorSettings.build(settings, **options)
        self.monitor = MemoryMonitor(settings=self.settings, parts=self._parts)
        self.log_to_trainer = log_to_trainer
        self._last_step: int | None = None
        self._rows_at_last_write = 0  # monitor rows already covered by figures written to the loggers

    def _ensure_started(self, trainer: Any) -> MemoryMonitor:
        if self.monitor.closed:
            self.monitor = MemoryMonitor(settings=self.settings, parts=self._parts)
            self._last_step = None
            self._rows_at_last_write = 0
        mon = self.monitor
        if not mon.started and not mon.closed:
            max_steps = getattr(trainer, "max_steps", -1)
            if isinstance(max_steps, int) and max_steps > 0:
                mon.configure(total_steps=max_steps)
            mon.start()
        return mon

    # -- fit ------------------------------------------------------------------------------------------
    @never_stops_training
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure_started(trainer)

    @never_stops_training
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._ensure_started(trainer).observe_batch(*lightning_batch_tokens(batch))

    @never_stops_training
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        mon = self._ensure_started(trainer)
        step = int(trainer.global_step)
        if step == self._last_step or step == 0:  # an accumulation micro-batch: no optimizer step yet
            return
        self._last_step = step
        optimizers = getattr(trainer, "optimizers", None) or [None]
        mon.watch_memory(pl_module, optimizers[0])  # for the breakdown; weak references, compared once
        mon.step(step)
        if _is_logging_step(trainer):
            self._write_figures(trainer, _logger_step(trainer), pl_module)

    def _write_figures(self, trainer: Any, step: int, pl_module: Any = None) -> None:
        """The figures since the previous write, to every logger (a peak only when a row was logged since), and
        to ``trainer.callback_metrics`` (so that ``EarlyStopping`` and ``ModelCheckpoint`` can watch them)."""
        mon = self.monitor
        if not self.log_to_trainer or not mon.started:
            return
        fresh = mon.rows_logged > self._rows_at_last_write
        self._rows_at_last_write = mon.rows_logged
        figures = mon.figures(reset=True)
        if not fresh:  # no row since the last write: the monitor has no peak (it would say 0)
            for key in PEAK_FIGURES:
                figures.pop(key, None)
        if not figures:
            return
        loggers = getattr(trainer, "loggers", None) or []
        if getattr(trainer, "is_global_zero", True):
            for logger in loggers:
                logger.log_metrics(dict(figures), step=step)
        if pl_module is not None:
            # Lightning's own log keeps callback_metrics (and its tensors) right; logger=False: written above.
            pl_module.log_dict(dict(figures), on_step=True, on_epoch=False, logger=False, prog_bar=False,
                               rank_zero_only=True)

    @never_stops_training
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure_started(trainer).enter_phase("eval")

    @never_stops_training
    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.monitor.observe_batch(*lightning_batch_tokens(batch))

    @never_stops_training
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.exit_phase("eval")
        if _running(trainer) == "validate":  # trainer.validate(): the run is this evaluation alone
            self.monitor.close()

    # -- test (trainer.test()) ------------------------------------------------------------------------
    @never_stops_training
    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure_started(trainer).enter_phase("test")

    @never_stops_training
    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.monitor.observe_batch(*lightning_batch_tokens(batch))

    @never_stops_training
    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.exit_phase("test")
        self.monitor.close()

    @never_stops_training
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        mon = self.monitor
        mon.flush()
        if mon.rows_logged > self._rows_at_last_write:  # the steps after the last logging step
            self._write_figures(trainer, max(0, int(trainer.global_step) - 1))  # (callback_metrics: not here)
        mon.close()

    @never_stops_training
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.monitor.close()  # the rows so far and the analysis are kept
