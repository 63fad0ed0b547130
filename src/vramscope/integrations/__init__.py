"""The callbacks users add to their training: ``vramscope.integrations.hf``, ``.lightning`` and ``.loop``.

* :mod:`~vramscope.integrations.hf`: :class:`MemoryMonitorCallback` for Hugging Face's ``Trainer`` (and TRL's,
  axolotl's, LLaMA-Factory's, which are HF Trainers underneath).
* :mod:`~vramscope.integrations.lightning`: :class:`MemoryMonitorCallback` for PyTorch Lightning.
* :mod:`~vramscope.integrations.loop`: :class:`~vramscope.training.monitor.MemoryMonitor` for a plain loop.

Each drives the in-process monitor of :mod:`vramscope.training`. Never imported by vramscope/__init__.py.
"""
