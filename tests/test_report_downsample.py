"""Min/max bucket thinning: no peak and no trough may disappear, whatever the series."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramscope.report.downsample import minmax_downsample, minmax_indices
from vramscope.report.svg import format_seconds, nice_step, time_step

SERIES = st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)), max_size=3000)


@settings(max_examples=100, deadline=None)
@given(values=SERIES, buckets=st.integers(min_value=1, max_value=200))
def test_every_bucket_keeps_its_extremes(values: list[int | None], buckets: int) -> None:
    keep = minmax_indices(values, buckets)
    assert keep == sorted(set(keep))  # ascending, no repeats: a line drawn left to right
    assert all(values[i] is not None for i in keep)
    known = [v for v in values if v is not None]
    kept = [values[i] for i in keep]
    if not known:
        assert keep == []
        return
    assert max(kept) == max(known)  # type: ignore[type-var]
    assert min(kept) == min(known)  # type: ignore[type-var]
    assert len(keep) <= max(len(known), 2 * buckets + 2)
    n = len(values)
    if n > 2 * buckets:  # each bucket's own maximum survives, not only the global one
        for b in range(buckets):
            part = [v for v in values[b * n // buckets:(b + 1) * n // buckets] if v is not None]
            if part:
                assert max(part) in kept  # type: ignore[type-var]
        first = next(i for i, v in enumerate(values) if v is not None)
        last = max(i for i, v in enumerate(values) if v is not None)
        assert keep[0] == first and keep[-1] == last


def test_a_single_sample_spike_survives_a_million_points() -> None:
    values: list[float | None] = [1.0] * 1_000_000
    values[765_432] = 99.0
    values[123] = -5.0
    keep = minmax_indices(values, 1000)
    assert 765_432 in keep and 123 in keep
    assert len(keep) <= 2002


def test_downsample_pairs_xs_with_ys_and_drops_unknowns() -> None:
    xs = [float(i) for i in range(10)]
    ys: list[float | None] = [1, None, 3, 2, None, 8, 1, 1, 0, 5]
    assert minmax_downsample(xs, ys, buckets=100) == ([0, 2, 3, 5, 6, 7, 8, 9], [1, 3, 2, 8, 1, 1, 0, 5])
    with pytest.raises(ValueError, match="differ in length"):
        minmax_downsample(xs, ys[:3])
    with pytest.raises(ValueError, match="at least 1"):
        minmax_indices(ys, 0)


def test_axis_steps_and_labels_read_well() -> None:
    assert nice_step(100, 5) == 20.0
    assert nice_step(0.7, 5) == 0.2
    assert time_step(3600, 8) == 600.0  # an hour: ticks every 10 minutes
    assert time_step(30, 8) == 5.0
    assert format_seconds(0) == "0:00"
    assert format_seconds(754) == "12:34"
    assert format_seconds(3 * 3600 + 5 * 60) == "3:05:00"
    assert format_seconds(2 * 86400 + 4 * 3600) == "2d 04:00"
