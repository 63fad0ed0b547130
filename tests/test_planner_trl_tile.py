"""TRL's fused LM head allocates its tile at the full vocabulary tile width, whatever the model's vocabulary.

Measured on one H200 (bench/h200/calibrate_probe.py, bench/results/calibrate/trl_probe_h200_2026-12-01.txt): a
tiny random Llama with an 8000-word vocabulary under TRL's own ``add_fused_lm_head``. trl 1.16's
``ChunkedLogProbFunction`` makes ``mm_buf`` of ``(min(tokens, 4096), chunk_size)`` and views the vocabulary's
part of it, so a small vocabulary still pays for 32768 columns (bench/h200/trl_head_probe.py saw the 64 MiB
buffer at 1 x 1024). Planned with ``min(vocab, 32768)``, these points were up to 33% low.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vramscope.planner import plan
from vramscope.recipe import QLoraSpec

CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "max_position_embeddings": 4096}
POINTS = list(csv.DictReader((Path(__file__).parent / "data" / "planner" / "trl_small_vocab_h200.csv").open()))


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p['batch']}x{p['seq']}")
def test_trl_step_of_a_small_vocabulary_model_matches_the_h200(point: dict[str, str]) -> None:
    planned = plan(CONFIG, int(point["batch"]), int(point["seq"]), QLoraSpec(framework="trl")).peak_allocated_bytes
    measured = float(point["peak_allocated_mib"]) * 2**20
    assert abs(planned - measured) / measured < 0.01
