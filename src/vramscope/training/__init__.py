"""Watching a training run from inside it.

* :mod:`~vramscope.training.monitor`: :class:`~vramscope.training.monitor.MemoryMonitor`, step-aligned rows,
  phases, the live analysis and its warnings.
* :mod:`~vramscope.training.gather`: the rank gather to rank 0 and its fixed wire format (``GATHER_FIELDS``).
* :mod:`~vramscope.training.history`: the bounded row history the live analysis reads.
* :mod:`~vramscope.training.live`: the monitor's rows, latest sample and figures' peak, behind one lock.
* :mod:`~vramscope.training.window`: the steps and batches since the monitor's last logged row.
* :mod:`~vramscope.training.hooks`: a batch's tokens and shape from a forward call's arguments.
* :mod:`~vramscope.training.ranks`: this process's rank and each rank's file names.
* :mod:`~vramscope.training.readers`: the monitor's backends, background thread and OOM recorder.
* :mod:`~vramscope.training.outputs`: warnings and trainer-log figures from the analysis.
* :mod:`~vramscope.training.breakdown`: what the model's and optimizer's tensors hold.
* :mod:`~vramscope.training.strategy`: how the run is spread (FSDP / ZeRO / DDP).
* :mod:`~vramscope.training.guard`: the guard that keeps a callback's failure out of the training.

* :mod:`~vramscope.training.hf`, :mod:`~vramscope.training.lightning`: the callbacks for HF's and Lightning's
  ``Trainer`` (users import them from ``vramscope.integrations.hf`` / ``.lightning``, which re-export them and stay).
* :mod:`~vramscope.training.inject`: ``vramscope run`` attaching the callback with no code change, through the
  start-up hook in ``_sitecustomize/`` (copied into the child's path, standard library only).
* :mod:`~vramscope.training.trial`: a ``vramscope tune -- CMD`` trial child (``VRAMSCOPE_TRIAL``).
* :mod:`~vramscope.training.qlora`: build and step a real QLoRA/LoRA model (tune, calibration, benchmarks).
* :mod:`~vramscope.training.runner`: ``vramscope run``: a command under the sampler, signals forwarded.

Importing this package imports nothing.
"""
