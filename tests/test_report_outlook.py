"""Page, terminal and ``--json`` say the same thing about running out of memory (issue 25, "the answers must agree"):
one verdict, judged once in the analysis (``forecast.outlook``), drawn as it is by each.

Driven through the real CLI on real files: nvidia-smi's own CSV (``--query-gpu=... --format=csv -l 5``, a line
every five seconds, memory rising), and a log written by vramscope's sampler (test_report_fixtures).
"""

from __future__ import annotations

import html
import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.cli import main

SMI_HEADER = "timestamp, index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
CARD = re.compile(r'<div class="card[^"]*"[^>]*><div class="k">OOM forecast</div><div class="v">(.*?)</div>'
                  r'<div class="d">(.*?)</div>')


def write_smi(path: Path, samples: int, first_mib: int, per_sample_mib: int, total_mib: int = 81920) -> Path:
    """What ``nvidia-smi --query-gpu=timestamp,index,name,memory.used,memory.total,utilization.gpu --format=csv
    -l 5`` writes on one A100 80GB: a line every 5 s (its stamps drift by a few ms), memory.used rising
    ``per_sample_mib`` a line."""
    start = datetime(2026, 12, 1, 8, 0, 0)
    lines = [SMI_HEADER]
    for i in range(samples):
        stamp = start + timedelta(seconds=5 * i, milliseconds=(i * 7) % 40)
        lines.append(f"{stamp:%Y/%m/%d %H:%M:%S}.{stamp.microsecond // 1000:03d}, 0, NVIDIA A100-SXM4-80GB, "
                     f"{first_mib + per_sample_mib * i} MiB, {total_mib} MiB, 97 %")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def three_ways(tmp_path: Path, capsys: pytest.CaptureFixture[str], log: Path,
               *extra: str) -> tuple[dict[str, Any], str, tuple[str, str]]:
    """The report's JSON, its terminal text (one line: rich wraps at the console's width) and the page's OOM card."""
    capsys.readouterr()
    assert main(["report", str(log), "--json", *extra]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["report", str(log), *extra]) == 0
    text = " ".join(capsys.readouterr().out.split())
    page = tmp_path / f"{log.stem}.html"
    assert main(["report", str(log), "--html", str(page), *extra]) == 0
    cards = CARD.findall(page.read_text(encoding="utf-8"))
    assert len(cards) == 1, cards
    value, detail = (html.unescape(c) for c in cards[0])
    return data, text, (value, detail)


def agree(data: dict[str, Any], text: str, card: tuple[str, str]) -> dict[str, Any]:
    """The outlook of ``--json`` is the page's card and the terminal's line, word for word."""
    outlook: dict[str, Any] = data["forecast"]["outlook"]
    assert card == (outlook["headline"], outlook["detail"])
    assert f"OOM forecast: {outlook['headline']} · {' '.join(outlook['detail'].split())}" in text
    return outlook


def test_an_nvidia_smi_log_that_runs_out_in_minutes_says_so_on_the_page_as_in_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 15 MiB/s for 10 minutes; about 4 minutes from the allocator's usable 97% of 80 GiB.
    log = write_smi(tmp_path / "smi.csv", samples=120, first_mib=66_900, per_sample_mib=75)
    data, text, card = three_ways(tmp_path, capsys, log)
    outlook = agree(data, text, card)
    forecast = data["forecast"]
    assert forecast["steps_to_oom"] is None  # a log without steps counts no steps
    assert 3.5 * 60 < forecast["seconds_to_oom"] < 4.5 * 60
    assert outlook["kind"] == "leak" and outlook["level"] == "high"
    assert outlook["headline"] == "out of memory in about 4 min"
    assert "no OOM ahead" not in card[0] and "step" not in card[0] + card[1]
    assert data["oom_severity"]["level"] == "high"
    assert "GPU 0: at this rate the run runs out of memory in about 4 min" in data["warnings"]


def test_a_log_without_steps_too_short_to_test_speaks_of_samples_and_time(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_smi(tmp_path / "short.csv", samples=60, first_mib=60_000, per_sample_mib=150)
    data, text, card = three_ways(tmp_path, capsys, log)
    outlook = agree(data, text, card)
    verdict = data["leak"]["verdict"]
    assert verdict == ("not enough samples to test for a leak: 60 samples (5 min at 5 s), "
                       "need at least 66 (5.5 min)")
    assert f"leak test: {verdict}" in text
    assert outlook["kind"] == "unknown" and outlook["headline"] == "no forecast yet"
    assert "step" not in outlook["headline"] + outlook["detail"]


def test_a_capacity_below_what_the_log_holds_says_so_not_zero_steps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_smi(tmp_path / "flat.csv", samples=100, first_mib=10_445, per_sample_mib=0)  # 10.2 GiB held
    data, text, card = three_ways(tmp_path, capsys, log, "--gpu-memory", "8GiB")
    outlook = agree(data, text, card)
    said = "--gpu-memory 8GiB is below the 10.2 GiB this log already holds on GPU 0"
    assert outlook == {"kind": "over_capacity", "headline": "does not fit the capacity given", "detail": said,
                       "level": "high", "key": "0"}
    assert said in data["warnings"]
    assert "~0 steps" not in text and "0 steps" not in json.dumps(data)
    assert "the peak is 2.20 GiB over it" in text  # not "headroom -2.20 GiB (-28%)"
    assert any(r["title"] == "Fit the run into the capacity given" and said in r["detail"]
               for r in data["recommendations"])


def test_a_vramscope_log_with_steps_counts_steps_the_same_everywhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_training_log(tmp_path / "qlora-7b-bs4.csv", Run(steps=1500, leak_per_step=3 * MIB, leak_from=600))
    data, text, card = three_ways(tmp_path, capsys, log)
    outlook = agree(data, text, card)
    steps = data["forecast"]["steps_to_oom"]
    assert outlook["kind"] == "leak"
    assert outlook["headline"].startswith(f"out of memory in ~{steps:,.0f} steps (about ")
    leak = next(r for r in data["recommendations"] if r["title"].startswith("Find what keeps memory"))
    assert f"at this rate it runs {outlook['headline']}" in leak["detail"]


def test_a_flat_vramscope_log_has_no_oom_ahead_in_all_three(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = write_training_log(tmp_path / "flat.csv", Run(steps=800))
    data, text, card = three_ways(tmp_path, capsys, log)
    outlook = agree(data, text, card)
    assert outlook["kind"] == "none" and outlook["headline"] == "no OOM ahead"
    assert data["forecast"]["steps_to_oom"] is None
