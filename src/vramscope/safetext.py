"""Kept so that old imports still work: terminal-safe text is :mod:`vramscope.output.safetext`."""

from vramscope.output.safetext import inert, printable

__all__ = ["inert", "printable"]
