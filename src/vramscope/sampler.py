"""Kept so that old imports still work: the sampler is :mod:`vramscope.sampling.sampler`."""

from vramscope.sampling.sampler import DEFAULT_INTERVAL_S, MAX_INTERVAL_S, MIN_INTERVAL_S, Collector, Sampler

__all__ = ["DEFAULT_INTERVAL_S", "MAX_INTERVAL_S", "MIN_INTERVAL_S", "Collector", "Sampler"]
