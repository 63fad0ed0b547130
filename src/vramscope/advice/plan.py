"""Advice from a plan: the planner's recommendations (:func:`vramscope.planner.recommend`) as :class:`Advice`.

The planner states each change as one line with its predicted saving (``turn gradient checkpointing on (...):
saves 1.23 GiB``); as advice the saving is its own field, so the title is the line without it. The OOM and
the log builders both go through :func:`from_recommendation`, so planner advice reads the same everywhere.
"""

from __future__ import annotations

from vramscope.advice.types import Advice
from vramscope.planner.api import Plan
from vramscope.planner.recommendation import Recommendation


def title_of(rec: Recommendation) -> str:
    """The recommendation's line without its ``: saves ...`` tail, capitalised."""
    title = rec.text.split(": saves")[0] or rec.text
    return title[:1].upper() + title[1:]


def from_recommendation(rec: Recommendation, detail: str, *, sufficient: bool | None = None,
                        urgent: bool = False, device: str | None = None) -> Advice:
    """One recommendation as advice; ``detail`` says for what run it was priced (the builder knows)."""
    return Advice(rec.name, title_of(rec), detail, int(rec.saving_bytes), "planner", sufficient, dict(rec.change),
                  rec.how, urgent, device)


def advise_plan(plan: Plan) -> list[Advice]:
    """A plan's recommendations as advice, in the plan's order (largest predicted saving first)."""
    where = f"{plan.model} at batch {plan.batch_size} x {plan.seq_len} tokens under {plan.framework}"
    return [
        from_recommendation(r, f"planner, for {where}" + (f": {r.how}." if r.how else "."), sufficient=r.sufficient)
        for r in plan.recommendations
    ]
