"""Kept so that old imports still work: atomic writes are :mod:`vramscope.output.atomic`."""

from vramscope.output.atomic import write_atomically

__all__ = ["write_atomically"]
