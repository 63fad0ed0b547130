"""``plan --dataset PATH``: the plan made at the longest batch of the user's own data (vramscope.dataset), and the
length distribution it found, for a terminal."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from vramscope.trainers import TOKENIZATIONS, TRAINERS

if TYPE_CHECKING:  # the dataset reading imports numpy: only when --dataset is given, not to build the parser
    from vramscope.dataset import DatasetLengths

BAR = 24  # characters of the longest histogram bar


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("the user's data (plan at the longest batch the collator can form)")
    g.add_argument("--dataset", metavar="PATH",
                   help="a local dataset (JSON lines, JSON, CSV, parquet, a save_to_disk or datasets folder), or a "
                        "hub id already in the local HF cache; --seq-len is then the truncation (max_length)")
    g.add_argument("--tokenizer", metavar="DIR", help="the run's tokenizer folder (default: the model's, if local "
                                                       "or in the hub cache)")
    g.add_argument("--dataset-field", metavar="NAME", help="the column to tokenize (default: text, messages, "
                                                            "prompt+completion, chosen+rejected or input_ids)")
    g.add_argument("--dataset-split", metavar="NAME", help="the split, or a file of the folder (default train)")
    g.add_argument("--packing", action="store_true", help="TRL packing: rows of --seq-len tokens")
    g.add_argument("--padding-free", action="store_true", help="TRL padding_free: a batch is one row of its tokens")
    g.add_argument("--group-by-length", action="store_true", help="HF Trainer group_by_length")


def read_dataset(args: argparse.Namespace, run_trainer: str | None = None
                 ) -> tuple[DatasetLengths | None, str | None]:
    """(the dataset's lengths, None), or (None, the one line saying why it could not be read).

    ``run_trainer`` is the run's trainer (``--trainer``, or the pasted command's): DPO and reward models read
    chosen/rejected pairs, GRPO its prompts; the rest (SFT, KTO) tokenize as the framework's trainer does."""
    from vramscope.dataset import DatasetError, dataset_plan_input
    from vramscope.dataset.qlora import QloraCut
    from vramscope.planner.frameworks import framework_named

    model = args.config if getattr(args, "config", None) else getattr(args, "model", None)
    try:
        # qlora.py's two cuts, from its command (cli/command.apply_dataset), unless --dataset-field names a column
        qlora = None if args.dataset_field else getattr(args, "dataset_qlora", None)
        named = TRAINERS[run_trainer].dataset if run_trainer is not None else None
        trainer = named or framework_named(args.framework).dataset_trainer
        data = dataset_plan_input(args.dataset, args.tokenizer, args.dataset_field, trainer,
                                  args.seq_len, args.packing, args.padding_free, args.batch_size,
                                  args.group_by_length, split=args.dataset_split, model=model,
                                  qlora=QloraCut(*qlora) if qlora else None,
                                  pad_to_multiple_of=getattr(args, "dataset_pad_to_multiple_of", None))
    except DatasetError as exc:
        return None, str(exc)
    return _named_for(data, run_trainer), None


def _named_for(data: DatasetLengths, run_trainer: str | None) -> DatasetLengths:
    """The reading's first words name the run's trainer: a reward run reads its pairs as DPO does, and a KTO run
    its prompt + completion as SFT does, but they are not DPO or SFT runs."""
    label = TRAINERS[run_trainer].label if run_trainer is not None else None
    # qlora.py's collator keeps its own name, and a reading of prompts alone is GRPO's whatever the run
    if label is None or data.cut_apart or TOKENIZATIONS[data.trainer].prompts:
        return data
    return dataclasses.replace(data, label=label)


def fallback_line(args: argparse.Namespace, why: str) -> str:
    return (f"dataset: cannot read it: {why}; planned at batch x max_length ({args.batch_size} x {args.seq_len}) "
            "instead")


def format_dataset(d: DatasetLengths) -> str:
    """The distribution (a small histogram), the longest examples and the longest batch, for a terminal."""
    sample = f" (tokenized {d.tokenized:,}: sampled)" if d.sampled else ""
    where = "cut at the source's or the target's length" if d.cut_apart else f"truncated at {d.max_length}"
    truncated = (f"; {d.truncated_examples:,} {where} (the longest was {d.longest_untruncated_tokens:,})"
                 if d.truncated_examples else "")
    lines = [
        f"dataset {d.source}: {d.examples:,} examples{sample}",
        f"  {d.how}",
        f"  tokens per example: p50 {d.p50_tokens:,}, p99 {d.p99_tokens:,}, longest {d.longest_tokens:,}{truncated}",
    ]
    counts = d.histogram.counts
    shown = [i for i, c in enumerate(counts) if c]
    top = max(counts) if counts else 0
    if shown:
        width = len(f"{d.histogram.edges[-1] - 1:,}")
        for i in range(shown[0], shown[-1] + 1):
            low, high = d.histogram.edges[i], d.histogram.edges[i + 1] - 1
            bar = "█" * max(1 if counts[i] else 0, round(BAR * counts[i] / top)) if top else ""
            lines.append(f"    {low:>{width},} - {high:>{width},}  {bar:<{BAR}} {counts[i]:,}")
    cut = d.max_length

    def named(i: int, t: int) -> str:
        return f"#{i}: {t:,}" + (f" (cut to {cut:,})" if cut is not None and t > cut else "")

    lines.append("  longest examples (row: tokens): " + ", ".join(named(i, t) for i, t in d.longest))
    real = f" ({d.peak_batch_real_tokens:,} of them real)" if d.peak_batch_real_tokens != d.peak_batch_tokens else ""
    lines.append(f"  longest batch: {d.peak_batch_rows} x {d.peak_batch_seq:,} = {d.peak_batch_tokens:,} tokens{real}")
    if d.typical_epoch_peak_tokens is not None:
        lines.append(f"  in random order an epoch's largest batch is usually {d.typical_epoch_peak_tokens:,} tokens "
                     f"(median of simulated epochs); the plan is for the worst, {d.peak_batch_real_tokens:,}")
    lines += [f"  note: {n}" for n in d.notes]
    lines.append(f"  the plan below is made at that batch ({d.peak_batch_rows} x {d.peak_batch_seq}), the longest "
                 "the collator can form")
    return "\n".join(lines)
