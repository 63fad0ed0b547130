"""Split a batch into micro-batches and accumulation steps: pure arithmetic that the tuner, the OOM advice and the
planner share."""

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


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (1 at least), by trial division up to sqrt(n).

    A divisor pairs with its cofactor, so sqrt(n) steps find them all: a batch of 10**12 takes 10**6 steps,
    where trying every d up to the limit took hours.
    """
    best = 1
    d = 1
    while d * d <= n:
        if n % d == 0:
            for candidate in (d, n // d):
                if best < candidate <= limit:
                    best = candidate
        d += 1
    return best
