"""qlora.py's own data pipeline (artidoro/qlora): a local file's rows become ``input``/``output`` by
``--dataset_format``, and its collator cuts the two apart: ``bos + input`` at ``--source_max_len``, ``output + eos``
at ``--target_max_len`` (both tokenized without special tokens, then joined). A row is at most the sum of the two.

Read from qlora.py's ``make_data_module``, ``DataCollatorForCausalLM`` and ``extract_alpaca_dataset``
(artidoro/qlora at 00e5ad2); only the lengths are reproduced here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vramscope.dataset.readers import Rows
from vramscope.dataset.tokenizer import RunTokenizer
from vramscope.dataset.types import DatasetError

# What each --dataset_format takes from a row (qlora.py's format_dataset); a local file defaults to input-output.
FORMATS = ("input-output", "alpaca", "alpaca-clean", "self-instruct", "oasst1", "hh-rlhf", "chip2")

# The Alpaca prompt qlora.py wraps an instruction in (ALPACA_PROMPT_DICT, the Stanford Alpaca prompt), as data: its
# words are tokens of every source, so they count.
_ALPACA_WITH_INPUT = ("Below is an instruction that describes a task, paired with an input that provides further "
                      "context. Write a response that appropriately completes the request.\n\n"
                      "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response: ")
_ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                    "the request.\n\n### Instruction:\n{instruction}\n\n### Response: ")
_CHIP2_BOT = "\n<bot>: "


@dataclass(frozen=True)
class QloraCut:
    """How qlora.py cuts a row: its ``--dataset_format`` and the two lengths."""

    dataset_format: str | None
    source_max_len: int
    target_max_len: int

    @property
    def format(self) -> str:
        return self.dataset_format or "input-output"


def columns_for(cut: QloraCut, columns: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The columns qlora.py reads under ``cut``'s format, or a one-line :class:`DatasetError`."""
    fmt = cut.format
    if fmt not in FORMATS:
        raise DatasetError(f"qlora.py --dataset_format {fmt}: not one of {', '.join(FORMATS)}")
    needed = {"input-output": ("input", "output"), "alpaca": ("instruction", "output"),
              "alpaca-clean": ("instruction", "output"), "self-instruct": ("prompt", "completion"),
              "oasst1": ("text",), "hh-rlhf": ("chosen",), "chip2": ("text",)}[fmt]
    missing = [c for c in needed if c not in columns]
    if missing:
        raise DatasetError(f"qlora.py --dataset_format {fmt} reads {' and '.join(needed)}; the dataset has "
                           f"{', '.join(columns)} (set the command's --dataset_format, or pass --dataset-field NAME "
                           "before '--' to tokenize one column)")
    if fmt in ("alpaca", "alpaca-clean") and "input" in columns:
        return ("instruction", "input", "output")
    return needed


def source_target(rows: Rows, cut: QloraCut, fields: tuple[str, ...], tokenizer: RunTokenizer,
                  picked: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``bos + input`` and of ``output + eos`` per row, before qlora.py's two cuts."""
    fmt = cut.format
    values = {f: [_text(v) for v in rows.values(f, picked)] for f in fields}
    if fmt == "input-output":
        sources, targets = values["input"], values["output"]
    elif fmt in ("alpaca", "alpaca-clean"):
        inputs = values.get("input") or [""] * len(values["instruction"])
        sources = [(_ALPACA_WITH_INPUT if i else _ALPACA_NO_INPUT).format(instruction=ins, input=i)
                   for ins, i in zip(values["instruction"], inputs, strict=True)]
        targets = values["output"]
    elif fmt == "self-instruct":
        sources, targets = values["prompt"], values["completion"]
    elif fmt == "hh-rlhf":
        sources, targets = [""] * len(values["chosen"]), values["chosen"]
    elif fmt == "oasst1":
        sources, targets = [""] * len(values["text"]), values["text"]
    else:  # chip2: "<human>: question\n<bot>: answer"
        halves = [t.split(_CHIP2_BOT) for t in values["text"]]
        sources = [h[0].replace("<human>: ", "") for h in halves]
        targets = [h[1] if len(h) > 1 else "" for h in halves]
    bos = tokenizer.special.get("bos_token", "")
    eos = tokenizer.eos_token or ""
    source = tokenizer.lengths([bos + s for s in sources], add_special_tokens=False)
    target = tokenizer.lengths([t + eos for t in targets], add_special_tokens=False)
    return source, target


def _text(value: object) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)
