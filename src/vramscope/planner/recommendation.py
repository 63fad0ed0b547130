"""One way to use less GPU memory, as the planner predicts it: the record :func:`~vramscope.planner.recommend`,
:attr:`Plan.recommendations <vramscope.planner.api.Plan>` and the cannot-fit alternatives
(:mod:`~vramscope.planner.nofit`) are made of.

It is the planner's prediction, pinned in ``plan --json``; :mod:`vramscope.advice.plan` turns it into the one
:class:`~vramscope.advice.Advice` that the OOM report and the log report show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Recommendation:
    """One way to use less GPU memory, with the planner's predicted saving.

    Attributes:
        name: a stable key (``gradient_checkpointing``, ``micro_batch``, ``optimizer``, ``seq_len``,
            ``expandable_segments``, ``lora_rank``, ``lora_targets``).
        saving_bytes: predicted drop of the step's peak GPU memory (process memory less pageable states).
        text: one line for people.
        change: what to change, as settings (e.g. ``{"batch_size": 2, "grad_accum": 2}``).
        sufficient: with a capacity and a peak: whether this change alone brings the peak under it.
        how: the change written in the keys of the program that runs the training (HF ``TrainingArguments``,
            TRL ``SFTConfig``, axolotl YAML, a loop's code, an ``export`` line): see
            :func:`vramscope.planner.settings.written_as`.
    """

    name: str
    saving_bytes: int
    text: str
    change: dict[str, Any] = field(default_factory=dict)
    sufficient: bool | None = None
    how: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "saving_bytes": self.saving_bytes, "text": self.text, "change": self.change,
                "sufficient": self.sufficient, "how": self.how}
