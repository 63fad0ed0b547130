"""``vramscope plan --dataset``: the plan made at the dataset's longest batch (terminal and --json), the
distribution and the longest examples shown, and a dataset it cannot read as one line with the plan at
batch x max_length (exit 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dataset_tokenizer import make_tokenizer, words
from vramscope.cli import main

LONG = {5: 1500, 77: 1200}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("cli")
    tok = make_tokenizer(root / "tok")
    data = root / "train.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for i in range(300):
            f.write(json.dumps({"text": words(LONG.get(i, 30 + i % 20), i)}) + "\n")
    return str(data), str(tok)


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "4", *argv, "--json"])
    out = capsys.readouterr()
    assert code == 0 and out.err == "", out.err
    data = json.loads(out.out)
    assert isinstance(data, dict)
    return data


def test_the_plan_is_made_at_the_longest_batch(capsys: pytest.CaptureFixture[str], files: tuple[str, str]) -> None:
    data, tok = files
    at_data = plan_json(capsys, "--seq-len", "4096", "--dataset", data, "--tokenizer", tok, "--framework", "trl")
    at_max = plan_json(capsys, "--seq-len", "4096", "--framework", "trl")
    dataset = at_data["dataset"]
    assert isinstance(dataset, dict)
    assert (at_data["batch_size"], at_data["seq_len"]) == (4, 1502)  # 1,500 words + BOS + EOS
    for key in ("examples", "longest_tokens", "p50_tokens", "p99_tokens", "truncated_examples", "peak_batch_tokens"):
        assert key in dataset
    assert (dataset["examples"], dataset["longest_tokens"], dataset["peak_batch_tokens"]) == (300, 1502, 4 * 1502)
    assert dataset["longest"][:2] == [{"index": 5, "tokens": 1502}, {"index": 77, "tokens": 1202}]
    assert int(at_data["peak_allocated_bytes"]) < int(at_max["peak_allocated_bytes"])  # type: ignore[call-overload]


def test_without_seq_len_nothing_is_truncated(capsys: pytest.CaptureFixture[str], files: tuple[str, str]) -> None:
    data, tok = files
    out = plan_json(capsys, "--dataset", data, "--tokenizer", tok, "--padding-free")
    assert (out["batch_size"], out["seq_len"]) == (1, 1501 + 1201 + 2 * 50)  # one row: the 4 longest (hf: BOS, no EOS)


def test_an_unreadable_dataset_is_one_line_and_the_plan_falls_back(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\n{oops\n')
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "4", "--seq-len", "2048", "--dataset", str(broken)])
    out = capsys.readouterr().out
    assert code == 0
    first = out.splitlines()[0]
    assert first.startswith("dataset: cannot read it: ") and "broken.jsonl:2: not JSON" in first
    assert "planned at batch x max_length (4 x 2048) instead" in first
    assert "batch 4 x 2048 tokens" in out
    data = plan_json(capsys, "--seq-len", "2048", "--dataset", str(broken))
    assert data["seq_len"] == 2048 and "not JSON" in str(data["dataset"]["error"])  # type: ignore[index]


def test_unreadable_and_no_seq_len_to_fall_back_to_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "4", "--dataset", str(tmp_path / "none.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "no --seq-len to plan at instead" in err and len(err.strip().splitlines()) == 1


def test_the_terminal_shows_the_histogram_and_the_longest_examples(files: tuple[str, str]) -> None:
    data, tok = files
    done = subprocess.run([sys.executable, "-m", "vramscope", "plan", "--model", "Llama-2-7B", "--batch-size", "2",
                           "--seq-len", "1024", "--dataset", data, "--tokenizer", tok, "--framework", "trl"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "300 examples" in out and "2 truncated at 1024 (the longest was 1,502)" in out
    assert "█" in out and "   32 -    63" in out  # a bin of the histogram
    assert "longest examples (row: tokens): #5: 1,502 (cut to 1,024), #77: 1,202 (cut to 1,024), #" in out
    assert "longest batch: 2 x 1,024 = 2,048 tokens" in out
    assert "Llama-2-7B: 6.74B params, batch 2 x 1024 tokens" in out


def test_a_dpo_dataset_plans_the_dpo_phase_at_its_pairs(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        files: tuple[str, str]) -> None:
    _, tok = files
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": words(10 + i), "chosen": " " + words(5),
                                         "rejected": " " + words(400 if i == 7 else 20)}) + "\n" for i in range(50)))
    out = plan_json(capsys, "--seq-len", "1024", "--dataset", str(pairs), "--tokenizer", tok, "--framework", "trl")
    dataset = out["dataset"]
    assert isinstance(dataset, dict) and dataset["trainer"] == "dpo"
    # 4 pairs: the dataset's longest batch is 8 rows (chosen and rejected stacked) of prompt 17 + 400 words + BOS
    # and EOS; the planner's DPO phase stacks the two itself, so it is given the 4 pairs.
    assert (dataset["peak_batch_rows"], dataset["peak_batch_seq"]) == (8, 419)
    assert (out["batch_size"], out["seq_len"]) == (4, 419)
    assert out["trainer"] == "dpo" and out["phases"]["train"]["rows"] == 8  # type: ignore[index]


def test_a_pasted_command_is_planned_at_its_own_data(capsys: pytest.CaptureFixture[str], files: tuple[str, str],
                                                    tmp_path: Path) -> None:
    """`plan -- trl sft ... --dataset_name train.jsonl`: the command's local data sets the longest batch."""
    data, tok = files
    config = tmp_path / "model"
    config.mkdir()
    from vramscope.planner import registry

    (config / "config.json").write_text(json.dumps(registry.get_config("Llama-2-7B")))
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the run's tokenizer sits in its model folder
        if (Path(tok) / name).exists():
            (config / name).write_text((Path(tok) / name).read_text())
    code = main(["plan", "--json", "--", "trl", "sft", "--model_name_or_path", str(config), "--dataset_name", data,
                 "--per_device_train_batch_size", "4", "--max_length", "4096", "--use_peft", "--load_in_4bit"])
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = json.loads(out.out)
    assert plan["dataset"]["longest_tokens"] == 1502 and (plan["batch_size"], plan["seq_len"]) == (4, 1502)


@pytest.mark.parametrize("framework", ["qlora", "unsloth"])
def test_the_qlora_and_unsloth_frameworks_read_their_datasets(capsys: pytest.CaptureFixture[str],
                                                              files: tuple[str, str], framework: str) -> None:
    # qlora.py tokenizes as an HF Trainer script, Unsloth as TRL's SFT: both plan at the longest batch.
    data, tok = files
    out = plan_json(capsys, "--seq-len", "4096", "--dataset", data, "--tokenizer", tok, "--framework", framework)
    assert out["framework"] == framework and out["seq_len"] >= 1501
