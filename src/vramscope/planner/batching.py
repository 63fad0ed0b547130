"""Split a batch into micro-batches and accumulation steps: pure arithmetic that the tuner and the OOM advice share."""

from __future__ import annotations

import math


def split_batch(target: int, max_micro: int) -> tuple[int, int]:
    """``(micro_batch, grad_accum_steps)`` reaching ``target`` with micro-batches of at most ``max_micro``.

    Prefers an exact split (``micro * steps == target``) with at most twice the minimum number of
    accumulation steps; otherwise the minimum steps, with ``micro * steps`` slightly above ``target``.
    """
    if target < 1 or max_micro < 1:
        raise ValueError("target and max_micro must be positive")
    fewest = math.ceil(target / max_micro)
    for steps in range(fewest, 2 * fewest + 1):
        if target % steps == 0:
            return target // steps, steps
    return math.ceil(target / fewest), fewest
