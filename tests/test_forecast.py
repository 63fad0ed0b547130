"""OOM forecast and the longest-batch risk, and the summary dict that `vramscope report` prints."""

from __future__ import annotations

import json
import random

import pytest

from vramscope.analysis.forecast import (
    SAFETY_FRACTION,
    allocator_capacity,
    forecast_oom,
    longest_batch,
    seconds_per_step,
)
from vramscope.analysis.summary import analyze, analyze_columns
from vramscope.logs.table import LogTable

MIB = 1024 * 1024
GIB = 1024 * MIB


def test_allocator_capacity_leaves_out_what_others_hold_on_the_gpu() -> None:
    # 80 GiB GPU, 30 GiB used on the device of which our allocator reserved 28: 2 GiB are context/others.
    assert allocator_capacity(80 * GIB, 30 * GIB, 28 * GIB) == 78 * GIB
    assert allocator_capacity(80 * GIB, None, None) == 80 * GIB
    assert allocator_capacity(None, 1, 1) is None


def test_steps_and_seconds_to_oom_follow_the_headroom_and_the_slope() -> None:
    fc = forecast_oom(slope_bytes_per_step=2 * MIB, current_peak_bytes=40 * GIB, capacity_bytes=80 * GIB,
                      step_seconds=0.5)
    usable = 80 * GIB * (1 - SAFETY_FRACTION)
    assert fc.steps_to_oom == pytest.approx((usable - 40 * GIB) / (2 * MIB))
    assert fc.seconds_to_oom == pytest.approx(fc.steps_to_oom * 0.5)
    assert fc.headroom_bytes == int(usable) - 40 * GIB


def test_no_forecast_without_growth_capacity_or_peak() -> None:
    assert forecast_oom(None, 40 * GIB, 80 * GIB).steps_to_oom is None
    assert forecast_oom(-MIB, 40 * GIB, 80 * GIB).steps_to_oom is None
    unknown = forecast_oom(MIB, 40 * GIB, None)
    assert unknown.steps_to_oom is None and "capacity unknown" in unknown.reason
    assert forecast_oom(MIB, None, 80 * GIB).steps_to_oom is None


def test_a_peak_already_at_the_capacity_is_zero_steps_away() -> None:
    assert forecast_oom(MIB, 80 * GIB, 80 * GIB).steps_to_oom == 0.0


def _elapsed(steps: list[int], pause_every: int | None, pause_s: float, once_at: int | None = None) -> list[float]:
    out, t = [], 0.0
    for s in steps:
        t += 0.8
        if (pause_every and s % pause_every == 0) or s == once_at:
            t += pause_s
        out.append(t)
    return out


def test_step_time_ignores_a_one_off_pause_and_counts_regular_evaluations() -> None:
    steps = list(range(1, 201))
    # One checkpoint save of two minutes is not the run's pace ...
    assert seconds_per_step(steps, _elapsed(steps, None, 120.0, once_at=90)) == pytest.approx(0.8, rel=0.05)
    # ... while an eval every 50 steps is part of it (wall time to OOM includes them).
    with_evals = seconds_per_step(steps, _elapsed(steps, 50, 30.0))
    assert with_evals is not None and 0.8 < with_evals <= (200 * 0.8 + 4 * 30) / 200 + 0.05
    assert seconds_per_step([1, 2], [0.0, 1.0]) is None


def _batches(seed: int = 3) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    tokens = [rng.randint(256, 4096) for _ in range(300)]
    # 20 GiB kept (weights, optimizer) + 2 MiB of activations and logits per token, some noise.
    peaks = [int(20 * GIB + 2 * MIB * t + rng.gauss(0, 50 * MIB)) for t in tokens]
    return tokens, peaks


def test_longest_batch_fit_predicts_the_peak_and_what_fits() -> None:
    tokens, peaks = _batches()
    lb = longest_batch(tokens, peaks, capacity_bytes=80 * GIB, max_tokens=16384)
    assert lb.available
    assert lb.bytes_per_token == pytest.approx(2 * MIB, rel=0.1)
    assert lb.predicted_peak_bytes == pytest.approx(20 * GIB + 2 * MIB * 16384, rel=0.05)  # 52 GiB
    assert lb.max_tokens_that_fit == pytest.approx((80 * GIB * (1 - SAFETY_FRACTION) - 20 * GIB) / (2 * MIB), rel=0.1)
    assert not lb.at_risk and lb.warning is None


def test_a_longest_batch_over_the_capacity_is_warned_about_before_it_arrives() -> None:
    tokens, peaks = _batches()
    lb = longest_batch(tokens, peaks, capacity_bytes=80 * GIB, max_tokens=32768)  # ~84 GiB
    assert lb.at_risk
    assert lb.warning is not None and "32768 tokens" in lb.warning and "fit" in lb.warning


def test_one_batch_size_gives_no_slope_but_keeps_the_measured_peak() -> None:
    lb = longest_batch([1024] * 50, [30 * GIB] * 50, capacity_bytes=80 * GIB)
    assert lb.bytes_per_token is None
    assert lb.predicted_peak_bytes == 30 * GIB
    assert "same size" in lb.reason


def _table(rows: list[dict[str, object]]) -> LogTable:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return LogTable("mem.csv", {c: ["" if r.get(c) is None else str(r.get(c)) for r in rows] for c in columns})


def _gpu_rows(n: int, gpu: int, allocated: object, reserved: object) -> list[dict[str, object]]:
    """Step rows of one GPU; ``allocated``/``reserved`` are bytes or functions of the step."""
    rows = []
    for s in range(1, n + 1):
        a = allocated(s) if callable(allocated) else allocated
        r = reserved(s) if callable(reserved) else reserved
        rows.append({"time": f"2026-01-01T00:00:{s:02d}", "elapsed_s": 0.5 * s, "step": s, "gpu": gpu,
                     "phase": "train", "allocated_bytes": a, "reserved_bytes": r, "peak_allocated_bytes": a + 2 * GIB,
                     "device_used_bytes": r + GIB, "device_total_bytes": 80 * GIB, "tokens": 2048})
    return rows


def test_analyze_reports_the_leaking_gpu_with_slope_start_and_forecast() -> None:
    rows = _gpu_rows(300, 0, 10 * GIB, 12 * GIB) + _gpu_rows(
        300, 1, lambda s: 10 * GIB + max(0, s - 120) * 4 * MIB, lambda s: 14 * GIB + max(0, s - 120) * 4 * MIB)
    typed = analyze(_table(rows))
    worst = typed.leak.worst
    assert worst is not None and worst.detected and worst.gpu == 1
    assert typed.forecast.soonest is not None and typed.forecast.soonest.key == "1"
    result = typed.to_json()
    leak = result["leak"]
    assert leak["detected"] is True
    assert leak["gpu"] == 1
    assert leak["slope_bytes_per_step"] == pytest.approx(4 * MIB, rel=0.05)
    assert leak["start_step"] == pytest.approx(120, abs=5)
    assert leak["devices"]["0"]["detected"] is False
    fc = result["forecast"]
    assert fc["key"] == "1"
    assert fc["steps_to_oom"] == pytest.approx(fc["headroom_bytes"] / (4 * MIB), rel=0.05)
    assert fc["seconds_to_oom"] == pytest.approx(fc["steps_to_oom"] * 0.5, rel=0.05)
    assert any("GPU 1" in w and "leak" in w for w in result["warnings"])
    json.dumps(result)  # what `vramscope report --json` prints


def test_analyze_calls_growing_reserved_with_flat_allocated_caching_not_a_leak() -> None:
    rows = _gpu_rows(300, 0, 10 * GIB, lambda s: 12 * GIB + s * 8 * MIB)
    leak = analyze(_table(rows)).to_json()["leak"]
    assert leak["detected"] is False
    assert leak["kind"] == "caching"
    assert "allocated memory is flat" in leak["verdict"]
    assert leak["reserved_slope_bytes_per_step"] == pytest.approx(8 * MIB, rel=0.05)


def test_analyze_peaks_per_phase_with_their_step() -> None:
    rows = _gpu_rows(100, 0, 10 * GIB, 12 * GIB)
    rows[49]["peak_allocated_bytes"] = 15 * GIB  # a long batch at step 50
    rows.append({**rows[59], "phase": "eval", "peak_allocated_bytes": 13 * GIB})
    peak = analyze(_table(rows)).to_json()["peak"]
    gpu = peak["devices"]["0"]
    assert gpu["bytes"] == 15 * GIB and gpu["step"] == 50 and gpu["phase"] == "train"
    assert gpu["phases"]["eval"]["bytes"] == 13 * GIB and gpu["phases"]["eval"]["step"] == 60
    assert gpu["total_bytes"] == 80 * GIB
    assert peak["overall"]["bytes"] == 15 * GIB


def test_analyze_a_time_based_log_trends_per_second() -> None:
    rows = [{"time": "t", "elapsed_s": 1.0 * i, "gpu": 0, "device_used_bytes": 5 * GIB + i * 3 * MIB,
             "device_total_bytes": 80 * GIB} for i in range(200)]
    result = analyze(_table(rows)).to_json()
    assert result["leak"]["detected"] is True
    assert result["leak"]["slope_bytes_per_step"] is None
    assert result["leak"]["slope_bytes_per_second"] == pytest.approx(3 * MIB, rel=0.05)
    assert result["forecast"]["seconds_to_oom"] is not None


def test_analyze_of_nothing_is_well_formed() -> None:
    result = analyze_columns({}).to_json()
    assert result["leak"]["detected"] is False
    assert result["forecast"]["steps_to_oom"] is None
    assert result["peak"]["overall"] is None


def test_the_typed_result_says_what_its_json_says() -> None:
    from vramscope.analysis.results import SCHEMA_VERSION

    rows = _gpu_rows(300, 0, lambda s: 10 * GIB + max(0, s - 100) * 4 * MIB, 14 * GIB)
    result = analyze(_table(rows))
    data = result.to_json()
    leak = result.leak.devices["0"]
    assert (leak.detected, leak.slope_bytes_per_step, leak.start_step) == (
        data["leak"]["detected"], data["leak"]["slope_bytes_per_step"], data["leak"]["start_step"])
    assert result.forecast.devices["0"].oom.steps_to_oom == data["forecast"]["steps_to_oom"]
    peak = result.peak.devices["0"]
    assert peak.at is not None and (peak.at.bytes, peak.at.step, peak.at.phase) == (
        data["peak"]["devices"]["0"]["bytes"], data["peak"]["devices"]["0"]["step"], "train")
    detail = result.device("0").detail
    assert detail.step_range == (data["steps"]["first"], data["steps"]["last"]) == (1, 300)
    assert [s.phase for s in detail.stretches] == ["train"] and detail.rows == 300
    assert json.loads(json.dumps(data)) == data
    assert SCHEMA_VERSION == 1  # what `report --json` carries; raised when a field changes meaning
