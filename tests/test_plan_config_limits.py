"""A config.json with absurd sizes is refused in one line, not planned until memory runs out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramscope.cli import main

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "vocab_size": 32000}


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 2_300_000_000), ("num_attention_heads", 10**9),
                                              ("hidden_size", 2**41)])
def test_absurd_sizes_are_refused_in_one_line(field: str, value: int, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA, field: value}))
    assert main(["plan", "--config", str(config), "--batch-size", "1", "--seq-len", "256"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vramscope: error: config field {field!r} is {value}, more than any model has")
    assert len(err.strip().splitlines()) == 1


def test_the_largest_published_shapes_still_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"  # Llama-3.1-405B's sizes
    config.write_text(json.dumps({**LLAMA, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                                  "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256}))
    assert main(["plan", "--config", str(config), "--batch-size", "1", "--seq-len", "256"]) == 0
    assert "GiB" in capsys.readouterr().out
