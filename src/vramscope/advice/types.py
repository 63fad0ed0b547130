"""The one shape of a piece of advice, whoever gives it: an OOM's post-mortem, a log's analysis or the planner.

Pure data, importing nothing of vramscope but one constant of the planner's settings, so that every floor that
gives advice can build it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vramscope.planner.settings import EXPANDABLE_SEGMENTS as EXPANDABLE_SEGMENTS  # re-exported: its old home

# Who says it. "snapshot": vramscope's rules over an OOM's measured numbers; "log": a rule over what a
# memory log shows; "planner": a prediction of the memory model (vramscope.planner.recommend).
SOURCES = ("snapshot", "log", "planner")


@dataclass(frozen=True)
class Advice:
    """One way to use less GPU memory (or to use it better), for people and for programs.

    Attributes:
        key: a stable name of the change (``micro_batch``, ``gradient_checkpointing``, ``expandable_segments``,
            ``leak``, ...), for programs and for merging two sources' advice about the same change.
        title: what to change, one line for people (``Turn on gradient checkpointing``).
        detail: why: the evidence it rests on and how to do it.
        saves_bytes: the expected effect: memory it frees at the peak, where it can be estimated.
        source: who says it, one of :data:`SOURCES`.
        sufficient: whether this change alone brings the peak under the capacity (None: not judged, e.g.
            the run fitted).
        change: what to change in neutral keys (``{"batch_size": 2, "grad_accum": 2}``, ``{"env": {...}}``).
        how: ``change`` written in the run's own keys (TrainingArguments / SFTConfig fields, axolotl YAML, a loop's
            code, an ``export`` line): :func:`vramscope.planner.settings.written_as`.
        urgent: act before the next run (a leak, a batch that will not fit, a GPU nearly full).
        device: the device it is about (a log's device key, ``"all"``), None when it is the run's.
    """

    key: str
    title: str
    detail: str
    saves_bytes: int | None = None
    source: str = "snapshot"
    sufficient: bool | None = None
    change: Mapping[str, Any] = field(default_factory=dict)
    how: str = ""
    urgent: bool = False
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``report --json``'s ``recommendations``): every field, ``key`` also as ``name``."""
        return {"name": self.key, "title": self.title, "detail": self.detail, "saves_bytes": self.saves_bytes,
                "urgent": self.urgent, "device": self.device, "source": self.source, "sufficient": self.sufficient,
                "change": dict(self.change), "how": self.how}


def rank_by_sufficiency(items: Iterable[Advice]) -> list[Advice]:
    """Changes that alone would have avoided the OOM first, then by the memory they free (an OOM's order)."""
    return sorted(items, key=lambda a: (0 if a.sufficient else 1, -(a.saves_bytes or 0)))


def rank_by_urgency(items: Iterable[Advice]) -> list[Advice]:
    """Urgent first, then by the memory they free; advice without an estimate of its effect last (a log's order)."""
    return sorted(items, key=lambda a: (not a.urgent, a.saves_bytes is None, -(a.saves_bytes or 0)))
