"""The H200 benchmarks run end to end: each script in its CPU ``--tiny`` mode, as a subprocess.

What this protects: a benchmark that breaks on the GPU machine costs scarce device time, so every
script must run here first, write its JSON with the environment and every repetition, record a
missing source (no NVML, no nvidia-smi) as unavailable instead of failing, and feed the page
generator. The numbers themselves are not checked: a benchmark measures, it does not assert a time.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
SCRIPTS = ("overhead", "reading_cost", "peak_capture")

sys.path.insert(0, str(BENCH))  # the scripts import their shared helpers as `common`

import common  # noqa: E402
import make_benchmarks_md  # noqa: E402
import reading_cost  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU mode, even on a machine with a GPU
    return env


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs the three scripts at once (each imports torch/transformers, which alone takes seconds)."""
    out = tmp_path_factory.mktemp("bench-results")
    checkpoints = tmp_path_factory.mktemp("bench-checkpoints")
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                str(BENCH / f"{name}.py"),
                "--tiny",
                "--out",
                str(out),
                *(["--checkpoint-root", str(checkpoints)] if name != "reading_cost" else []),
            ],
            cwd=REPO,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in SCRIPTS
    }
    failures = []
    for name, proc in procs.items():
        try:
            _, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{name}.py exited {proc.returncode}:\n{stderr[-3000:]}")
    assert not failures, "\n\n".join(failures)
    return out


def _load(out: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_result_records_its_environment(results: Path, name: str) -> None:
    data = _load(results, name)
    assert data["benchmark"] == name
    assert data["mode"] == "tiny"
    env = data["environment"]
    assert env["date"] and env["device"]["kind"] == "cpu"
    assert env["versions"]["torch"] and "transformers" in env["versions"]
    assert env["nvml"]["available"] is False or env["nvml"]["driver_version"]


@pytest.mark.slow
def test_overhead_times_every_arm_in_interleaved_blocks(results: Path) -> None:
    data = _load(results, "overhead")
    timed = [s for s in data["steps"] if s["kind"] == "timed"]
    for arm in data["arms"]:
        per_block = Counter(s["block"] for s in timed if s["arm"] == arm)
        assert per_block and set(per_block) == set(range(data["protocol"]["blocks"]))
    assert all(s["seconds"] > 0 for s in data["steps"])
    # vramscope's own arms get an overhead figure, or say why they could not run.
    for arm in ("hf_callback", "run_10hz"):
        assert arm in data["step_time_overhead_pct"] or arm in data["unavailable"]
    if shutil.which("nvidia-smi") is None:
        assert "nvidia-smi" in data["unavailable"]["nvidia_smi_every_step"]
    # The arms' own time inside their hooks, step by step and per arm, beside the step-time ratio.
    assert all(0 <= s["hook_seconds"] < s["seconds"] and s["hook_cpu_seconds"] >= 0 for s in data["steps"])
    for arm in data["arms"]:
        hooks = data["hook_seconds"][arm]
        assert hooks["n"] == len([s for s in timed if s["arm"] == arm])
        assert 0 <= hooks["median"] <= hooks["p95"] <= hooks["max"]
        assert arm == "none" or data["hook_pct_of_step"][arm] >= 0
    if "loop_monitor" in data["arms"]:  # a CSV row per step is more work than four empty calls
        assert data["hook_seconds"]["loop_monitor"]["median"] > data["hook_seconds"]["none"]["median"]


@pytest.mark.slow
def test_reading_cost_records_missing_sources_as_unavailable(results: Path) -> None:
    sources = _load(results, "reading_cost")["sources"]
    assert set(sources) == {name for name, _, _ in reading_cost.SOURCES}
    host = sources["vramscope_host"]
    assert host["available"] and len(host["seconds"]) == host["summary_s"]["n"] > 0
    for name, entry in sources.items():
        assert entry["available"] or entry["reason"], name
    assert not sources["torch_memory_stats"]["available"]  # no CUDA in the tiny mode


@pytest.mark.slow
def test_peak_capture_reports_every_method(results: Path) -> None:
    data = _load(results, "peak_capture")
    methods = {m["method"]: m for m in data["methods"]}
    assert {"vramscope_step_aligned", "vramscope_sampler_10hz", "nvidia_smi_l1", "average_15s"} <= set(methods)
    assert set(data["passes"]) == {"reference_1", "step_aligned", "sampler_10hz", "reference_2"}
    assert data["truth"]["max_allocated_bytes"] is None  # torch's counter needs CUDA
    for entry in methods.values():
        assert entry["reported_bytes"] is not None or entry["reason"]


@pytest.mark.slow
def test_page_is_generated_from_the_results(results: Path, tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    args = ["--results", str(results), "--doc", str(page), "--template", str(REPO / "docs" / "benchmarks.md")]
    assert make_benchmarks_md.main(args) == 2  # a tiny run is not a measurement...
    assert make_benchmarks_md.main([*args, "--allow-tiny"]) == 0  # ...unless asked for
    text = page.read_text(encoding="utf-8")
    assert "not measured yet" not in text
    assert "| vramscope HF callback, every step |" in text or "hf_callback" in text
    assert "`vramscope_host`" in text and "`vramscope_step_aligned`" in text
    assert text.count("<!-- BEGIN GENERATED:") == text.count("<!-- END GENERATED:") == 7


def test_williams_orders_balance_who_follows_whom() -> None:
    for n in (2, 5, 6):
        rows = common.williams_orders(n)
        assert all(sorted(row) == list(range(n)) for row in rows)
        pairs = Counter((a, b) for row in rows for a, b in itertools.pairwise(row))
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1


def test_summary_is_robust_to_one_slow_repetition() -> None:
    summary = common.summarize([1.0, 1.0, 1.01, 0.99, 9.0])
    assert summary["median"] == 1.0 and summary["n"] == 5 and summary["max"] == 9.0
    assert common.summarize([])["median"] is None


def test_copied_table_takes_the_table_under_the_named_heading(tmp_path: Path) -> None:
    doc = tmp_path / "planner.md"
    doc.write_text(
        "# Planner\n\n## How it works\n| a |\n|---|\n| x |\n\n## Accuracy on the H200\n\ntext\n\n"
        "| model | error |\n|---|---|\n| 7B | 2 % |\n\n## Next\n| b |\n",
        encoding="utf-8",
    )
    copied = make_benchmarks_md.copied_table(doc, "accuracy")
    assert "| 7B | 2 % |" in copied and "| x |" not in copied and "| b |" not in copied
    assert "no heading" in make_benchmarks_md.copied_table(doc, "trial")
    assert "Not written yet" in make_benchmarks_md.copied_table(tmp_path / "absent.md", "trial")


def test_tuner_tables_come_from_every_tune_compare_result(tmp_path: Path) -> None:
    result = {
        "settings": {"model": "TinyLlama-1.1B", "seq_len": 1024, "memory_limit_bytes": 8 * 2**30, "tiny": False},
        "true_max": 13,
        "methods": [
            {"method": "vramscope", "batch": 13, "off_by": 0, "trials": 3, "steps": 3, "oom_steps": 0, "seconds": 4.2},
            {
                "method": "accelerate",
                "batch": None,
                "off_by": None,
                "trials": 20,
                "steps": 20,
                "oom_steps": 19,
                "seconds": 30.0,
            },
        ],
    }
    (tmp_path / "tune-1b").mkdir()
    (tmp_path / "tune-1b" / "tune_compare.json").write_text(json.dumps(result), encoding="utf-8")
    text = make_benchmarks_md.tuner_section(tmp_path, allow_tiny=False)
    assert "**13**" in text and "| vramscope | 13 | 0 | 3 | 3 | 0 |" in text and "| accelerate | failed |" in text
    result["settings"]["tiny"] = True
    (tmp_path / "tune-1b" / "tune_compare.json").write_text(json.dumps(result), encoding="utf-8")
    assert "Not measured on the GPU yet" in make_benchmarks_md.tuner_section(tmp_path, allow_tiny=False)
