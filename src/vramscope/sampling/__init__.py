"""Taking readings: backends -> one :class:`~vramscope.types.Sample` at a time -> the sinks.

* :mod:`~vramscope.sampling.sampler`: :class:`~vramscope.sampling.sampler.Collector` (every backend read once
  into a Sample) and :class:`~vramscope.sampling.sampler.Sampler` (a Sample every interval, on a thread).
* :mod:`~vramscope.sampling.peaks`: :class:`~vramscope.sampling.peaks.PeakTracker`, the running peaks of the
  samples (a sink).

Where the samples go (the :class:`~vramscope.types.Sink` protocol) and which NVML GPU an allocator reading is on
(:func:`~vramscope.types.gpu_of`) are on the bottom floor, :mod:`vramscope.types`, so that the log writers and the
exporters below this package never import it. Importing this package imports nothing.
"""
