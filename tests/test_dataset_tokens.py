"""Tokens as the trainer makes them, with a real tokenizer (a word-level tokenizer.json with a BOS post-processor
and a chat template in tokenizer_config.json): compared with TRL 1.16's own dataset preparation (SFT and DPO) and
with transformers' tokenizer, for plain text (+ EOS), conversations, prompt/completion, DPO pairs, GRPO prompts and
a column of token ids."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dataset_tokenizer import make_tokenizer, words
from vramscope.dataset import DatasetError, dataset_plan_input
from vramscope.dataset.tokenizer import RunTokenizer


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


SIZES = (3, 10, 40, 7, 25)
TEXT_ROWS = [{"text": words(n, n)} for n in SIZES]
CHAT_ROWS = [{"messages": [{"role": "system", "content": "the sky"}, {"role": "user", "content": words(n)},
                           {"role": "assistant", "content": words(n // 2 + 1, 50)}]} for n in SIZES]
PC_ROWS = [{"prompt": words(n), "completion": " " + words(4, 9)} for n in SIZES]
PAIR_ROWS = [{"prompt": words(n) + " ", "chosen": words(3, 5), "rejected": words(n, 7)} for n in SIZES]
CHAT_PC_ROWS = [{"prompt": [{"role": "user", "content": words(n)}],
                 "completion": [{"role": "assistant", "content": words(n // 3 + 1, 11)}]} for n in SIZES]
CHAT_PAIR_ROWS = [{"prompt": [{"role": "user", "content": words(n)}],
                   "chosen": [{"role": "assistant", "content": words(2, 3)}],
                   "rejected": [{"role": "assistant", "content": words(n + 5, 4)}]} for n in SIZES]


def ours(path: str, tok: Path, **kw: Any) -> list[int]:
    """Tokens per example after truncation, in row order (from the longest-first list, which names every row of
    these small files with its length before truncation)."""
    d = dataset_plan_input(path, str(tok), **{"batch": 1, **kw})
    rows = dict(d.longest)
    assert len(rows) == d.examples, "the helper needs every row in the longest list"
    return [min(rows[i], d.max_length) if d.max_length else rows[i] for i in range(d.examples)]


@pytest.fixture(scope="module")
def trl_lengths(tok: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[int]]:
    """TRL's own _prepare_dataset on the same rows (its tokenizer loaded by transformers): the truth."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    out_dir = str(tmp_path_factory.mktemp("trl-out"))
    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    sft = SFTTrainer.__new__(SFTTrainer)  # only its dataset preparation runs: no model is needed
    sft._tokenizer, sft.chat_template, sft.completion_only_loss = tokenizer, None, False
    found: dict[str, list[int]] = {}
    for name, rows, max_length in (("text", TEXT_ROWS, None), ("text@20", TEXT_ROWS, 20),
                                   ("messages", CHAT_ROWS, None), ("prompt_completion", PC_ROWS, None),
                                   ("chat_prompt_completion", CHAT_PC_ROWS, None)):
        args = SFTConfig(output_dir=out_dir, max_length=max_length, report_to="none", use_cpu=True, bf16=False)
        prepared = SFTTrainer._prepare_dataset(sft, Dataset.from_list(rows), tokenizer, args, False, None, "train")
        found[name] = [len(x) for x in prepared["input_ids"]]
    dpo = DPOTrainer.__new__(DPOTrainer)
    dpo._tokenizer = tokenizer
    args = DPOConfig(output_dir=out_dir, report_to="none", use_cpu=True, bf16=False)
    for name, rows in (("pairs", PAIR_ROWS), ("chat_pairs", CHAT_PAIR_ROWS)):
        prepared = DPOTrainer._prepare_dataset(dpo, Dataset.from_list(rows), tokenizer, args, "train")
        found[name] = [max(len(p) + len(c), len(p) + len(r)) for p, c, r in
                       zip(prepared["prompt_ids"], prepared["chosen_ids"], prepared["rejected_ids"], strict=True)]
    return found


@pytest.mark.slow  # imports TRL (15 s here)
def test_text_messages_and_prompt_completion_match_trl_sft(tok: Path, tmp_path: Path,
                                                           trl_lengths: dict[str, list[int]]) -> None:
    assert ours(write_jsonl(tmp_path / "t.jsonl", TEXT_ROWS), tok) == trl_lengths["text"]
    assert ours(write_jsonl(tmp_path / "t.jsonl", TEXT_ROWS), tok, max_length=20) == trl_lengths["text@20"]
    assert ours(write_jsonl(tmp_path / "m.jsonl", CHAT_ROWS), tok) == trl_lengths["messages"]
    assert ours(write_jsonl(tmp_path / "p.jsonl", PC_ROWS), tok) == trl_lengths["prompt_completion"]
    assert ours(write_jsonl(tmp_path / "cp.jsonl", CHAT_PC_ROWS), tok) == trl_lengths["chat_prompt_completion"]


@pytest.mark.slow
def test_dpo_pairs_match_trl_dpo(tok: Path, tmp_path: Path, trl_lengths: dict[str, list[int]]) -> None:
    d = dataset_plan_input(write_jsonl(tmp_path / "pairs.jsonl", PAIR_ROWS), str(tok), batch=2)
    assert d.trainer == "dpo"
    assert [dict(d.longest)[i] for i in range(len(PAIR_ROWS))] == trl_lengths["pairs"]
    # The DPO collator stacks chosen and rejected: 2 x batch rows, padded to the longest of them all.
    assert (d.peak_batch_rows, d.peak_batch_seq) == (4, max(trl_lengths["pairs"]))
    chats = dataset_plan_input(write_jsonl(tmp_path / "chat_pairs.jsonl", CHAT_PAIR_ROWS), str(tok), batch=2)
    assert [dict(chats.longest)[i] for i in range(len(CHAT_PAIR_ROWS))] == trl_lengths["chat_pairs"]


def test_plain_text_gets_bos_and_eos_as_trl_and_none_under_the_hf_trainer(tok: Path, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", TEXT_ROWS)
    assert ours(path, tok) == [n + 2 for n in SIZES]  # <s> ... </s>
    assert ours(path, tok, trainer="hf") == [n + 1 for n in SIZES]  # tokenizer(text): <s> only
    ends = [{"text": words(n) + "</s>"} for n in SIZES]  # an EOS already there is not doubled (TRL's add_eos)
    assert ours(write_jsonl(tmp_path / "e.jsonl", ends), tok) == [n + 2 for n in SIZES]


def test_conversations_use_the_chat_template_like_transformers(tok: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    want = [len(tokenizer.apply_chat_template(r["messages"], tokenize=True)["input_ids"]) for r in CHAT_ROWS]
    assert ours(write_jsonl(tmp_path / "m.jsonl", CHAT_ROWS), tok) == want
    # ShareGPT's from/value under "conversations" reads as TRL converts it
    share = [{"conversations": [{"from": m["role"], "value": m["content"]} for m in r["messages"]]} for r in CHAT_ROWS]
    assert ours(write_jsonl(tmp_path / "s.jsonl", share), tok) == want


def test_without_transformers_the_template_renders_the_same(tok: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "m.jsonl", CHAT_ROWS)
    with_transformers = ours(path, tok)
    monkeypatch.setitem(sys.modules, "transformers.utils.chat_template_utils", None)  # ImportError: jinja2 renders
    assert ours(path, tok) == with_transformers


def test_grpo_counts_the_prompts_with_the_generation_prompt(tok: Path, tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": words(n)}]} for n in SIZES]
    d = dataset_plan_input(write_jsonl(tmp_path / "g.jsonl", rows), str(tok), batch=2, max_length=8)
    assert d.trainer == "grpo"
    # <s> <|user|> n words <|end|> <|assistant|>; prompts are not truncated at max_length
    assert [dict(d.longest)[i] for i in range(len(rows))] == [n + 4 for n in SIZES]
    assert d.truncated_examples == 0 and any("GRPO" in n for n in d.notes)


def test_a_column_of_token_ids_is_used_as_it_is_with_no_tokenizer(tmp_path: Path) -> None:
    rows = [{"input_ids": list(range(n)), "text": "ignored"} for n in SIZES]
    d = dataset_plan_input(write_jsonl(tmp_path / "ids.jsonl", rows), None, batch=2, max_length=30)
    assert d.how.startswith("TRL SFT; input_ids used as they are")
    assert (d.longest_tokens, d.truncated_examples, d.longest_untruncated_tokens) == (30, 1, 40)
    assert [t for _, t in d.longest] == [40, 25, 10, 7, 3]  # named by their length before truncation


def test_a_named_field_and_the_errors_that_say_what_to_pass(tok: Path, tmp_path: Path) -> None:
    rows = [{"body": words(n), "n": n} for n in SIZES]
    path = write_jsonl(tmp_path / "b.jsonl", rows)
    assert ours(path, tok, field="body") == [n + 2 for n in SIZES]
    with pytest.raises(DatasetError, match=r"no column to tokenize .* it has body, n: pass --dataset-field NAME"):
        dataset_plan_input(path, str(tok))
    with pytest.raises(DatasetError, match="no column 'nope'"):
        dataset_plan_input(path, str(tok), field="nope")
    with pytest.raises(DatasetError, match="no tokenizer was found: pass --tokenizer DIR"):
        dataset_plan_input(path, None, field="body")
    plain = make_tokenizer(tmp_path / "plain", chat_template=None)
    with pytest.raises(DatasetError, match="has no chat template"):
        dataset_plan_input(write_jsonl(tmp_path / "m.jsonl", CHAT_ROWS), str(plain))


def test_the_model_folder_gives_the_tokenizer_and_a_hub_id_its_cached_snapshot(
        tok: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", TEXT_ROWS)
    (tok / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert dataset_plan_input(path, None, model=str(tok / "config.json")).longest_tokens == max(SIZES) + 2
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snap = tmp_path / "hub" / "models--org--model" / "snapshots" / "abc"
    make_tokenizer(snap)
    assert dataset_plan_input(path, None, model="org/model").longest_tokens == max(SIZES) + 2


def test_a_tokenizer_json_with_truncation_set_is_not_truncated(tok: Path, tmp_path: Path) -> None:
    folder = tmp_path / "trunc"
    folder.mkdir()
    spec = json.loads((tok / "tokenizer.json").read_text())
    spec["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text((tok / "tokenizer_config.json").read_text())
    lengths = RunTokenizer(folder).lengths([words(40)])
    assert np.array_equal(lengths, [41])
