"""bench/multigpu_compare.py (issue 27): every case of the committed truth grid planned again with the planner as it
is, against what the H200 rehearsed; the committed points.json is what the script writes now, and the planner
meets the issue's goal on it (per-rank peak allocated within 3% median and 8% worst, host under offload within
10% median). Host memory under offload is the RSS growth less the no-offload twin's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "multigpu_compare.py"
GRID = ROOT / "bench" / "results" / "multigpu" / "rehearsal_grid.json"
POINTS = GRID.with_name("points.json")
ISSUE_FIELDS = {"strategy", "world_size", "how", "rank", "arch", "batch", "seq", "offload",
                "measured_peak_allocated_bytes", "planned_peak_allocated_bytes", "measured_host_bytes",
                "planned_host_bytes"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_committed_grid_replans_to_the_committed_points_and_meets_the_goal(tmp_path: Path) -> None:
    out = tmp_path / "points.json"
    proc = _run("--grid", str(GRID), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    points = written["points"]
    grid = json.loads(GRID.read_text())
    assert len(points) == len(grid) == 24
    assert all(p.keys() >= ISSUE_FIELDS for p in points)
    # The table of docs/distributed.md: one row a case.
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| Llama-2-")]
    assert len(rows) == 24 and "(skipped)" not in proc.stdout  # 70B x 8 with offload ran on 2026-12-02
    committed = json.loads(POINTS.read_text())
    assert [p["planned_peak_allocated_bytes"] for p in committed["points"]] == \
        [p["planned_peak_allocated_bytes"] for p in points], "re-run bench/multigpu_compare.py and commit points.json"
    s = written["summary"]
    assert s["allocated"]["points"] == 24 and s["host_under_offload"]["points"] == 11
    assert s["allocated"]["median_abs"] <= 0.03 and s["allocated"]["worst_abs"] <= 0.08
    assert s["host_under_offload"]["median_abs"] <= 0.10
    # counted inside each offloaded case (pinned host blocks + CPU AdamW states): every case within the 10 % goal
    assert s["host_under_offload_counted"]["points"] == 11 and s["host_under_offload_counted"]["worst_abs"] <= 0.10
    # The plan the grid was measured against (HF's autocast precision, not the loop's) was off by more.
    assert s["as_measured"]["allocated"]["worst_abs"] > 0.08


def test_host_under_offload_is_the_rss_growth_less_the_no_offload_twins(tmp_path: Path) -> None:
    grid = json.loads(GRID.read_text())
    pick = [r for r in grid if r["arch"] == "Llama-2-7B" and r["world_size"] == 4 and r["strategy"] == "fsdp"]
    assert {r["offload"] for r in pick} == {"none", "params"}
    lonely = {**next(r for r in grid if r["arch"] == "Llama-2-13B" and r["world_size"] == 2
                     and r["offload"] == "params")}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps([*pick, lonely]))
    proc = _run("--grid", str(path))
    assert proc.returncode == 0, proc.stderr
    points = json.loads((tmp_path / "points.json").read_text())["points"]
    off = next(p for p in points if p["offload"] == "params" and p["arch"] == "Llama-2-7B")
    twin = next(r for r in pick if r["offload"] == "none")
    own = next(r for r in pick if r["offload"] == "params")
    growth = lambda r: r["rss_peak_bytes"] - r["rss_before_wrap_bytes"]  # noqa: E731
    assert off["measured_host_bytes"] == growth(own) - growth(twin)
    assert off["host_baseline_bytes"] == growth(twin) > 500 * 2**20  # the steps' ~0.56 GiB, offload or not
    assert abs(off["host_error"]) < 0.10
    alone = next(p for p in points if p["arch"] == "Llama-2-13B")
    assert alone["measured_host_bytes"] is None and alone["host_error"] is None  # no twin, no figure


def test_a_grid_that_is_not_one_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "grid.json"
    bad.write_text('{"not": "a list"}')
    proc = _run("--grid", str(bad))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "list of case objects" in proc.stderr
    proc = _run("--grid", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "run bench/rehearsal_grid.py first" in proc.stderr
    assert not (tmp_path / "points.json").exists()
