"""The steps since a :class:`~vramscope.training.monitor.MemoryMonitor` last logged a row: what its next row
and an OOM report say about them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepWindow:
    """The steps and batches since the last logged row (with ``every_n_steps`` > 1, several steps)."""

    last_step: int | None = None  # the last step finished
    pending: bool = False  # a step finished since the last logged row
    tokens: int | None = None  # the largest batch since the last logged row: the next row's ``tokens``
    batch_tokens: int | None = None  # the batch running now (or last), for an OOM report
    batch_shape: tuple[int, ...] | None = None

    def step_done(self, step: int, tokens: int | None) -> None:
        """Step ``step`` finished (its batch of ``tokens``, when the caller knows them)."""
        self._widen(tokens)
        self.last_step = step
        self.pending = True

    def batch(self, tokens: int, shape: tuple[int, ...] | None) -> None:
        """A batch is about to run."""
        self.batch_tokens = tokens
        self.batch_shape = shape
        self._widen(tokens)

    def logged(self) -> None:
        """A row was logged: the next one covers the steps from here."""
        self.tokens = None
        self.pending = False

    def _widen(self, tokens: int | None) -> None:
        if tokens is not None and (self.tokens is None or tokens > self.tokens):
            self.tokens = tokens


__all__ = ["StepWindow"]
