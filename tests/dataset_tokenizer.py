"""A real tokenizer for the dataset tests: a word-level vocabulary built with ``tokenizers``, a BOS added by its
post-processor (as Llama's is), turn tokens as added special tokens, and a chat template in tokenizer_config.json.
A word outside the vocabulary is one ``<unk>`` token, so a text of n words is n tokens (+ BOS)."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [f"w{i}" for i in range(200)] + ["hello", "world", "the", "sky", "is", "blue", "what", "color"]
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(folder: Path, chat_template: str | None = CHAT_TEMPLATE, bos: bool = True) -> Path:
    """Write tokenizer.json and tokenizer_config.json into ``folder``; returns it."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", vocab["<s>"])])
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "<s>", "eos_token": "</s>",
                                 "unk_token": "<unk>", "pad_token": "<pad>",
                                 "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 100000}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def words(n: int, start: int = 0) -> str:
    """A text of ``n`` vocabulary words: n tokens, n + 1 with the BOS."""
    return " ".join(WORDS[(start + i) % 200] for i in range(n))
