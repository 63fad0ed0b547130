"""The running peaks of a stream of samples are :mod:`vramscope.sampling.peaks` (:class:`PeakTracker`);
the peaks of a log's whole columns are :mod:`vramscope.analysis.devices`' (numpy passes)."""

from vramscope.sampling.peaks import GpuPeak, PeakTracker  # noqa: F401  (moved to sampling/; old imports still work)
