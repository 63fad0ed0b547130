"""From tokens per example to the longest batch the collator can form, and the length distribution.

Padding to the longest of a batch (``DataCollatorWithPadding``, ``DataCollatorForSeq2Seq``, TRL's collators):
the batch that holds the longest example is padded to it, whatever the order, so ``b x longest`` is met every
epoch (random sampling and ``group_by_length`` alike). Padding-free: one row of the batch's real tokens; the worst
is the ``b`` longest examples together, which random order rarely forms (:func:`typical_epoch_peak` says how
large an epoch's largest batch usually is) and ``group_by_length`` forms on purpose. Packing: rows of
``max_length`` tokens, so ``b x max_length`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vramscope.dataset.types import Batching, Histogram

SHUFFLES = 20  # simulated epochs for the typical padding-free peak: 20 x a few ms at 100k examples
MAX_BINS = 12


@dataclass(frozen=True)
class PeakBatch:
    rows: int
    seq: int
    tokens: int  # rows x seq, padding included
    real_tokens: int
    typical_epoch_tokens: int | None
    note: str


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple or multiple <= 1 else -(-n // multiple) * multiple


def peak_batch(lengths: np.ndarray, batch: int, batching: Batching, max_length: int | None,
               pad_to_multiple_of: int | None = None, pairs: bool = False, one_row: bool = False,
               seed: int = 0) -> PeakBatch:
    """The longest batch the collator can form at ``batch`` examples per device.

    Args:
        lengths: tokens per example after truncation; shape (n, 2) for DPO pairs (prompt+chosen, prompt+rejected).
        batch: examples per device batch (DPO: pairs; the model then gets 2 x batch rows).
        batching: how the collator forms a batch (:data:`Batching`).
        max_length: the packing row length (``packed``).
        pad_to_multiple_of: the collator's ``pad_to_multiple_of``.
        pairs: DPO: chosen and rejected rows stacked, all padded to the longest of the 2b.
        one_row: packed rows handed over padding-free (TRL's best-fit packing): one row of the batch's tokens.
        seed: the shuffles' seed for the typical padding-free peak.
    """
    n = int(lengths.shape[0])
    b = min(batch, n)
    if pairs:
        longest_of_pair = lengths.max(axis=1)
        top = np.argsort(longest_of_pair, kind="stable")[::-1][:b]
        seq = _round_up(int(longest_of_pair[top[0]]), pad_to_multiple_of)
        return PeakBatch(2 * b, seq, 2 * b * seq, int(lengths[top].sum()), None,
                         f"{b} pairs: chosen and rejected stacked, {2 * b} rows padded to the longest of them")
    flat = np.sort(lengths)[::-1]
    worst_real = int(flat[:b].sum())
    if batching == "packed":
        assert max_length is not None
        total = int(lengths.sum())
        rows = max(1, min(b, -(-total // max_length)))
        tokens = min(rows * max_length, total)
        if one_row:
            return PeakBatch(1, tokens, tokens, tokens, None,
                             f"packed (best-fit, padding-free): rows of {max_length} tokens, a batch of {rows} of "
                             f"them handed over as one row of {rows} x {max_length} tokens exactly")
        return PeakBatch(rows, max_length, rows * max_length, tokens, None,
                         f"packed: examples concatenated into rows of {max_length} tokens, so the batch is "
                         f"{rows} x {max_length} exactly")
    if batching == "padding_free":
        typical = typical_epoch_peak(lengths, b, seed) if b > 1 else None
        return PeakBatch(1, worst_real, worst_real, worst_real, typical,
                         f"padding-free: the batch is one row of its examples' tokens; the worst is the {b} longest "
                         "examples together")
    seq = _round_up(int(flat[0]), pad_to_multiple_of)
    order = ("group_by_length: batches of similar length, the longest batch is the "
             f"{b} longest examples together" if batching == "grouped" else
             "random order: the batch that holds the longest example is padded to it every epoch")
    return PeakBatch(b, seq, b * seq, worst_real, None, f"padded to the longest of the batch; {order}")


def typical_epoch_peak(lengths: np.ndarray, batch: int, seed: int = 0, shuffles: int = SHUFFLES) -> int:
    """The median, over ``shuffles`` random epochs, of the largest batch's real tokens (random sampling)."""
    rng = np.random.default_rng(seed)
    n = int(lengths.shape[0])
    pad = (-n) % batch
    peaks = []
    for _ in range(shuffles):
        order = np.concatenate([lengths[rng.permutation(n)], np.zeros(pad, dtype=lengths.dtype)])
        peaks.append(int(order.reshape(-1, batch).sum(axis=1).max()))
    return int(np.median(peaks))


def histogram(lengths: np.ndarray) -> Histogram:
    """Examples per power-of-two length bin (at most :data:`MAX_BINS`), the first bin from 0."""
    top = int(lengths.max()) if lengths.size else 0
    high = 16
    while high <= top:
        high *= 2
    edges = [high]
    while len(edges) < MAX_BINS and edges[-1] > 16:
        edges.append(edges[-1] // 2)
    edges = sorted([0, *edges])
    counts, _ = np.histogram(lengths, bins=edges)
    return Histogram(tuple(int(e) for e in edges), tuple(int(c) for c in counts))


def percentile(lengths: np.ndarray, q: float) -> int:
    return int(np.percentile(lengths, q, method="higher")) if lengths.size else 0
