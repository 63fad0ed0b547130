"""What reading a user's dataset found, as typed data: the token lengths and the longest batch a collator can form.

Pure data (no pyarrow, no tokenizer): :class:`DatasetLengths` is what ``vramscope plan --dataset`` plans at and
what ``plan --json`` prints under ``"dataset"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# How the trainer turns an example into tokens is a row of vramscope.trainers.TOKENIZATIONS (``sft`` TRL's
# SFTTrainer, ``hf`` the HF Trainer after the usual tokenizer map, ``dpo`` TRL's DPOTrainer, ``grpo`` TRL's
# GRPOTrainer), named by its key here.

Batching = Literal["padded", "grouped", "packed", "padding_free"]
"""How the collator forms a batch: ``padded`` (random order, each batch padded to its longest), ``grouped``
(``group_by_length``: batches of similar length), ``packed`` (examples concatenated into rows of max_length),
``padding_free`` (the batch's examples in one row, no padding)."""


class DatasetError(Exception):
    """The dataset (or its tokenizer) cannot be read; the message is one line that says what to do."""


@dataclass(frozen=True)
class Histogram:
    """Examples per token-length bin: ``counts[i]`` examples have ``edges[i] <= tokens < edges[i + 1]``."""

    edges: tuple[int, ...]
    counts: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts)}


@dataclass(frozen=True)
class DatasetLengths:
    """The token lengths of a dataset as its trainer sees them, and the longest batch its collator can form.

    Attributes:
        source: the file or folder that was read (a hub id resolves to its cached files).
        files: the data files read.
        trainer: how examples were tokenized (a key of :data:`vramscope.trainers.TOKENIZATIONS`).
        fields: the columns tokenized (``text``; ``messages``; ``prompt``+``completion``; ``input_ids``...).
        label: whose tokens they are, in words: the trainer's ("TRL SFT", "TRL reward" for a reward run reading
            DPO's pairs) or qlora.py's collator; the first words of :attr:`how`.
        steps: how the tokens were made, a clause each (EOS, chat template, input_ids used as they are, the
            tokenizer, the truncation); the rest of :attr:`how`.
        cut_apart: qlora.py's collator cut the source and the target apart, each at its own length
            (``max_length`` is their sum); else ``max_length`` cut the example whole.
        examples: rows in the dataset (all of them, also when only a sample was tokenized).
        sampled: only a sample was tokenized (a huge dataset); ``tokenized`` says how many rows.
        tokenized: rows whose tokens were counted.
        max_length: the truncation length (None: no truncation).
        longest_tokens, p50_tokens, p99_tokens: per example, after truncation (DPO: the longer of a pair).
        longest_untruncated_tokens: the longest example before truncation.
        truncated_examples: examples longer than ``max_length`` (counted in the tokenized rows).
        batch_size: the per-device batch the peak is formed at.
        batching: how the collator forms a batch (:data:`Batching`).
        peak_batch_rows, peak_batch_seq: the shape of the longest batch as the model gets it (rows x padded
            length; a padding-free batch is one row of its real tokens); the plan is made at this shape.
        peak_batch_tokens: rows x seq, padding included: what the step computes on.
        peak_batch_real_tokens: the tokens of the examples in it, padding left out.
        typical_epoch_peak_tokens: padding-free in random order: the median, over simulated shuffles, of an
            epoch's largest batch (the worst batch is rarely formed); None where the worst batch is certain.
        longest: the longest examples, ``(row index, tokens before truncation)``, longest first.
        histogram: examples per length bin.
        notes: what was assumed, a sentence each.
        seconds: the time taken to read and tokenize.
    """

    source: str
    files: tuple[str, ...]
    trainer: str
    fields: tuple[str, ...]
    label: str
    steps: tuple[str, ...]
    examples: int
    sampled: bool
    tokenized: int
    max_length: int | None
    longest_tokens: int
    p50_tokens: int
    p99_tokens: int
    longest_untruncated_tokens: int
    truncated_examples: int
    batch_size: int
    batching: Batching
    peak_batch_rows: int
    peak_batch_seq: int
    peak_batch_tokens: int
    peak_batch_real_tokens: int
    typical_epoch_peak_tokens: int | None
    longest: tuple[tuple[int, int], ...]
    histogram: Histogram
    notes: tuple[str, ...] = field(default=())
    seconds: float = 0.0
    cut_apart: bool = False

    @property
    def how(self) -> str:
        """How the tokens were made, in words: the label, then each step."""
        return "; ".join((self.label, *self.steps))

    def to_json(self) -> dict[str, Any]:
        """The reading as JSON-ready data (``vramscope plan --json``'s ``"dataset"`` object)."""
        return {
            "source": self.source,
            "files": list(self.files),
            "trainer": self.trainer,
            "fields": list(self.fields),
            "how": self.how,
            "examples": self.examples,
            "sampled": self.sampled,
            "tokenized": self.tokenized,
            "max_length": self.max_length,
            "longest_tokens": self.longest_tokens,
            "p50_tokens": self.p50_tokens,
            "p99_tokens": self.p99_tokens,
            "longest_untruncated_tokens": self.longest_untruncated_tokens,
            "truncated_examples": self.truncated_examples,
            "batch_size": self.batch_size,
            "batching": self.batching,
            "peak_batch_rows": self.peak_batch_rows,
            "peak_batch_seq": self.peak_batch_seq,
            "peak_batch_tokens": self.peak_batch_tokens,
            "peak_batch_real_tokens": self.peak_batch_real_tokens,
            "typical_epoch_peak_tokens": self.typical_epoch_peak_tokens,
            "longest": [{"index": i, "tokens": t} for i, t in self.longest],
            "histogram": self.histogram.to_json(),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }
