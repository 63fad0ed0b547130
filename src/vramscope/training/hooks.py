"""Reading a batch's size from a forward call's arguments, for the forward pre-hook of ``watch_model``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def batch_tokens(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[int | None, tuple[int, ...] | None]:
    """(tokens, shape) of a forward call's input: ``input_ids`` (or ``inputs_embeds``, or the first
    tensor argument). Reads the shape only: no device sync, no look at the values (so padding counts,
    as it does for memory)."""
    value = kwargs.get("input_ids")
    if value is None:
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and hasattr(embeds, "shape"):
            shape = tuple(int(d) for d in embeds.shape[:-1])
            return math.prod(shape), shape
        value = next((a for a in args if hasattr(a, "shape")), None)
        if value is None and isinstance(args[0] if args else None, dict):
            value = args[0].get("input_ids")
    if value is None or not hasattr(value, "shape"):
        return None, None
    shape = tuple(int(d) for d in value.shape)
    return (math.prod(shape) if shape else 1), shape
