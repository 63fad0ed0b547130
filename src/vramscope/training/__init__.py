"""Watching a training run from inside it: the in-process monitor the callbacks drive.

* :mod:`~vramscope.training.monitor`: :class:`~vramscope.training.monitor.MemoryMonitor`, step-aligned rows,
  phases, the live analysis and its warnings.
* :mod:`~vramscope.training.settings`: :class:`~vramscope.training.settings.MonitorSettings`, the one list of the
  monitor's options (the callbacks take the same), and the objects it is handed (``MonitorParts``).
* :mod:`~vramscope.training.opened`: what the monitor opens at start and closes at the end, as one value.
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
* :mod:`~vramscope.training.claims`: the logs this process writes: a second monitor on one starts a new file.
* :mod:`~vramscope.training.pacing`: when the live analysis may run without slowing the training.

The callbacks around the monitor are :mod:`vramscope.integrations`; ``vramscope run`` is :mod:`vramscope.run`;
the tuner's trial child and the QLoRA builders are in :mod:`vramscope.tune`.

Importing this package imports nothing.
"""
