"""Whole columns in numpy (vramscope.analysis.devices, .details, report.downsample): the answers of a plain
pass over the rows, to the byte, the first of equals; and one grouping of devices and phases that the
analysis and the report share.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.analysis.columns import LogColumns
from vramscope.analysis.devices import DeviceRows, device_rows
from vramscope.analysis.leak import detect_leak, median, trend
from vramscope.analysis.summary import analyze, analyze_columns
from vramscope.cli import main
from vramscope.logs.reader import read_log
from vramscope.report.downsample import minmax_indices, minmax_positions
from vramscope.report.json_output import summary_of
from vramscope.report.model import build_report

# Few distinct values: ties everywhere, so "the first of equals" is tested, not only "the largest".
CELLS = st.lists(st.one_of(st.none(), st.integers(min_value=-4, max_value=4)), max_size=300)


def plain_phase_peaks(values: list[int | None], labels: list[str]) -> dict[str, int]:
    """Each label's first row of its largest known value, in order of the label's first known value."""
    best: dict[str, int] = {}
    for j, (v, label) in enumerate(zip(values, labels, strict=True)):
        if v is not None and (label not in best or v > values[best[label]]):  # type: ignore[operator]
            best[label] = j
    return best


@settings(max_examples=200, deadline=None)
@given(values=CELLS, data=st.data())
def test_phase_peaks_are_the_plain_pass(values: list[int | None], data: st.DataObject) -> None:
    n = len(values)
    phases = data.draw(st.lists(st.sampled_from(["train", "eval", None]), min_size=n, max_size=n))
    steps = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 50)), min_size=n, max_size=n))
    cols = LogColumns.from_lists({"allocated_bytes": values, "phase": phases, "step": steps})
    rows = device_rows(cols)
    if not n:
        assert rows == {}
        return
    dev = DeviceRows("host", rows["host"], cols)
    # One rule for a row without a phase: "train" with a step, "run" without one.
    labels = [p or ("train" if s is not None else "run") for p, s in zip(phases, steps, strict=True)]
    assert [dev.label(j) for j in range(n)] == labels
    found = dev.phase_maxima("allocated_bytes")
    assert found == plain_phase_peaks(values, labels)
    assert list(found) == list(plain_phase_peaks(values, labels))  # the same order too
    known = [v for v in values if v is not None]
    top = dev.argmax("allocated_bytes")
    assert (None if top is None else values[top]) == max(known, default=None)
    if known:
        assert top == values.index(max(known))
    stretches = []
    start = 0
    for label, group in itertools.groupby(labels):
        size = len(list(group))
        stretches.append((label, start, start + size))
        start += size
    assert [(s.phase, s.start, s.end) for s in dev.stretches()] == stretches


@settings(max_examples=100, deadline=None)
@given(gpus=st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=60), interleave=st.booleans())
def test_devices_are_grouped_in_order_of_first_appearance(gpus: list[int | None], interleave: bool) -> None:
    if interleave:
        gpus = [g for _ in range(5) for g in dict.fromkeys(gpus)]
    cols = LogColumns.from_lists({"gpu": gpus})
    groups = device_rows(cols)
    plain: dict[str, list[int]] = {}
    for i, g in enumerate(gpus):
        plain.setdefault("host" if g is None else str(g), []).append(i)
    assert list(groups) == list(plain)
    assert {k: np.arange(len(gpus))[sel].tolist() for k, sel in groups.items()} == plain
    if interleave:
        assert all(isinstance(sel, slice) for sel in groups.values())  # views, not copies


@settings(max_examples=200, deadline=None)
@given(values=CELLS, buckets=st.integers(min_value=1, max_value=60))
def test_minmax_of_arrays_is_the_one_of_lists(values: list[int | None], buckets: int) -> None:
    known = np.array([v is not None for v in values], dtype=bool)
    ints = np.array([0 if v is None else v for v in values], dtype=np.int64)
    assert minmax_positions(ints, known, buckets).tolist() == minmax_indices(values, buckets)


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
    assert detect_leak(np.array(xs), np.array(ys)) == detect_leak(xs, ys)


@pytest.fixture(scope="module")
def eval_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Short eval stretches every 50 steps and a planted leak: many phase stretches.
    run = Run(steps=1500, eval_every=50, eval_steps=7, leak_per_step=MIB, leak_from=600, seed=5)
    return write_training_log(tmp_path_factory.mktemp("logs") / "eval.csv", run)


def test_the_report_shows_the_analysis_it_ran_once(eval_log: Path) -> None:
    table = read_log(eval_log)
    alone = analyze(table).to_json()
    report = build_report(table)
    summary = summary_of(report)
    assert report.result.to_json() == alone
    assert summary["leak"] == alone["leak"] and summary["peak"] == alone["peak"]
    assert alone["leak"]["detected"] is True
    # The phases of the analysis' peak and of the report's per-column peaks are the same phases, with the
    # same peak of the same column.
    peak = alone["peak"]["devices"]["0"]
    phases = summary["devices"]["0"]["phases"]
    assert list(peak["phases"]) == list(phases) == ["train", "eval"]
    for label, found in peak["phases"].items():
        mine = phases[label][peak["metric"]]
        assert (mine["bytes"], mine["step"], mine["time"]) == (found["bytes"], found["step"], found["time"])


def test_the_monitors_lists_get_the_analysis_of_the_log(eval_log: Path) -> None:
    table = read_log(eval_log)
    lists: dict[str, Any] = {name: table.ints(name) for name in ("step", "gpu", "allocated_bytes", "reserved_bytes",
                                                                 "peak_allocated_bytes", "device_used_bytes",
                                                                 "device_total_bytes", "tokens",
                                                                 "inactive_split_bytes")}
    lists["elapsed_s"] = table.floats("elapsed_s")
    lists["phase"] = table.strings("phase")
    lists["time"] = table.strings("time")
    live, logged = analyze_columns(lists).to_json(), analyze(table).to_json()
    assert live["leak"] == logged["leak"] and live["forecast"] == logged["forecast"]
    assert live["peak"] == logged["peak"]


def test_a_vramscope_run_log_names_its_rows_the_same_everywhere(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A `vramscope run` log has no steps and no phases: its rows are the command's run, "run" both under
    the analysis' peak and under the report's per-device phases (they once said "untagged" and "run")."""
    log = tmp_path / "run.csv"
    child = "import time\nx = []\nfor _ in range(10):\n    x.append(bytearray(4_000_000)); time.sleep(0.06)\n"
    done = subprocess.run([sys.executable, "-m", "vramscope", "run", "--quiet", "--interval", "0.05", "--log",
                           str(log), "--", sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert main(["report", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    key = data["log"]["devices"][0]
    peak = data["peak"]["devices"][key]
    assert peak["phase"] == "run"
    assert list(peak["phases"]) == ["run"] == list(data["devices"][key]["phases"])
    assert data["devices"][key]["phases"]["run"]["rows"] == data["log"]["rows"]
    found = data["devices"][key]["peaks"][peak["metric"]]
    assert (found["bytes"], found["phase"], found["time"]) == (peak["bytes"], "run", peak["time"])
