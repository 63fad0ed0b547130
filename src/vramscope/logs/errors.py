"""The one error a log reader raises: one line that says what is wrong with the file and what to give instead."""

from __future__ import annotations


class LogFormatError(ValueError):
    """The file is not a memory log vramscope can read."""


class UnknownLogError(LogFormatError):
    """The file's first line is none of the formats :func:`~vramscope.logs.reader.read_log` reads
    (:mod:`vramscope.logs.imports` may know it)."""

    def __init__(self, message: str, first_line: str) -> None:
        super().__init__(message)
        self.first_line = first_line
