"""Moved to :mod:`vramscope.tune` (issue 15): the search in :mod:`~vramscope.tune.search`, the CUDA probe in
:mod:`~vramscope.tune.cuda`, the trial runner in :mod:`~vramscope.tune.trials`, the entry points in
:mod:`~vramscope.tune.find`. This shim keeps the old import path."""

from vramscope.tune.batching import split_batch
from vramscope.tune.cuda import CudaProbe
from vramscope.tune.find import find_max_batch_size, find_max_seq_len
from vramscope.tune.search import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_TRIALS,
    FAR_PROBE_HEADROOM,
    MemoryProbe,
    NoSizeFitsError,
    Trial,
    TuneResult,
    fit_line,
    search,
)
from vramscope.tune.trials import make_trial_runner

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_TRIALS", "FAR_PROBE_HEADROOM", "CudaProbe", "MemoryProbe",
           "NoSizeFitsError", "Trial", "TuneResult", "find_max_batch_size", "find_max_seq_len", "fit_line",
           "make_trial_runner", "search", "split_batch"]
