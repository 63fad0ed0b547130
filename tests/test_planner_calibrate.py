"""--calibrate: the least-squares fit (pure, CPU) and a real calibration on a GPU (gpu marker)."""

from __future__ import annotations

import pytest

from vramscope.planner import Hardware, estimate, plan, resolve_model
from vramscope.tune.calibrate import CalibrationError, Point, fit
from vramscope.tune.qlora import QLoraSpec

MIB = 1024**2


def test_fit_recovers_scale_and_offset() -> None:
    points = [Point(1, 128, 1000 * MIB + int(1.2 * d) + 30 * MIB, d) for d in (100 * MIB, 250 * MIB, 600 * MIB)]
    hw = fit(points, measured_static=1000 * MIB, predicted_static=990 * MIB, cuda_context_bytes=600 * MIB)
    assert hw.dynamic_scale == pytest.approx(1.2, rel=1e-6)
    assert hw.dynamic_offset_bytes == pytest.approx(30 * MIB, abs=2)
    assert hw.static_offset_bytes == 10 * MIB and hw.cuda_context_bytes == 600 * MIB


def test_calibration_changes_the_plan_by_its_fit() -> None:
    shape = resolve_model("TinyLlama-1.1B")[1]
    spec = QLoraSpec()
    base = estimate(shape, spec, 4, 1024)
    hw = Hardware(dynamic_scale=1.1, dynamic_offset_bytes=5 * MIB, static_offset_bytes=-2 * MIB)
    p = plan("TinyLlama-1.1B", 4, 1024, spec, hardware=hw)
    bd = base.breakdown
    static = (bd.quantized_weights + bd.quantization_constants + bd.unquantized_params + bd.lora_weights
              + bd.optimizer_states + bd.cublas_workspaces + 4 * 4096 * 8)  # + int64 ids and labels (4 x T x 8)
    expected = base.peak_allocated_bytes + round(0.1 * (base.peak_allocated_bytes - static)) + 3 * MIB
    assert p.peak_allocated_bytes == pytest.approx(expected, abs=1024)
    assert p.breakdown.calibration == p.peak_allocated_bytes - base.peak_allocated_bytes
    assert p.breakdown.allocated() == p.peak_allocated_bytes


@pytest.mark.parametrize("points", [[Point(1, 128, 10, 5)], [Point(1, 128, 10, 5), Point(2, 128, 20, 5)]])
def test_fit_refuses_too_few_or_degenerate_points(points: list[Point]) -> None:
    with pytest.raises(CalibrationError):
        fit(points, 0, 0)


def test_fit_refuses_an_implausible_scale() -> None:
    with pytest.raises(CalibrationError, match="implausible"):
        fit([Point(1, 1, 10 * MIB, MIB), Point(1, 2, 100 * MIB, 2 * MIB)], 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["hf", "trl", "loop"])
def test_calibration_on_the_gpu_predicts_a_larger_shape(framework: str) -> None:
    import tempfile

    from vramscope.tune.calibrate import calibrate, measure
    from vramscope.tune.qlora import write_random_checkpoint

    config = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8000, "max_position_embeddings": 4096}
    spec = QLoraSpec(framework=framework)  # measured with the framework's own step (tune.qlora.Trainer)
    hw, report = calibrate(config, spec)
    assert "calibration on" in report
    with tempfile.TemporaryDirectory() as tmp:
        write_random_checkpoint(config, tmp, device="cuda")
        _, rows = measure(tmp, spec, 8000, [(8, 1024)])
    measured = rows[0][2]
    predicted = plan(config, 8, 1024, spec, hardware=hw).peak_allocated_bytes
    assert abs(predicted - measured) / measured < 0.10
