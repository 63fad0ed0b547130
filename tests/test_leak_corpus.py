"""The leak detector over every recorded trace in tests/data/traces/ (real training runs).

Each trace is a MemoryMonitor log of a real run (``bench/record_traces.py``: CPU traces read host RSS,
H200 traces the CUDA allocator) with a ``.truth.json`` saying what was planted and from which step.
The test replays each trace as the live monitor sees it (the leak test on every prefix, every 5
steps), with the thresholds and the per-signal warm-up that ``analyze`` uses:

* a clean trace never fires, at any prefix, and its final verdict is not a leak;
* a planted leak never fires before it began; one of 1 MiB/step or more is caught within 100 steps,
  and the final analysis reports it with a slope near the planted one.

docs/leak-detection.md has the same replay as a table (``python bench/leak_table.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vramscope.analysis.leak import first_detection
from vramscope.analysis.summary import analyze, config_for, leak_series
from vramscope.logs.reader import read_log
from vramscope.logs.table import step_series

TRACES = Path(__file__).parent / "data" / "traces"
MIB = 1024 * 1024
EVERY = 5


def _traces() -> list[Path]:
    return sorted(p for p in TRACES.rglob("*.csv") if p.with_name(p.stem + ".truth.json").is_file())


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_the_corpus_has_clean_and_leaking_traces_of_both_integrations() -> None:
    truths = [json.loads(p.with_name(p.stem + ".truth.json").read_text()) for p in _traces()]
    assert sum(t["leak"] for t in truths) >= 4
    assert sum(not t["leak"] for t in truths) >= 4
    assert {t["integration"] for t in truths} == {"loop", "hf"}


def _replay(path: Path) -> tuple[dict[str, Any], float | None, dict[str, Any]]:
    truth = json.loads(path.with_name(path.stem + ".truth.json").read_text())
    table = read_log(path)
    series = sorted(leak_series(table).values(), key=lambda s: (s.signal != "allocated_bytes", -len(s.xs)))[0]
    assert series.signal == truth["signal"], "the trace must be analysed on the signal it was recorded for"
    first, _ = first_detection(series.xs, series.ys, every=EVERY, config=config_for(series.signal),
                               tokens=series.tokens)
    return truth, first, analyze(table).to_json()["leak"]["devices"][series.key]


def _observed_growth_per_step(path: Path, signal: str, start: int) -> float:
    xs, ys = step_series(read_log(path), signal, 0 if signal != "host_rss_bytes" else None)
    after = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= start]
    (x0, y0), (x1, y1) = after[0], after[-1]
    return (y1 - y0) / (x1 - x0)


@pytest.mark.parametrize("path", _traces(), ids=_id)
def test_trace(path: Path) -> None:
    truth, first, final = _replay(path)
    if not truth["leak"]:
        assert first is None, f"false alarm at step {first}: {final['verdict']}"
        assert not final["detected"]
        return
    start = truth["leak_start_step"]
    assert first is not None, f"planted leak never detected; final verdict: {final['verdict']}"
    assert first >= start, f"fired at step {first}, before the leak began at {start}"
    planted = truth["planted_bytes_per_step"]
    if planted >= MIB:
        assert first - start <= 100, f"caught {first - start} steps after it began"
        assert final["detected"]
        slope = final["slope_bytes_per_step"]
        if truth["leak_kind"] == "loss_graph":
            # A loss kept without .item() keeps its whole autograd graph (saved activations), which the
            # recorder cannot size: its planted figure counts the loss tensors only, a lower bound. Hold
            # the slope against the growth the trace itself shows after the leak began instead.
            observed = _observed_growth_per_step(path, truth["signal"], start)
            assert slope >= 0.6 * planted
            assert 0.6 * observed <= slope <= 1.6 * observed
        else:
            assert 0.6 * planted <= slope <= 1.6 * planted
        assert abs(final["start_step"] - start) <= 50
