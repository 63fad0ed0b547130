"""What every plan says, analytic (:class:`~vramscope.planner.api.Plan`) or traced
(:class:`~vramscope.planner.trace.engine.TracePlan`): the run it plans, its three totals, the step's moments and
the fit against a GPU. The two engines add their own fields; the document, the terminal and the report read these
the same way from either.

Pure data: nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramscope.recipe import QLoraSpec


@dataclass(frozen=True, kw_only=True)
class PlanTotals:
    """The fields a plan has whichever engine made it.

    Attributes:
        peak_phase: the training step's moment that sets its peak (``Plan.run_peak_phase`` names the run's phase).
        phases: the training step's moments, peak allocated bytes each.
        gpu_memory_bytes, fits: the capacity planned against and whether the process fits it (None without one).
    """

    model: str
    batch_size: int
    seq_len: int
    spec: QLoraSpec
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    process_bytes: int
    peak_phase: str
    phases: dict[str, int]
    trainable_params: int
    total_params: int
    gpu_memory_bytes: int | None = None
    fits: bool | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # what must hold whatever the engine: allocated <= reserved <= process, and a fit needs a capacity
        assert 0 <= self.peak_allocated_bytes <= self.peak_reserved_bytes <= self.process_bytes, self
        assert self.fits is None or self.gpu_memory_bytes is not None, self

    def totals_dict(self) -> dict[str, Any]:
        """The run and its three totals, as both engines' ``to_dict`` begin."""
        return {"model": self.model, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "spec": self.spec.to_dict(), "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "process_bytes": self.process_bytes}
