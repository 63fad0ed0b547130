"""An example's tokens as its trainer makes them (TRL 1.16's SFT, DPO and GRPO preparation; the HF Trainer after
the usual ``tokenizer(text)`` map). Only lengths are kept: memory depends on shapes, not on token values.

TRL SFT (``SFTTrainer._prepare_dataset``): a plain ``text`` gets ``eos_token`` appended unless it ends with it, then
``tokenizer(text)`` (special tokens, e.g. BOS, added); ``messages`` go through the chat template and are tokenized
with no special tokens added (the template writes them); ``prompt``/``completion`` are tokenized together (EOS
appended to the completion when plain text). DPO: ``prompt+chosen`` and ``prompt+rejected`` (EOS on plain text).
GRPO: the prompt alone (the generation prompt added to a conversation). A column of token ids is used as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vramscope.dataset.readers import Rows
from vramscope.dataset.tokenizer import RunTokenizer
from vramscope.dataset.types import DatasetError
from vramscope.trainers import (
    DEFAULT_TOKENIZATION,
    PAIRS_TOKENIZATION,
    PROMPTS_TOKENIZATION,
    TOKENIZATIONS,
    Tokenization,
)

ID_COLUMNS = ("input_ids",)
DPO_ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


@dataclass(frozen=True)
class Layout:
    """Which columns hold the examples, and how they are tokenized."""

    trainer: str  # a key of vramscope.trainers.TOKENIZATIONS
    fields: tuple[str, ...]
    kind: str  # "ids", "dpo_ids", "text", "messages", "prompt_completion", "pairs", "prompts"

    @property
    def tokenization(self) -> Tokenization:
        return TOKENIZATIONS[self.trainer]


def layout_of(columns: Sequence[str], trainer: str | None, field: str | None, first: dict[str, Any]) -> Layout:
    """The dataset's layout from its columns (and its first row, to tell text from conversations).

    The columns decide DPO (chosen/rejected) and GRPO (a prompt alone) unless ``trainer`` (a key of
    :data:`~vramscope.trainers.TOKENIZATIONS`) says which; ``sft`` or ``hf`` (None: sft) then decides how the rest
    is tokenized.
    """
    cols = set(columns)
    asked = TOKENIZATIONS[trainer] if trainer is not None else None
    asks_pairs, asks_prompts = asked is not None and asked.pairs, asked is not None and asked.prompts
    # what the rest is read as: the asked reading where it is of whole examples, else the default
    plain = asked.name if asked is not None and not (asks_pairs or asks_prompts) else DEFAULT_TOKENIZATION
    if field is not None:
        if field not in cols:
            raise DatasetError(f"no column {field!r} in the dataset; it has {', '.join(columns)}")
        value = first.get(field)
        kind = "ids" if _is_ids(value) else "messages" if _is_conversation(value) else "text"
        return Layout(plain, (field,), kind)
    pairs = {"chosen", "rejected"} <= cols
    if asks_pairs or (not asks_prompts and pairs):  # chosen/rejected: a preference dataset, for DPO
        reading = asked.name if asked is not None and asks_pairs else PAIRS_TOKENIZATION
        if set(DPO_ID_COLUMNS) <= cols:
            return Layout(reading, DPO_ID_COLUMNS, "dpo_ids")
        if not pairs:
            raise DatasetError(f"a DPO dataset needs chosen and rejected columns; it has {', '.join(columns)}")
        return Layout(reading, ("prompt", "chosen", "rejected") if "prompt" in cols else ("chosen", "rejected"),
                      "pairs")
    if "input_ids" in cols and not asks_prompts:
        return Layout(plain, ("input_ids",), "ids")
    prompts_only = "prompt" in cols and not ({"completion", "text", "messages", "conversations"} & cols)
    if asks_prompts or prompts_only:  # prompts alone: nothing to train on but generations (GRPO)
        if "prompt" not in cols:
            raise DatasetError(f"a GRPO dataset needs a prompt column; it has {', '.join(columns)}")
        return Layout(asked.name if asked is not None and asks_prompts else PROMPTS_TOKENIZATION, ("prompt",),
                      "prompts")
    for name in ("messages", "conversations"):
        if name in cols and _is_conversation(first.get(name)):
            return Layout(plain, (name,), "messages")
    if {"prompt", "completion"} <= cols:
        return Layout(plain, ("prompt", "completion"), "prompt_completion")
    if "text" in cols:
        return Layout(plain, ("text",), "text")
    raise DatasetError("no column to tokenize (text, messages, prompt+completion, chosen+rejected, prompt, "
                       f"input_ids); it has {', '.join(columns) or 'none'}: pass --dataset-field NAME")


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and (not value or isinstance(value[0], int))


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def lengths(rows: Rows, layout: Layout, tokenizer: RunTokenizer | None, picked: np.ndarray | None) -> np.ndarray:
    """Tokens per example (for ``pairs``/``dpo_ids``: shape (n, 2), prompt+chosen and prompt+rejected), before
    truncation, for the rows in ``picked`` (all when None)."""
    if layout.kind == "ids":
        return np.fromiter((len(v or ()) for v in rows.values("input_ids", picked)), dtype=np.int64)
    if layout.kind == "dpo_ids":
        p, c, r = (np.fromiter((len(v or ()) for v in rows.values(f, picked)), dtype=np.int64) for f in DPO_ID_COLUMNS)
        return np.stack([p + c, p + r], axis=1)
    if tokenizer is None:
        raise DatasetError(f"the dataset's {'+'.join(layout.fields)} must be tokenized, and no tokenizer was found: "
                           "pass --tokenizer DIR (a folder with tokenizer.json)")
    eos = tokenizer.eos_token if layout.tokenization.eos else None
    if layout.kind == "text":
        return _texts(tokenizer, [_text(v) for v in rows.values(layout.fields[0], picked)], eos)
    if layout.kind == "messages":
        return _chats(tokenizer, [_messages(v) for v in rows.values(layout.fields[0], picked)])
    if layout.kind == "prompt_completion":
        prompts, completions = rows.values("prompt", picked), rows.values("completion", picked)
        if _is_conversation(prompts[0] if prompts else None):
            return _chats(tokenizer, [_messages(p) + _messages(c) for p, c in zip(prompts, completions, strict=True)])
        joined = [_text(p) + _with_eos(_text(c), eos) for p, c in zip(prompts, completions, strict=True)]
        return _texts(tokenizer, joined, None)
    if layout.kind == "pairs":
        given: list[Any] | None = rows.values("prompt", picked) if "prompt" in layout.fields else None
        out = []
        for side in ("chosen", "rejected"):
            answers = rows.values(side, picked)
            if _is_conversation(answers[0] if answers else None):
                convs = [(_messages(given[i]) if given else []) + _messages(a) for i, a in enumerate(answers)]
                out.append(_chats(tokenizer, convs))
            else:
                out.append(_texts(tokenizer, [(_text(given[i]) if given else "") + _with_eos(_text(a), eos)
                                              for i, a in enumerate(answers)], None))
        return np.stack(out, axis=1)
    if layout.kind == "prompts":
        prompts = rows.values("prompt", picked)
        if _is_conversation(prompts[0] if prompts else None):
            return _chats(tokenizer, [_messages(p) for p in prompts], add_generation_prompt=True)
        return _texts(tokenizer, [_text(p) for p in prompts], None)
    raise AssertionError(layout.kind)


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _with_eos(text: str, eos: str | None) -> str:
    return text + eos if eos and not text.endswith(eos) else text


def _texts(tokenizer: RunTokenizer, texts: list[str], eos: str | None) -> np.ndarray:
    if eos:
        texts = [_with_eos(t, eos) for t in texts]
    return tokenizer.lengths(texts, add_special_tokens=True)


def _messages(value: Any) -> list[dict[str, Any]]:
    """A conversation as the template sees it: ShareGPT's from/value renamed role/content (as TRL does), and the
    keys a columnar file filled with null dropped (as transformers does)."""
    if not isinstance(value, list):
        raise DatasetError(f"a conversation must be a list of messages, got {type(value).__name__}")
    out = []
    for m in value:
        if not isinstance(m, dict):
            raise DatasetError(f"a message must be an object with role and content, got {type(m).__name__}")
        m = {k: v for k, v in m.items() if v is not None}
        if "from" in m and "role" not in m:
            m["role"] = m.pop("from")
        if "value" in m and "content" not in m:
            m["content"] = m.pop("value")
        out.append(m)
    return out


def _chats(tokenizer: RunTokenizer, conversations: list[list[dict[str, Any]]],
           add_generation_prompt: bool = False) -> np.ndarray:
    rendered = tokenizer.render(conversations, add_generation_prompt=add_generation_prompt)
    return tokenizer.lengths(rendered, add_special_tokens=False)  # the template wrote BOS and the turn tokens
