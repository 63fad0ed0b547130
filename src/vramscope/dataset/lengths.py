"""``dataset_plan_input``: read the user's dataset, tokenize it as the trainer does, and find the longest batch.

The one entry point for ``plan --dataset`` and, later, ``plan -- <command>`` (the command names the dataset).
"""

from __future__ import annotations

import time

import numpy as np

from vramscope.dataset.batches import histogram, peak_batch, percentile
from vramscope.dataset.encode import Layout, layout_of, lengths
from vramscope.dataset.files import locate
from vramscope.dataset.qlora import QloraCut, columns_for, source_target
from vramscope.dataset.readers import Rows, read_rows
from vramscope.dataset.tokenizer import RunTokenizer, find_tokenizer
from vramscope.dataset.types import Batching, DatasetError, DatasetLengths
from vramscope.trainers import TOKENIZATIONS

SAMPLE_ROWS = 200_000  # above this, a random sample plus the longest rows by characters is tokenized
TAIL_ROWS = 2_000  # the longest rows by characters, always tokenized: the longest batch is made of them
LONGEST_SHOWN = 5


def dataset_plan_input(
    path: str,
    tokenizer_dir: str | None = None,
    field: str | None = None,
    trainer: str | None = None,
    max_length: int | None = None,
    packing: bool = False,
    padding_free: bool = False,
    batch: int = 1,
    group_by_length: bool = False,
    *,
    split: str | None = None,
    model: str | None = None,
    pad_to_multiple_of: int | None = None,
    packing_strategy: str = "bfd",
    sample_rows: int = SAMPLE_ROWS,
    seed: int = 0,
    qlora: QloraCut | None = None,
) -> DatasetLengths:
    """The user's dataset as its trainer tokenizes and batches it: the lengths, and the longest batch.

    Args:
        path: a data file (JSON lines, JSON, CSV, parquet, arrow), a folder of them, a ``save_to_disk`` folder,
            or a hub dataset id already in the local Hugging Face cache (nothing is downloaded).
        tokenizer_dir: the run's tokenizer: a folder (a tokenizer's or the model's), a tokenizer.json, or a hub
            model id in the local hub cache. Not needed for a dataset of ``input_ids``.
        field: the column to tokenize, when it is not ``text``/``messages``/``prompt``+``completion``.
        trainer: ``sft`` (TRL's SFTTrainer; also ``trl``), ``hf`` (HF Trainer), ``dpo``, ``grpo``, or None to
            read it from the columns (chosen/rejected: dpo; a prompt alone: grpo; else sft).
        max_length: truncation (TRL's ``max_length``, the tokenizer's ``max_length``); the packing row length.
        packing: TRL's ``packing`` (rows of max_length tokens).
        padding_free: TRL's ``padding_free`` (a batch is one row of its real tokens).
        batch: the per-device batch (DPO: pairs).
        group_by_length: the HF Trainer's ``group_by_length``.
        split: the split (or file) to read when a folder has several.
        model: where to look for the tokenizer when ``tokenizer_dir`` is None: the model's folder, its config.json,
            or its hub id (the local hub cache).
        pad_to_multiple_of: the collator's ``pad_to_multiple_of``.
        packing_strategy: TRL's ``packing_strategy``: ``bfd`` (the default) and ``bfd_split`` hand packed rows
            over padding-free; ``wrapped`` as padded rows.
        sample_rows: tokenize at most this many random rows (plus the longest by characters).
        seed: for the sample and the simulated epochs.
        qlora: qlora.py's collator (its ``--dataset_format``, ``--source_max_len`` and ``--target_max_len``): the
            input and the output are cut apart, and ``max_length`` is their sum.

    Raises:
        DatasetError: a one-line reason it cannot be read or tokenized (the plan then falls back to b x max_length).
    """
    started = time.perf_counter()
    wanted = _trainer(trainer)
    if batch < 1:
        raise DatasetError(f"batch must be at least 1, got {batch}")
    if packing and max_length is None:
        raise DatasetError("packing needs a max_length (the row length): pass --seq-len")
    located = locate(path, split)
    rows = read_rows(located.files)
    if rows.num_rows == 0:
        raise DatasetError(f"{path}: the dataset has no rows")
    if qlora is not None:
        layout = Layout("hf", columns_for(qlora, list(rows.columns)), "qlora")
        max_length = qlora.source_max_len + qlora.target_max_len
    else:
        layout = layout_of(rows.columns, wanted, field, rows.first())
    notes: list[str] = []
    if located.note:
        notes.append(located.note)
    tokenizer = None
    if layout.kind not in ("ids", "dpo_ids"):
        folder = find_tokenizer(tokenizer_dir) if tokenizer_dir else find_tokenizer(model)
        if folder is None:
            if tokenizer_dir:
                raise DatasetError(f"{tokenizer_dir}: not a tokenizer folder (no tokenizer.json), nor a model in the "
                                   "local hub cache: pass --tokenizer DIR")
            where = f" (none with the model {model})" if model else ""
            raise DatasetError(f"the dataset's {'+'.join(layout.fields)} must be tokenized, and no tokenizer was "
                               f"found{where}: pass --tokenizer DIR (a folder with tokenizer.json)")
        tokenizer = RunTokenizer(folder)
    picked, sample, sampled = _pick(rows, layout, sample_rows, seed)
    reading = layout.tokenization
    truncate = max_length is not None and not reading.prompts  # a prompt's completion is generated, not cut
    if qlora is not None and tokenizer is not None:
        source, target = source_target(rows, qlora, layout.fields, tokenizer, picked)
        raw = source + target
        cut = np.minimum(source, qlora.source_max_len) + np.minimum(target, qlora.target_max_len)
        truncated = int(((source > qlora.source_max_len) | (target > qlora.target_max_len)).sum())
    else:
        raw = lengths(rows, layout, tokenizer, picked)
        # Packing cuts too: best-fit packing truncates an example longer than a row, the other strategies split it.
        cut = np.minimum(raw, max_length) if truncate and max_length is not None else raw
        longest_raw = raw.max(axis=1) if raw.ndim == 2 else raw
        truncated = int((longest_raw > max_length).sum()) if truncate and max_length is not None else 0
    per_example = cut.max(axis=1) if cut.ndim == 2 else cut
    untruncated = raw.max(axis=1) if raw.ndim == 2 else raw
    batching = _batching(layout, packing, padding_free, group_by_length, notes)
    if batching == "padding_free" and truncate and reading.trl:
        notes.append(f"TRL 1.16 refuses padding_free without packing when max_length is set (it would not "
                     f"truncate); the lengths here are cut at {max_length}, as a pre-truncated dataset would be")
    one_row = packing and (padding_free or packing_strategy in ("bfd", "bfd_split"))
    peak = peak_batch(cut, batch, batching, max_length, pad_to_multiple_of, pairs=cut.ndim == 2, one_row=one_row,
                      seed=seed)
    notes.append(peak.note)
    index = picked if picked is not None else np.arange(rows.num_rows)
    # Ranked by the length before truncation, so that the longest examples are named even where truncation
    # ties them at max_length; ties: the first row first.
    order = np.argsort(-untruncated, kind="stable")[:LONGEST_SHOWN]
    dist = per_example[sample] if sample is not None else per_example
    if sampled:
        notes.append(f"sampled: {len(dist):,} random rows of {rows.num_rows:,} for the distribution, plus the "
                     f"{min(TAIL_ROWS, rows.num_rows):,} longest by characters for the longest batch")
    if reading.prompts:
        notes.append("GRPO: the prompts only; each is followed by up to max_completion_length generated tokens")
    return DatasetLengths(
        source=located.source, files=tuple(str(f) for f in located.files), trainer=layout.trainer,
        fields=layout.fields, label=_label(layout, qlora), steps=_steps(layout, tokenizer, max_length if truncate
                                                                                else None, qlora),
        examples=rows.num_rows,
        sampled=sampled, tokenized=int(per_example.shape[0]), max_length=max_length if truncate else None,
        longest_tokens=int(per_example.max()), p50_tokens=percentile(dist, 50), p99_tokens=percentile(dist, 99),
        longest_untruncated_tokens=int(untruncated.max()), truncated_examples=truncated, batch_size=batch,
        batching=batching, peak_batch_rows=peak.rows, peak_batch_seq=peak.seq, peak_batch_tokens=peak.tokens,
        peak_batch_real_tokens=peak.real_tokens, typical_epoch_peak_tokens=peak.typical_epoch_tokens,
        longest=tuple((int(index[i]), int(untruncated[i])) for i in order), histogram=histogram(dist),
        notes=tuple(notes), seconds=time.perf_counter() - started, cut_apart=qlora is not None,
    )


def _trainer(name: str | None) -> str | None:
    if name is None:
        return None
    # a framework's name becomes its trainer's word where the plan asks (Framework.dataset_trainer)
    if name not in TOKENIZATIONS:
        raise DatasetError(f"unknown trainer {name!r}; choose one of {', '.join(TOKENIZATIONS)}")
    return name


def _pick(rows: Rows, layout: Layout, limit: int, seed: int) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
    """(rows to tokenize, positions of the random sample among them, sampled?): all rows when there are at most
    ``limit``; else a random ``limit`` plus the :data:`TAIL_ROWS` longest by characters."""
    n = rows.num_rows
    if n <= limit:
        return None, None, False
    rng = np.random.default_rng(seed)
    random_rows = np.sort(rng.choice(n, size=limit, replace=False))
    chars = np.zeros(n, dtype=np.int64)
    for f in layout.fields:
        chars += rows.char_lengths(f)
    tail = np.argpartition(chars, n - TAIL_ROWS)[n - TAIL_ROWS:] if n > TAIL_ROWS else np.arange(n)
    picked = np.union1d(random_rows, tail)
    return picked, np.searchsorted(picked, random_rows), True


def _batching(layout: Layout, packing: bool, padding_free: bool, group_by_length: bool, notes: list[str]) -> Batching:
    if layout.tokenization.pairs:  # each pair's two rows padded together
        if packing or padding_free:
            notes.append("TRL's DPOTrainer pads (padding_free and packing are off in TRL 1.16): planned padded")
        return "grouped" if group_by_length else "padded"
    if packing:
        return "packed"
    if padding_free:
        return "padding_free"
    return "grouped" if group_by_length else "padded"


def _label(layout: Layout, qlora: QloraCut | None) -> str:
    """Whose tokens they are: qlora.py's collator, or the trainer the layout tokenizes as."""
    return f"qlora.py (--dataset_format {qlora.format})" if qlora is not None else layout.tokenization.label


def _steps(layout: Layout, tokenizer: RunTokenizer | None, truncated_at: int | None,
           qlora: QloraCut | None) -> tuple[str, ...]:
    """How the tokens were made, a clause each (after :func:`_label`'s words)."""
    if qlora is not None:
        parts = [f"BOS + source cut at {qlora.source_max_len} and target + EOS cut at {qlora.target_max_len}, "
                 f"tokenized apart and joined (from {' + '.join(layout.fields)})"]
        if tokenizer is not None:
            parts.append(f"tokenizer {tokenizer.folder} via {tokenizer.how}")
        return tuple(parts)
    eos = " + EOS" if layout.tokenization.eos else ""
    what = {
        "ids": "input_ids used as they are",
        "dpo_ids": "prompt_ids + chosen_ids / rejected_ids used as they are",
        "text": f"{layout.fields[0]}{eos}, tokenized",
        "messages": f"{layout.fields[0]} through the chat template",
        "prompt_completion": f"prompt + completion{eos}, tokenized",
        "pairs": "prompt + chosen and prompt + rejected (+ EOS on plain text)",
        "prompts": "the prompts (with the generation prompt on conversations)",
    }[layout.kind]
    parts = [what]
    if tokenizer is not None:
        parts.append(f"tokenizer {tokenizer.folder} via {tokenizer.how}")
    if truncated_at is not None:
        parts.append(f"truncated at {truncated_at}")
    return tuple(parts)
