"""Taking readings: backends -> one :class:`~vramscope.types.Sample` at a time -> the sinks.

* :mod:`~vramscope.sampling.sampler`: :class:`~vramscope.sampling.sampler.Collector` (every backend read once
  into a Sample) and :class:`~vramscope.sampling.sampler.Sampler` (a Sample every interval, on a thread).
* :mod:`~vramscope.sampling.peaks`: :class:`~vramscope.sampling.peaks.PeakTracker`, the running peaks of the
  samples (a sink).
* :mod:`~vramscope.sampling.devices`: which NVML GPU an allocator reading is on (and back).

Importing this package imports nothing: a log reader that needs :mod:`~vramscope.sampling.devices` does not
pull in the backends (psutil, NVML) with it.
"""
