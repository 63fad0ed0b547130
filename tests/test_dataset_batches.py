"""The longest batch the collator can form, from real files tokenized with a real tokenizer: padded to the longest
of a batch (random order and group_by_length), packing, padding-free, pad_to_multiple_of, a long-tail dataset, and
a dataset too large to tokenize whole (sampled, with its longest rows still found)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dataset_tokenizer import make_tokenizer, words
from vramscope.dataset import DatasetError, dataset_plan_input
from vramscope.dataset.batches import histogram, typical_epoch_peak


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer"))


LONG = {17: 900, 333: 700, 640: 650}  # row -> words: a few long examples in a sea of short ones


@pytest.fixture(scope="module")
def long_tail(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 rows of 20-59 words, and three of 650-900: tokens = words + 2 (BOS, EOS)."""
    path = tmp_path_factory.mktemp("data") / "long_tail.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1000):
            f.write(json.dumps({"text": words(LONG.get(i, 20 + i % 40), i)}) + "\n")
    return str(path)


def test_padded_batches_peak_at_batch_x_the_longest_example(tok: str, long_tail: str) -> None:
    d = dataset_plan_input(long_tail, tok, batch=4, max_length=4096)
    assert (d.examples, d.longest_tokens, d.truncated_examples) == (1000, 902, 0)
    assert (d.peak_batch_rows, d.peak_batch_seq, d.peak_batch_tokens) == (4, 902, 4 * 902)
    assert d.peak_batch_real_tokens == 902 + 702 + 652 + 61  # the 4 longest examples together
    assert d.longest[:3] == ((17, 902), (333, 702), (640, 652))
    assert d.p50_tokens < 60 and d.p99_tokens == 61
    assert d.batching == "padded" and d.typical_epoch_peak_tokens is None  # certain every epoch
    assert sum(d.histogram.counts) == 1000


def test_truncation_caps_the_peak_and_counts_what_it_cut(tok: str, long_tail: str) -> None:
    d = dataset_plan_input(long_tail, tok, batch=4, max_length=512)
    assert (d.longest_tokens, d.longest_untruncated_tokens, d.truncated_examples) == (512, 902, 3)
    assert (d.peak_batch_rows, d.peak_batch_seq) == (4, 512)


def test_group_by_length_has_the_same_padded_peak(tok: str, long_tail: str) -> None:
    d = dataset_plan_input(long_tail, tok, batch=4, max_length=4096, group_by_length=True)
    assert d.batching == "grouped" and (d.peak_batch_rows, d.peak_batch_seq) == (4, 902)


def test_pad_to_multiple_of_rounds_the_padded_length(tok: str, long_tail: str) -> None:
    d = dataset_plan_input(long_tail, tok, batch=4, max_length=4096, pad_to_multiple_of=64)
    assert d.peak_batch_seq == 960


def test_packing_makes_the_batch_b_x_max_length(tok: str, long_tail: str) -> None:
    wrapped = dataset_plan_input(long_tail, tok, batch=4, max_length=256, packing=True, packing_strategy="wrapped")
    assert (wrapped.batching, wrapped.peak_batch_rows, wrapped.peak_batch_seq) == ("packed", 4, 256)
    bfd = dataset_plan_input(long_tail, tok, batch=4, max_length=256, packing=True)  # TRL's default: padding-free
    assert (bfd.peak_batch_rows, bfd.peak_batch_seq, bfd.peak_batch_tokens) == (1, 1024, 1024)
    assert bfd.truncated_examples == 3 and "exactly" in " ".join(bfd.notes)  # best-fit cuts what exceeds a row
    with pytest.raises(DatasetError, match="packing needs a max_length"):
        dataset_plan_input(long_tail, tok, batch=4, packing=True)


def test_padding_free_is_one_row_of_the_longest_examples_and_says_how_rare(tok: str, long_tail: str) -> None:
    d = dataset_plan_input(long_tail, tok, batch=4, padding_free=True)
    assert (d.batching, d.peak_batch_rows, d.peak_batch_seq) == ("padding_free", 1, 902 + 702 + 652 + 61)
    assert d.typical_epoch_peak_tokens is not None
    # In random order the three long examples rarely share a batch: an epoch's largest is one long + 3 short.
    assert 902 + 3 * 22 <= d.typical_epoch_peak_tokens < 902 + 702


def test_a_long_tail_dataset_plans_at_its_longest_batch_not_at_max_length(tok: str, long_tail: str) -> None:
    from vramscope.planner import plan

    d = dataset_plan_input(long_tail, tok, batch=8, max_length=4096)
    at_data = plan("Llama-2-7B", d.peak_batch_rows, d.peak_batch_seq)
    at_max = plan("Llama-2-7B", 8, 4096)
    assert (at_data.batch_size, at_data.seq_len) == (8, 902)
    assert at_data.peak_allocated_bytes < at_max.peak_allocated_bytes


def test_a_huge_dataset_is_sampled_and_its_longest_rows_are_still_found(tok: str, tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(5000):
            f.write(json.dumps({"text": words(300 if i == 4321 else 5 + i % 10)}) + "\n")
    d = dataset_plan_input(str(path), tok, batch=2, sample_rows=500)
    assert d.sampled and d.examples == 5000 and 500 < d.tokenized < 5000
    assert d.longest[0] == (4321, 302) and d.peak_batch_seq == 302
    assert sum(d.histogram.counts) == 500 and any("sampled" in n for n in d.notes)


def test_histogram_bins_are_powers_of_two_and_hold_every_example() -> None:
    h = histogram(np.array([1, 15, 16, 31, 500, 5000]))
    assert h.edges[0] == 0 and h.edges[-1] == 8192 and len(h.counts) == len(h.edges) - 1 <= 12
    assert sum(h.counts) == 6 and h.counts[0] == 2


def test_the_typical_epoch_peak_of_equal_lengths_is_the_worst() -> None:
    assert typical_epoch_peak(np.full(100, 10), 4) == 40
