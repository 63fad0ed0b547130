"""``vramscope plan --trace``: the real training step run on fake tensors, its live bytes counted.

* :mod:`~vramscope.planner.trace.engine`: build the model on the meta device, run its steps, read the peaks.
* :mod:`~vramscope.planner.trace.counter`: the live bytes as torch's caching allocator would see them.
* :mod:`~vramscope.planner.trace.standins`: what stands in where a library cannot run on fake tensors.

The only part of the planner that imports torch (and transformers, peft). Importing this package imports nothing.
"""
