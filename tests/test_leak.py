"""The leak test on series with a known answer: what it must catch, what it must leave alone.

Real training traces are in test_leak_corpus.py; here the series are built from a seeded random
generator, so that each property (noise, warm-up, one long batch, record-breaking batches, a leak that
starts late) is tested on many shapes, with the right answer known by construction.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from vramscope.analysis.leak import LeakConfig, detect_leak, first_detection, median, thin, trend

MIB = 1024 * 1024
BASE = 6 * 1024 * MIB  # what a QLoRA run keeps between steps: weights, LoRA, optimizer state
# No shrinking: a failing example is reported as generated (shrinking re-runs the detector for minutes).
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
FEW = settings(SETTINGS, max_examples=10)


def steps(n: int) -> list[float]:
    return [float(s) for s in range(1, n + 1)]


def test_trend_finds_the_slope_of_a_line_and_a_significant_z() -> None:
    xs = steps(50)
    t = trend(xs, [100 + 3 * x for x in xs])
    assert t.slope == pytest.approx(3.0)
    assert t.intercept == pytest.approx(100.0)
    assert t.z > 8


def test_trend_of_a_constant_series_is_zero_with_no_significance() -> None:
    t = trend(steps(40), [BASE] * 40)
    assert t.slope == 0.0
    assert t.z == 0.0


def test_trend_ignores_outliers_that_move_a_least_squares_line() -> None:
    xs = steps(60)
    ys = [1000.0 + 2 * x for x in xs]
    ys[5] = ys[40] = 1e9  # two wild readings
    assert trend(xs, ys).slope == pytest.approx(2.0)


def test_median_and_thin_keep_the_newest_point() -> None:
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    xs, _ = thin(steps(1000), steps(1000), 100)
    assert len(xs) == 100
    assert xs[-1] == 1000.0
    assert xs == sorted(xs)


def test_flat_exact_series_is_not_a_leak() -> None:
    result = detect_leak(steps(300), [BASE] * 300)
    assert not result.detected
    assert result.kind == "none"
    assert result.slope_per_x is None


def test_too_few_steps_say_so() -> None:
    result = detect_leak(steps(10), [BASE + i * MIB for i in range(10)])
    assert not result.detected
    assert result.kind == "insufficient"
    assert "need at least" in result.verdict


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(40, 400), noise_mib=st.floats(0.1, 64.0))
def test_noisy_but_flat_series_never_fire(seed: int, n: int, noise_mib: float) -> None:
    rng = random.Random(seed)
    ys = [BASE + rng.gauss(0, noise_mib * MIB) for _ in range(n)]
    assert not detect_leak(steps(n), ys).detected


@FEW
@given(seed=st.integers(0, 10_000), ramp=st.integers(5, 60), height_mib=st.floats(50, 2000))
def test_a_plateau_after_warm_up_is_not_a_leak(seed: int, ramp: int, height_mib: float) -> None:
    # Memory climbs for `ramp` steps (optimizer state, allocator warm-up), then stays: checked at the
    # end of a 300-step run, and on every prefix once the plateau has lasted as long as the climb.
    rng = random.Random(seed)
    ys = [BASE + height_mib * MIB * min(s, ramp) / ramp + rng.gauss(0, MIB) for s in range(1, 301)]
    assert not detect_leak(steps(300), ys).detected
    first, _ = first_detection(steps(300), ys, every=10, after=3 * ramp + 20)
    assert first is None


@SETTINGS
@given(seed=st.integers(0, 10_000), at=st.integers(30, 280), jump_mib=st.floats(20, 4000))
def test_one_long_batch_that_raises_memory_once_is_not_a_leak(seed: int, at: int, jump_mib: float) -> None:
    rng = random.Random(seed)
    ys = [BASE + (jump_mib * MIB if s >= at else 0) + rng.gauss(0, 0.5 * MIB) for s in range(1, 301)]
    assert not detect_leak(steps(300), ys).detected


@SETTINGS
@given(seed=st.integers(0, 10_000))
def test_record_breaking_batch_lengths_are_not_a_leak(seed: int) -> None:
    # Variable sequence lengths: memory kept after a step follows the longest batch seen so far (a
    # cache sized to it), so it rises at each new record, ever more rarely.
    rng = random.Random(seed)
    longest = 0
    ys = []
    for _ in range(400):
        longest = max(longest, rng.randint(64, 2048))
        ys.append(BASE + longest * 64 * 1024)  # 64 KiB per token of the longest batch
    assert not detect_leak(steps(400), ys).detected


@FEW
@given(
    seed=st.integers(0, 10_000),
    start=st.integers(20, 600),
    slope_mib=st.floats(1.0, 64.0),
    noise_mib=st.floats(0.0, 2.0),
)
def test_a_leak_of_1_mib_per_step_or_more_is_caught_within_100_steps(
    seed: int, start: int, slope_mib: float, noise_mib: float
) -> None:
    rng = random.Random(seed)
    n = start + 100
    ys = [BASE + max(0, s - start) * slope_mib * MIB + rng.gauss(0, noise_mib * MIB) for s in range(1, n + 1)]
    assert not detect_leak(steps(start - 1), ys[: start - 1]).detected  # nothing before it began
    caught, result = first_detection(steps(n), ys, every=5, after=start)
    assert caught is not None and result is not None
    assert caught - start <= 100
    final = detect_leak(steps(n), ys)
    assert final.detected
    assert final.slope_per_x == pytest.approx(slope_mib * MIB, rel=0.25)
    assert final.start_x is not None and abs(final.start_x - start) <= 25


def test_a_staircase_leak_from_evaluations_is_caught_with_its_average_slope() -> None:
    # Every 20 steps an eval keeps 32 MiB of logits: 1.6 MiB/step on average, in jumps.
    ys = [BASE + (s // 20) * 32 * MIB for s in range(1, 301)]
    result = detect_leak(steps(300), ys)
    assert result.detected
    assert result.slope_per_x == pytest.approx(1.6 * MIB, rel=0.2)


def test_min_growth_decides_what_matters() -> None:
    ys = [BASE + s * 32 * 1024 for s in range(1, 301)]  # 32 KiB/step: ~9 MiB over the run
    assert not detect_leak(steps(300), ys).detected
    assert detect_leak(steps(300), ys, LeakConfig(min_growth_bytes=4 * MIB)).detected


def test_seconds_as_x_for_a_log_without_steps() -> None:
    xs = [s * 0.5 for s in range(200)]
    ys = [BASE + x * 2 * MIB for x in xs]
    result = detect_leak(xs, ys, unit="s")
    assert result.detected
    assert "/s since" in result.verdict
    assert result.slope_per_x == pytest.approx(2 * MIB)


def test_verdict_and_dict_carry_slope_and_start() -> None:
    ys = [BASE + max(0, s - 100) * MIB for s in range(1, 301)]
    result = detect_leak(steps(300), ys)
    as_dict = result.to_dict()
    assert as_dict["detected"] is True
    assert as_dict["start_x"] == pytest.approx(100, abs=3)
    assert "1.00 MiB/step since step 10" in result.verdict


def test_growth_that_follows_a_length_curriculum_is_not_a_leak() -> None:
    # Sequence length grows through the run; what stays after a step follows the longest batch so far.
    tokens = [256 + 8 * s for s in range(1, 301)]
    ys = [BASE + t * 128 * 1024 for t in tokens]  # 128 KiB per token of the longest batch
    result = detect_leak(steps(300), ys, tokens=tokens)
    assert not result.detected
    assert result.kind == "batch_growth"
    assert "longest batch" in result.verdict
    assert detect_leak(steps(300), ys).detected  # without the token counts it looks like a leak


def test_a_leak_among_variable_lengths_is_still_a_leak() -> None:
    rng = random.Random(7)
    tokens = [rng.randint(64, 2048) for _ in range(300)]
    longest = 0
    ys = []
    for s, t in enumerate(tokens, start=1):
        longest = max(longest, t)
        ys.append(BASE + longest * 16 * 1024 + max(0, s - 100) * 2 * MIB)
    result = detect_leak(steps(300), ys, tokens=tokens)
    assert result.detected
    assert result.slope_per_x == pytest.approx(2 * MIB, rel=0.15)


def test_a_climb_that_stops_is_not_confirmed() -> None:
    # 40 steps of steady growth, then nothing: at step 60 it is not (yet) a leak.
    ys = [BASE + min(s, 40) * 2 * MIB for s in range(1, 61)]
    assert not detect_leak(steps(60), ys).detected
