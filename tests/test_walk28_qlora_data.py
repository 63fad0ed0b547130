"""``vramscope plan -- python qlora.py ...`` with the flags of artidoro/qlora's scripts/finetune_guanaco_7b.sh and a
local dataset: qlora.py's collator cuts the input at --source_max_len and the output at --target_max_len apart
(BOS + input, output + EOS), so the data is read that way, in each --dataset_format it knows. Before, the
guanaco command's own local data could not be read at all (input/output are no SFT columns) and its
--do_mmlu_eval passed unsaid."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataset_tokenizer import make_tokenizer, words
from vramscope.cli import main

GUANACO = Path(__file__).parent / "data" / "commands" / "qlora_guanaco_7b.yaml"


def guanaco(dataset: str, *extra: str) -> list[str]:
    """The guanaco-7b command (verbatim, tests/data), its hub dataset oasst1 replaced by a local file."""
    argv = shlex.split(yaml.safe_load(GUANACO.read_text())["command"])
    at = argv.index("--dataset")
    argv[at + 1] = dataset
    return [*argv, *extra]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qlora")
    make_tokenizer(folder / "tok")
    rows = [{"input": words(5), "output": words(10)} for _ in range(30)]
    rows[4] = {"input": words(3), "output": words(900)}  # the output is cut at 512 (with its EOS)
    rows[9] = {"input": words(100), "output": words(20)}  # the input is cut at 16 (with its BOS)
    (folder / "io.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    alpaca = [{"instruction": words(4), "input": "", "output": words(30)} for _ in range(10)]
    alpaca[2] = {"instruction": words(2), "input": words(3), "output": words(600)}
    (folder / "alpaca.json").write_text(json.dumps(alpaca))
    (folder / "text.jsonl").write_text(json.dumps({"text": words(10)}) + "\n")
    return folder


def plan(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str]) -> dict[str, Any]:
    code = main(["plan", "--json", "--tokenizer", str(root / "tok"), "--", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, Any] = json.loads(out.out)
    return result


def test_the_guanaco_command_reads_its_input_output_data(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    out = plan(capsys, root, guanaco(str(root / "io.jsonl")))
    data = out["dataset"]
    # A plain row: BOS + 5 words, 10 words + EOS. Row 4: 1 + 3 and 512 (of 901); row 9: 16 (of 101) and 21.
    assert data["how"].startswith("qlora.py (--dataset_format input-output); BOS + source cut at 16 and target "
                                  "+ EOS cut at 512")
    assert (data["p50_tokens"], data["longest_tokens"]) == (6 + 11, 4 + 512)
    assert data["longest"][:2] == [{"index": 4, "tokens": 4 + 901}, {"index": 9, "tokens": 101 + 21}]
    assert data["truncated_examples"] == 2 and data["batching"] == "grouped"  # qlora.py groups by length
    assert (out["batch_size"], out["seq_len"]) == (1, 516)
    assert out["command"]["memory"]["group_by_length"] is True
    assert any(u.startswith("--do_mmlu_eval: ") for u in out["unsupported"])
    code = main(["plan", "--tokenizer", str(root / "tok"), "--", *guanaco(str(root / "io.jsonl"))])
    text = capsys.readouterr().out
    assert code == 0 and "; 2 cut at the source's or the target's length (the longest was 905)" in text


def test_the_alpaca_format_wraps_the_instruction_and_is_cut_at_the_source_length(
        capsys: pytest.CaptureFixture[str], root: Path) -> None:
    out = plan(capsys, root, guanaco(str(root / "alpaca.json"), "--dataset_format", "alpaca"))
    data = out["dataset"]
    assert data["fields"] == ["instruction", "input", "output"]
    # Every Alpaca prompt is longer than 16 tokens (its own words): the source is cut at 16 in each row, and the
    # longest output (600 words + EOS) at 512.
    assert data["longest_tokens"] == 16 + 512 and data["truncated_examples"] == 10
    assert data["p50_tokens"] == 16 + 31


def test_a_dataset_without_the_formats_columns_is_one_line_and_falls_back(capsys: pytest.CaptureFixture[str],
                                                                          root: Path) -> None:
    code = main(["plan", "--tokenizer", str(root / "tok"), "--", *guanaco(str(root / "text.jsonl"))])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("dataset:"))
    assert "qlora.py --dataset_format input-output reads input and output; the dataset has text" in line
    assert line.endswith("planned at batch x max_length (1 x 528) instead")
    # --dataset-field names one column to tokenize instead of qlora.py's two.
    code = main(["plan", "--json", "--tokenizer", str(root / "tok"), "--dataset-field", "text", "--",
                 *guanaco(str(root / "text.jsonl"))])
    data = json.loads(capsys.readouterr().out)["dataset"]
    assert code == 0 and data["fields"] == ["text"] and data["longest_tokens"] == 11


def test_the_guanaco_command_as_written_reads_oasst1_from_the_hub_cache(
        capsys: pytest.CaptureFixture[str], root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dataset oasst1`` is qlora.py's name for timdettmers/openassistant-guanaco (its load_data), formatted as
    output = text, input = '': read from the local hub cache when it is there, said unread when it is not."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    argv = shlex.split(yaml.safe_load(GUANACO.read_text())["command"])  # verbatim: --dataset oasst1
    code = main(["plan", "--tokenizer", str(root / "tok"), "--", *argv])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("dataset: "))
    assert code == 0 and "timdettmers/openassistant-guanaco" in line and "never downloads" in line
    repo = tmp_path / "hub" / "datasets--timdettmers--openassistant-guanaco"
    (repo / "snapshots" / "f00d").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("f00d")
    rows = [{"text": words(40)}, {"text": words(700)}, {"text": words(12)}]
    (repo / "snapshots" / "f00d" / "openassistant_best_replies_train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    out = plan(capsys, root, argv)
    data = out["dataset"]
    assert data["how"].startswith("qlora.py (--dataset_format oasst1)") and data["examples"] == 3
    # BOS alone for the empty input; the text + EOS cut at 512.
    assert data["longest_tokens"] == 1 + 512 and data["p50_tokens"] == 1 + 41


def test_a_llamafactory_dataset_name_is_said_unread(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """LLaMA-Factory names its data in dataset_info.json: the plan said nothing of it at all."""
    (tmp_path / "lf.yaml").write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\n"
        "dataset: mydata\ndataset_dir: data\ncutoff_len: 1024\nper_device_train_batch_size: 2\n")
    code = main(["plan", "--", "llamafactory-cli", "train", str(tmp_path / "lf.yaml")])
    out = capsys.readouterr().out
    assert code == 0
    assert ("dataset: cannot read it: mydata: not a local path, nor a hub id (owner/name) to look up in the local "
            "cache; pass --dataset PATH before '--' to plan at the data; planned at batch x max_length (2 x 1024) "
            "instead") in out
