"""What a sink is: something that takes samples, one at a time, and can be closed.

The log files themselves (writing, rotation, names) are :mod:`vramscope.logs.files`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vramscope.types import Sample


@runtime_checkable
class Sink(Protocol):
    """Receives every sample. ``write`` may raise; the sampler reports it once and carries on."""

    def write(self, sample: Sample) -> None: ...

    def close(self) -> None: ...
