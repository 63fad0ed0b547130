"""``mem.warnings.jsonl`` has one typed owner (issue 23): ``analysis/alerts.ShownWarning``. Its bytes are the file's
of before it: ``tests/data/warnings/`` holds files written by the untyped writer (a real TRL run on a tiny CPU model,
a real ``MemoryMonitor`` watching a planted host leak, and the ``Alerts`` of before at pinned wall-clock times).
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from vramscope.analysis.alerts import Alerts, ShownWarning, read_warnings, warnings_path
from vramscope.integrations.loop import MemoryMonitor
from vramscope.units import MIB

DATA = Path(__file__).parent / "data" / "warnings"
WRITTEN_BEFORE = sorted(DATA.glob("*.warnings.jsonl"))


@pytest.mark.parametrize("path", WRITTEN_BEFORE, ids=lambda p: p.name)
def test_a_file_written_before_reads_back_and_writes_the_same_bytes(path: Path) -> None:
    warnings = read_warnings(path)
    assert warnings and all(isinstance(w, ShownWarning) for w in warnings)
    again = "".join(json.dumps(w.to_json(), separators=(",", ":")) + "\n" for w in warnings)
    assert again.encode("utf-8") == path.read_bytes()


def test_the_writer_writes_the_bytes_the_untyped_writer_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same warnings as ``pinned_times.warnings.jsonl`` (a null step, a step 0, escapes, a 2**40 step), shown at
    the same wall-clock times."""
    times = iter([1796196911.6979685, 1796196912.0, 1796196913.25, 1e10])
    monkeypatch.setattr(time, "time", lambda: next(times))
    path = warnings_path(tmp_path / "mem.csv")
    alerts = Alerts(path=path, stream=None)
    alerts.warn("oom", "out of memory in ~1000 steps", step=10, urgency=1000)
    alerts.warn("caching", "no step yet: the cache holds 3.0 GiB \u00e9 \"quoted\" \\ back", step=None)
    alerts.warn("longest_batch", "tab\there, unicode \u2014 dash", step=0)
    alerts.warn("leak", "leak: 1 MiB/step", step=2**40)
    monkeypatch.undo()
    assert Path(path).read_bytes() == (DATA / "pinned_times.warnings.jsonl").read_bytes()
    assert read_warnings(path) == alerts.history  # what was shown is what is read back, typed


def test_a_monitor_writes_warnings_that_read_back_as_shown(tmp_path: Path) -> None:
    """A real MemoryMonitor over a loop that keeps 2 MiB of host memory a step: its file is its history."""
    kept: list[bytearray] = []
    stream = io.StringIO()
    with MemoryMonitor(log=tmp_path / "mem.csv", analyze_every=10, analyze_min_interval_s=0, analyze_max_share=1.0,
                       warn_stream=stream) as mon:
        for step in range(1, 121):
            if step >= 30:
                kept.append(bytearray(b"x" * (2 * MIB)))
            mon.step(step)
    assert mon.alerts is not None and mon.alerts.history
    saved = read_warnings(tmp_path / "mem.warnings.jsonl")
    assert saved == mon.alerts.history and saved[0].kind == "leak"
    printed = [line for line in stream.getvalue().splitlines() if line.startswith("vramscope: step ")]
    assert [f"vramscope: step {w.step}: {w.message}" for w in saved] == printed


@pytest.mark.parametrize(("line", "said"), [
    ("[1, 2]", "a JSON object, not list"),
    ('{"time": "noon", "step": 1, "kind": "oom", "message": "m"}', "time is a number"),
    ('{"time": 1.5, "step": 1.5, "kind": "oom", "message": "m"}', "step is a whole number or null"),
    ('{"time": 1.5, "step": true, "kind": "oom", "message": "m"}', "step is a whole number or null"),
    ('{"time": 1.5, "step": 1, "kind": "oom"}', "kind and message are text"),
    ("{not json", "line 2"),
])
def test_a_line_that_is_not_a_warning_is_one_error_naming_its_line(tmp_path: Path, line: str, said: str) -> None:
    path = tmp_path / "mem.warnings.jsonl"
    path.write_text('{"time":1.0,"step":null,"kind":"oom","message":"m"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=said) as caught:
        read_warnings(path)
    assert f"{path} line 2: " in str(caught.value) and "\n" not in str(caught.value)
