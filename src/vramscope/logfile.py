"""Moved to :mod:`vramscope.logs` (issue 15): ``reader.read_log``, ``table.LogTable``; this shim goes once every
import is rewritten. ``gc_paused`` stays here only for report/load.py, whose owner drops it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from vramscope.logs.cells import Column, Labels
from vramscope.logs.errors import LogFormatError, UnknownLogError
from vramscope.logs.reader import read_log, read_log_bytes
from vramscope.logs.smi_reader import read_nvidia_smi
from vramscope.logs.table import LogTable, step_series

__all__ = ["Column", "Labels", "LogFormatError", "LogTable", "UnknownLogError", "gc_paused", "read_log",
           "read_log_bytes", "read_nvidia_smi_text", "step_series"]


def read_nvidia_smi_text(name: str, text: str) -> LogTable:
    """nvidia-smi's CSV from its text (compatibility: :func:`vramscope.logs.smi_reader.read_nvidia_smi` reads bytes)."""
    return read_nvidia_smi(name, text.encode("utf-8", errors="replace"))


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (compatibility; the reader itself no longer needs it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
