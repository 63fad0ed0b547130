"""Step-aligned memory for PyTorch Lightning: :class:`MemoryMonitorCallback`.

::

    from vramscope.integrations.lightning import MemoryMonitorCallback
    trainer = L.Trainer(callbacks=[MemoryMonitorCallback(log="memory_log.csv")])

The same rows as the plain-loop monitor: one per ``every_n_steps`` optimizer steps
(``trainer.global_step``, so gradient accumulation counts once per step), validation as its own
``eval`` phase (sanity check included), the tokens of each batch read from the batch itself (an
``input_ids`` tensor in a dict, or the first tensor), and the figures logged through the
LightningModule (``mem/peak_allocated_gib``, ...) to whatever loggers the Trainer has.
Works with ``lightning.pytorch`` and with the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from vramscope.integrations.loop import MemoryMonitor, batch_tokens

if importlib.util.find_spec("lightning") is not None:
    from lightning.pytorch import Callback as _CallbackBase
elif importlib.util.find_spec("pytorch_lightning") is not None:
    from pytorch_lightning import Callback as _CallbackBase  # type: ignore[assignment]
else:  # the class still imports, so that the error can say what to install
    _CallbackBase = object  # type: ignore[misc,assignment]

INSTALL_HINT = "lightning is not installed; run: pip install 'vramscope[lightning]'"


class MemoryMonitorCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """A Lightning ``Callback`` that logs memory at training steps and warns about leaks.

    Args:
        log: CSV (or ``.jsonl``) log path; rank *k* > 0 writes ``<stem>.rank<k><suffix>``.
        every_n_steps: log every this many optimizer steps.
        interval: also sample every ``interval`` seconds between steps (None: step rows only).
        gpus: NVML indices to read (default: the GPUs this process uses).
        oom_snapshot: save an allocator snapshot and the step/batch context on a CUDA OOM.
        prometheus: ``"[HOST:]PORT"`` to serve the samples and the analysis to Prometheus.
        warn: print throttled leak / OOM warnings while training.
        log_to_trainer: log the figures through ``LightningModule.log_dict`` at every logged step.
        **monitor_options: passed to :class:`MemoryMonitor`.

    Raises:
        ImportError: lightning is not installed (with the install command).
    """

    def __init__(
        self,
        log: str | os.PathLike[str] | None = None,
        every_n_steps: int = 1,
        interval: float | None = None,
        gpus: list[int] | None = None,
        oom_snapshot: bool | str | os.PathLike[str] = False,
        prometheus: str | None = None,
        warn: bool = True,
        log_to_trainer: bool = True,
        **monitor_options: Any,
    ) -> None:
        if _CallbackBase is object:
            raise ImportError(INSTALL_HINT)
        super().__init__()
        self.monitor = MemoryMonitor(
            log=log,
            every_n_steps=every_n_steps,
            interval=interval,
            gpus=gpus,
            oom_snapshot=oom_snapshot,
            prometheus=prometheus,
            warn=warn,
            **monitor_options,
        )
        self.log_to_trainer = log_to_trainer
        self._last_step: int | None = None

    def _ensure_started(self, trainer: Any) -> MemoryMonitor:
        mon = self.monitor
        if not mon.started and not mon.closed:
            max_steps = getattr(trainer, "max_steps", -1)
            if isinstance(max_steps, int) and max_steps > 0:
                mon.total_steps = max_steps
            mon.start()
        return mon

    # -- fit ------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure_started(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._ensure_started(trainer).observe_batch(*batch_tokens((batch,), {}))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        mon = self._ensure_started(trainer)
        step = int(trainer.global_step)
        if step == self._last_step or step == 0:  # an accumulation micro-batch: no optimizer step yet
            return
        self._last_step = step
        sample = mon.step(step)
        if sample is not None and self.log_to_trainer and getattr(trainer, "loggers", None):
            figures = mon.figures(reset=True)
            if figures:
                pl_module.log_dict(figures, on_step=True, on_epoch=False, logger=True, prog_bar=False)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._ensure_started(trainer).enter_phase("eval")

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.monitor.observe_batch(*batch_tokens((batch,), {}))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.exit_phase("eval")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.monitor.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.monitor.close()  # the rows so far and the analysis are kept
