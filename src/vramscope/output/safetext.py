"""Text from logs, processes and files made inert before it reaches a terminal.

Phase names, file names and other users' command lines are data: printed raw, an escape sequence in
one would drive the reader's terminal (recolour it, retitle it, clear it), a newline would forge a line
of output, and a right-to-left override would reorder what is shown. Every terminal printer passes
such text through :func:`printable` (or :func:`inert` for a whole summary); HTML and JSON have their
own escaping.
"""

from __future__ import annotations

from typing import Any


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: control and format characters shown as escapes (``\\x1b``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def inert(value: Any) -> Any:
    """A copy of a JSON-like value (dicts, lists, strings, numbers) with every string, keys too, printable."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {inert(k): inert(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [inert(v) for v in value]
    return value
