"""Whole columns read a stretch at a time (vramscope.analysis.peaks), and the report built on that read.

A report reads each memory column once and combines its stretches' answers; the shortcuts it takes
(steps that rise, a count of zeros, the few stretches that can hold the longest batches' peaks) must
give, to the byte, what a plain pass over the whole column gives: the same values, first of equals.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.analysis import summary
from vramscope.analysis.leak import detect_leak, median, trend
from vramscope.analysis.peaks import ColumnFacts, combine, regroup, runs, stretch_extremes, stretch_maxima, top_and_gap
from vramscope.logfile import read_log
from vramscope.report import model
from vramscope.report.downsample import bucket_cuts, minmax_from_stretches, minmax_indices
from vramscope.report.model import build_report

# Few distinct values: ties everywhere, so "the first of equals" is tested, not only "the largest".
CELLS = st.lists(st.one_of(st.none(), st.integers(min_value=-4, max_value=4)), max_size=300)


def cuts_within(data: st.DataObject, n: int, *required: int) -> list[int]:
    """Ascending cut positions from 0 to n, at least at ``required``, more where hypothesis likes."""
    extra = data.draw(st.lists(st.integers(min_value=0, max_value=n), max_size=40))
    return sorted({0, n, *required, *extra})


@settings(max_examples=200, deadline=None)
@given(values=CELLS, data=st.data())
def test_stretches_combine_to_the_whole_columns_extremes(values: list[int | None], data: st.DataObject) -> None:
    cuts = cuts_within(data, len(values))
    stretches, gap = stretch_extremes(values, cuts)
    maxima, gap_too = stretch_maxima(values, cuts)
    assert gap == gap_too == (None in values)
    assert maxima == [None if s is None else (s[2], s[3]) for s in stretches]
    known = [v for v in values if v is not None]
    found = combine(stretches)
    if not known:
        assert found is None
    else:
        low, high = min(known), max(known)
        assert found == (low, values.index(low), high, values.index(high))
    assert top_and_gap(values) == (max(known, default=None), None in values)


@settings(max_examples=200, deadline=None)
@given(values=CELLS, buckets=st.integers(min_value=1, max_value=60), data=st.data())
def test_buckets_from_finer_stretches_keep_the_same_points(values: list[int | None], buckets: int,
                                                           data: st.DataObject) -> None:
    n = len(values)
    cuts = cuts_within(data, n, *bucket_cuts(n, buckets))
    stretches = stretch_extremes(values, cuts)[0]
    assert minmax_from_stretches(values, buckets, cuts, stretches) == minmax_indices(values, buckets)
    edges = sorted(set(bucket_cuts(n, buckets)))
    for part, (lo, hi) in zip(regroup(stretches, cuts, edges), itertools.pairwise(edges), strict=True):
        known = [(v, lo + i) for i, v in enumerate(values[lo:hi]) if v is not None]
        top = combine(part)
        assert (top[2] if top else None) == max((v for v, _ in known), default=None)


@given(labels=st.lists(st.sampled_from(["train", "eval", None]), max_size=100), limit=st.integers(0, 30))
def test_runs_of_labels(labels: list[str | None], limit: int) -> None:
    expected = []
    start = 0
    for label, group in itertools.groupby(labels):
        size = len(list(group))
        expected.append((label, start, start + size))
        start += size
    assert runs(labels) == expected
    assert runs(labels, limit) == (expected if len(expected) <= limit else None)
    facts = ColumnFacts()
    assert facts.runs(labels, limit) == runs(labels, limit)
    assert facts.runs(labels) == expected  # a limit met first does not stand in for the whole answer


@settings(max_examples=200, deadline=None)
@given(values=CELLS, rising=st.booleans())
def test_column_facts_are_the_plain_answers(values: list[int | None], rising: bool) -> None:
    if rising:
        values = list(range(len(values)))
    known = [v for v in values if v is not None]
    facts = ColumnFacts()
    is_rising = facts.rising(values)
    assert is_rising == (bool(values) and None not in values and all(a < b for a, b in itertools.pairwise(values)))
    assert facts.top(values) == max(known, default=None)
    assert facts.low(values) == min(known, default=None)
    assert facts.gap(values) == (None in values)


def test_column_facts_know_a_column_by_identity() -> None:
    facts = ColumnFacts()
    column = [3, 1, 2]
    assert facts.read(column, [0, 2, 3]) == [(1, 1, 3, 0), (2, 2, 2, 2)]
    assert facts.stretches(column) == ([0, 2, 3], [(1, 1, 3, 0), (2, 2, 2, 2)])
    assert facts.stretches(list(column)) is None  # an equal list is another column
    assert facts.top(column) == 3 and facts.gap(column) is False


def pairwise_trend(xs: list[float], ys: list[float]) -> tuple[float, int]:
    """Theil-Sen slope and the Mann-Kendall sum, one pair at a time."""
    slopes, s = [], 0
    for i, j in itertools.combinations(range(len(xs)), 2):
        dy = ys[j] - ys[i]
        s += (dy > 0) - (dy < 0)
        if xs[j] != xs[i]:
            slopes.append(dy / (xs[j] - xs[i]))
    return (median(slopes) if slopes else 0.0), s


NUMBERS = st.one_of(st.integers(-50, 50), st.sampled_from([0.5, 1.0, 1.0, 2.25]),
                    st.floats(allow_nan=False, allow_infinity=False, width=32))


@settings(max_examples=200, deadline=None)
@given(points=st.lists(st.tuples(NUMBERS, NUMBERS), max_size=40))
def test_trend_is_the_pairwise_one(points: list[tuple[float, float]]) -> None:
    xs, ys = [x for x, _ in points], [y for _, y in points]
    slope, s = pairwise_trend(xs, ys)
    found = trend(xs, ys)
    assert found.slope == slope or (math.isnan(found.slope) and math.isnan(slope))
    assert (found.z > 0) == (s > 1) and (found.z < 0) == (s < -1)


def test_a_caller_that_knows_x_rises_gets_the_same_leak_verdict() -> None:
    xs = list(range(400))
    ys = [1e9 + (2 * MIB * (x - 150) if x > 150 else 0) + (x % 7) * 1e5 for x in xs]
    assert detect_leak(xs, ys, rising=True) == detect_leak(xs, ys)


@pytest.fixture(scope="module")
def eval_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Short eval stretches every 50 steps and a planted leak: many phase stretches, every path taken.
    run = Run(steps=1500, eval_every=50, eval_steps=7, leak_per_step=MIB, leak_from=600, seed=5)
    return write_training_log(tmp_path_factory.mktemp("logs") / "eval.csv", run)


def report_of(path: Path, buckets: int) -> dict[str, Any]:
    report = build_report(read_log(path), buckets=buckets)
    return {"summary": report.summary, "devices": [dataclasses.asdict(d) for d in report.devices]}


@pytest.mark.parametrize("buckets", [7, 40, 1500])
def test_a_report_read_by_stretches_is_the_one_read_phase_by_phase(eval_log: Path, buckets: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fast = report_of(eval_log, buckets)
    # Phases that "change too often": each phase's rows are picked whole, the longest batches by length.
    monkeypatch.setattr(model, "MIN_RUN_ROWS", 10**9)
    monkeypatch.setattr(summary, "MIN_RUN_ROWS", 10**9)
    monkeypatch.setattr(model, "RANK_CUT_ROWS", 0)  # and the rows that cannot rank dropped first
    monkeypatch.setattr(model, "RANK_CHUNK", 2)
    assert report_of(eval_log, buckets) == fast
    assert fast["summary"]["leak"]["detected"] is True


def test_longest_batches_from_the_peak_stretches_are_the_ranked_ones(eval_log: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fast = report_of(eval_log, 40)
    monkeypatch.setattr(model._Device, "_rank_longest", lambda self, metric: None)
    assert report_of(eval_log, 40) == fast
    assert len(fast["summary"]["devices"]["0"]["longest_batches"]) == model.LONGEST_BATCHES


def test_the_analysis_gives_the_same_answer_with_the_reports_facts(eval_log: Path) -> None:
    table = read_log(eval_log)
    alone = summary.analyze(table).to_json()
    report = build_report(table)
    assert summary.analyze(table).to_json() == alone
    assert report.summary["leak"] == alone["leak"] and report.summary["peak"] == alone["peak"]
