"""Measured against planned step memory per shape on one GPU, to see why a TRL calibration extrapolates high.

A tiny random Llama (h 512, 4 layers, vocabulary 8000) runs vramscope's framework step (``tune`` calibration's
own measurement) at seven shapes, after ``calibrate`` for the same recipe. Results of 2026-12-01:
bench/results/calibrate/trl_probe_h200_2026-12-01.txt (the TRL tile was planned min(vocab, 32768) wide).
"""

from __future__ import annotations

import tempfile

from vramscope.planner.api import resolve_model
from vramscope.planner.memory import estimate
from vramscope.recipe import QLoraSpec
from vramscope.tune.calibrate import _static, calibrate, measure
from vramscope.tune.qlora import write_random_checkpoint

MIB = 2**20
CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "max_position_embeddings": 4096}
SHAPES = [(1, 128), (2, 128), (2, 256), (1, 1024), (2, 1024), (4, 1024), (8, 1024)]


def main() -> None:
    _, shape = resolve_model(CONFIG)
    for framework in ["trl", "hf"]:
        spec = QLoraSpec(framework=framework)
        hw, report = calibrate(CONFIG, spec)
        print(framework, report, hw.dynamic_scale, hw.dynamic_offset_bytes, hw.static_offset_bytes, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            write_random_checkpoint(CONFIG, tmp, device="cuda")
            static, rows = measure(tmp, spec, 8000, SHAPES)
        print(framework, "static", static)
        for b, s, alloc, _reserved, _process in rows:
            est = estimate(shape, spec, b, s)
            dynamic = est.peak_allocated_bytes - _static(est.breakdown)
            print(f"{framework} {b}x{s} measured {alloc / MIB:.1f} MiB planned {est.peak_allocated_bytes / MIB:.1f} "
                  f"dyn {dynamic / MIB:.1f} meas_dyn {(alloc - static) / MIB:.1f}", flush=True)


if __name__ == "__main__":
    main()
