"""The reward of the GRPO truth points (``--reward_funcs whole_run_reward.length_reward``): a completion's
length in characters, scaled. It needs no model and no network, so TRL's own ``trl.scripts.grpo`` runs offline;
its memory is nothing beside the policy's generation and step, which is what the points measure."""

from __future__ import annotations

from typing import Any


def length_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    out = []
    for c in completions:
        text = c if isinstance(c, str) else " ".join(str(m.get("content", "")) for m in c)
        out.append(len(text) / 1000.0)
    return out
