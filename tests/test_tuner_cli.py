"""``vramscope tune``: every bad input is one line and exit 2; without CUDA it says so; the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from vramscope.cli import main
from vramscope.cli.tune import format_result
from vramscope.tune.search import Trial, search

CONFIG = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "max_position_embeddings": 512}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("vramscope: error: ")
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--seq-len is required"),
        (["--seq-len", "0"], "expected a positive number"),
        (["--seq-len", "512", "--margin", "1.5"], "--margin must be at least 0 and below 1"),
        (["--seq-len", "512", "--margin", "lots"], "--margin is a fraction"),
        (["--seq-len", "512", "--gpu-memory", "24 bananas"], "cannot read '24 bananas' as a memory size"),
        (["--seq-len", "512", "--start", "8", "--max-batch", "4"], "--max-batch (4) must be at least --start (8)"),
        (["--seq-len", "512", "--bits", "3"], "invalid choice"),
        (["--seq-len", "512", "--lora-targets", ","], "--lora-targets takes all-linear or a list"),
        (["--seq-len", "512", "--lora-dropout", "2"], "--lora-dropout must be in [0, 1)"),
        (["--find-seq-len", "--target-batch", "8"], "--target-batch goes with the batch search"),
        (["--find-seq-len", "--seq-len", "32"], "must be at least --multiple-of (64)"),
        (["--find-seq-len", "--seq-len", "256", "--max-seq-len", "128"], "--max-seq-len (128) must be at least"),
        (["--seq-len", "512", "--bits", "8", "--quant-type", "fp4"], "--quant-type applies to 4-bit only"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    model_dir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    err = one_line_error(capsys, ["tune", "--model-dir", str(model_dir), *extra])
    assert message in err


def test_model_dir_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is not a folder" in one_line_error(
        capsys, ["tune", "--model-dir", str(tmp_path / "nope"), "--seq-len", "8"]
    )
    assert "has no config.json" in one_line_error(capsys, ["tune", "--model-dir", str(tmp_path), "--seq-len", "8"])
    (tmp_path / "config.json").write_text("{not json")
    assert "cannot read" in one_line_error(capsys, ["tune", "--model-dir", str(tmp_path), "--seq-len", "8"])
    assert "required" in one_line_error(capsys, ["tune", "--seq-len", "8"])


@pytest.mark.parametrize(("content", "said"), [
    (b"{not json", "is not valid JSON (Expecting property name"),
    (b"[1, 2]", "holds a JSON list, not an object"),
    (b'{"model_type": "\xff"}', "codec can't decode"),
    (b" " * (16 * 1024 * 1024 + 1), "more than the 16,777,216"),
])
def test_a_bad_config_json_is_the_planners_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    content: bytes, said: str) -> None:
    # tune reads config.json as plan --config does (planner.shapes.load_config_file: bounded, one typed error),
    # before it looks for CUDA: a list or a 16 MiB file is refused here, not taken for a model
    (tmp_path / "config.json").write_bytes(content)
    err = one_line_error(capsys, ["tune", "--model-dir", str(tmp_path), "--seq-len", "8"])
    assert err.startswith("vramscope: error: cannot read the model's config.json: ") and said in err, err
    assert str(tmp_path / "config.json") in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_cuda_it_says_so(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, ["tune", "--model-dir", str(model_dir), "--seq-len", "512"], code=1)
    assert "needs a CUDA GPU" in err


def test_help_lists_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--model-dir",
        "--seq-len",
        "--find-seq-len",
        "--max-seq-len",
        "--devices",
        "--gpu",
        "--target-batch",
        "--gpu-memory",
        "--json",
        "--bits",
        "--lora-r",
        "--optim",
        "--no-gradient-checkpointing",
    ):
        assert flag in out


def linear_result(**settings: Any) -> dict[str, Any]:
    def run(b: int) -> Trial:
        peak = 4 * 2**30 + b * 2**30
        return Trial(b, peak <= 24 * 2**30, 4 * 2**30, peak if peak <= 24 * 2**30 else None, 0.5, after_bytes=4 * 2**30)

    out = search(run, 24 * 2**30, margin=0.05).to_dict()
    out.update(settings)
    return out


def test_summary_text() -> None:
    text = format_result(linear_result(seq_len=2048, target_batch=64, micro_batch=16, grad_accum_steps=4))
    lines = text.splitlines()
    assert lines[0].startswith("largest batch at 2048 tokens: 18 (peak 22.00 GiB, 2.00 GiB free of 24.00 GiB)")
    assert "margin kept: 5% (1.20 GiB)" in text
    assert "2 trials (0 out of memory)" in text  # no fixed part: the safe far point is already the answer
    assert "fitted: 1.00 GiB per sample + 0 B fixed; with no margin the line allows 20" in text
    assert "target batch 64: micro-batch 16 x 4 gradient accumulation steps = 64" in text


def test_tunes_flags_are_one_search_setting_for_one_gpu_and_a_rehearsal() -> None:
    """``tune -- CMD`` and ``tune --gpus N -- CMD`` read the search's flags through one function (each wrote the
    same ten keyword arguments); unsaid, a command's trials are 3 fresh runs of it, and the batch is its own."""
    from vramscope.cli import build_parser
    from vramscope.cli.command import explicit
    from vramscope.cli.tune_command import search_settings
    from vramscope.tune.command import SearchSettings

    def settings(*flags: str) -> SearchSettings:
        args = build_parser().parse_args(["tune", *flags, "--", "python", "train.py"])
        return search_settings(args, explicit(args))

    plain = settings()
    assert plain.max_trials == 3 and plain.batch_size is None and not plain.max_seq_len and not plain.keep_logs
    given = settings("--batch-size", "6", "--max-trials", "5", "--margin", "0.1", "--trial-timeout", "120",
                     "--max-batch", "64")
    assert (given.batch_size, given.max_trials, given.margin, given.timeout_s, given.max_size) == (6, 5, 0.1, 120.0, 64)
    longest = settings("--max-seq-len", "--max-len", "8192", "--gpus", "2")
    assert longest.max_seq_len and longest.max_size == 8192
