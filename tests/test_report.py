"""`vramscope report`: the answers it gives on real logs, and its refusals on bad input.

Logs are written by vramscope's own sampler and sinks (test_report_fixtures), by a real `vramscope run`
child process, and in nvidia-smi's own CSV format.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from test_report_fixtures import GIB, MIB, Run, write_nvidia_smi_log, write_training_log
from vramscope.analysis.details import _imbalance
from vramscope.analysis.results import SCHEMA_VERSION, RankPeak
from vramscope.analysis.verdicts import batches_note, device_idle, headroom_level, imbalance_notable
from vramscope.cli import main
from vramscope.logs.reader import read_log
from vramscope.report.figures import detail_of, devices_of, oom_severity
from vramscope.report.hover import hover_buckets
from vramscope.report.html import render_html
from vramscope.report.json_output import summary_of
from vramscope.report.load import report_file
from vramscope.report.model import build_report
from vramscope.report.plan_check import read_plan
from vramscope.report.terminal import device_heading, print_report, rank_heading

VRAMSCOPE = [sys.executable, "-m", "vramscope"]
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("logs")
    return {
        # 3 MiB more stays allocated after every step from step 400 on: a leak to find.
        "leak": write_training_log(root / "leak.csv", Run(steps=1000, leak_per_step=3 * MIB, leak_from=400)),
        "clean": write_training_log(root / "clean.csv", Run(steps=1000, seed=3)),
        # The same run with activations a third smaller (gradient checkpointing, say).
        "smaller": write_training_log(root / "smaller.csv", Run(steps=1000, seed=3, bytes_per_token=MIB * 2 // 3)),
        "two_gpus": write_training_log(root / "two.jsonl", Run(steps=300, gpus=2)),
    }


def report_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["report", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_analysis_keys_and_finds_the_planted_leak(capsys: pytest.CaptureFixture[str],
                                                               logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["leak"]))
    assert {"leak", "peak", "forecast", "devices", "log", "recommendations"} <= data.keys()
    leak = data["leak"]
    assert leak["detected"] is True
    assert leak["slope_bytes_per_step"] == pytest.approx(3 * MIB, rel=0.1)
    assert 380 <= leak["start_step"] <= 480
    assert data["forecast"]["steps_to_oom"] is not None and data["forecast"]["steps_to_oom"] > 0
    assert data["recommendations"][0]["urgent"] or any(r["urgent"] for r in data["recommendations"])
    assert any("keeps memory" in r["title"] for r in data["recommendations"])


def test_clean_run_has_no_leak_and_no_oom_forecast(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["clean"]))
    assert data["leak"]["detected"] is False
    assert data["forecast"]["steps_to_oom"] is None
    assert not any("keeps memory" in r["title"] for r in data["recommendations"])


def test_peaks_per_gpu_and_phase_match_the_log(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["clean"]))
    table = read_log(logs["clean"])
    gpu = data["devices"]["0"]
    peaks = table.ints("peak_allocated_bytes")
    top = max(v for v in peaks if v is not None)
    row = peaks.index(top)
    assert gpu["peaks"]["peak_allocated_bytes"]["bytes"] == top
    assert gpu["peaks"]["peak_allocated_bytes"]["step"] == table.ints("step")[row]
    assert gpu["peaks"]["peak_allocated_bytes"]["time"] == table.strings("time")[row]
    # Eval holds 3 GiB more at its peak in this run; the per-phase peaks must say so, and the advice too.
    phases = gpu["phases"]
    assert set(phases) == {"train", "eval"}
    eval_peak = phases["eval"]["peak_allocated_bytes"]["bytes"]
    train_peak = phases["train"]["peak_allocated_bytes"]["bytes"]
    assert eval_peak - train_peak > 2 * GIB
    assert any("evaluation" in r["title"] for r in data["recommendations"])
    # Headroom: the capacity less the device's peak.
    used = max(v for v in table.ints("device_used_bytes") if v is not None)
    assert gpu["capacity_bytes"] == 24 * GIB
    assert gpu["headroom_bytes"] == 24 * GIB - used


def test_fragmentation_compares_reserved_with_the_largest_demand(capsys: pytest.CaptureFixture[str],
                                                                 logs: dict[str, Path]) -> None:
    frag = report_json(capsys, str(logs["clean"]))["devices"]["0"]["fragmentation"]
    at = frag["at_peak_reserved"]
    # The fixture's allocator keeps 5% over the largest peak, rounded to 2 MiB blocks.
    assert at["unused_fraction"] == pytest.approx(0.05 / 1.05, abs=0.01)
    assert frag["measured_against"] == "peak_allocated_bytes"
    assert frag["inactive_split_max_bytes"] > 0
    assert "reserved" in frag["verdict"]


def test_longest_batches_are_the_ones_with_most_tokens(capsys: pytest.CaptureFixture[str],
                                                       logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["clean"]))
    batches = data["devices"]["0"]["longest_batches"]
    table = read_log(logs["clean"])
    most = max(t for t in table.ints("tokens") if t is not None)
    assert len(batches) == 5
    assert all(b["tokens"] == most for b in batches)
    peaks = [b["peak_allocated_bytes"] for b in batches]
    assert peaks == sorted(peaks, reverse=True)


def test_two_gpus_from_jsonl(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["two_gpus"]))
    assert data["log"]["format"] == "jsonl"
    assert sorted(data["devices"]) == ["0", "1"]
    assert set(data["peak"]["devices"]) == {"0", "1"}


def test_two_logs_side_by_side(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["clean"]), str(logs["smaller"]))
    assert [log["log"]["path"] for log in data["logs"]] == [str(logs["clean"]), str(logs["smaller"])]
    rows = {row["figure"]: row for row in data["comparison"]}
    peak = rows["peak allocated"]
    assert peak["values"][1] < peak["values"][0]
    assert peak["changes"][0] is None and -0.5 < peak["changes"][1] < -0.1
    # The terminal version names both logs in one table.
    assert main(["report", str(logs["clean"]), str(logs["smaller"])]) == 0
    out = capsys.readouterr().out
    assert "side by side" in out
    assert "clean.csv" in out and "smaller.csv" in out


def test_json_carries_its_schema_version_on_top(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    # A real H200 log (two GPUs, one idle): the version is the first key, once, above the summary.
    h200 = Path(__file__).parent / "data" / "traces" / "h200" / "clean_eval.csv"
    data = report_json(capsys, str(h200))
    assert next(iter(data)) == "schema_version" and data["schema_version"] == SCHEMA_VERSION == 1
    assert data["log"]["path"] == str(h200) and set(data["devices"]) == {"0", "1"}
    # Several logs: one version for the document, none inside each log's summary.
    several = report_json(capsys, str(h200), str(logs["clean"]))
    assert list(several) == ["schema_version", "logs", "comparison"] and several["schema_version"] == 1
    assert all("schema_version" not in log for log in several["logs"])


def test_terminal_summary_answers_the_questions(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    assert main(["report", str(logs["leak"])]) == 0
    out = capsys.readouterr().out
    for expected in ("GPU 0", "capacity 24.00 GiB", "headroom at the peak", "peaks by phase", "eval",
                     "leak test: leak", "OOM forecast: out of memory in", "longest batches", "recommendations"):
        assert expected in out, expected


def test_nvidia_smi_log_reports_per_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_nvidia_smi_log(tmp_path / "smi.csv", rows=90, gpus=2, truncate_last=True)
    data = report_json(capsys, str(path))
    assert data["log"]["format"] == "nvidia-smi"
    assert data["log"]["rows"] == 179
    gpu1 = data["devices"]["1"]
    assert gpu1["capacity_bytes"] == 24564 * MIB
    assert gpu1["peaks"]["device_used_bytes"]["bytes"] == (800 + 60 * 300 + 1000 + 6 * 40) * MIB
    assert data["log"]["duration_s"] == pytest.approx(89.0 + 0.293, abs=0.01)  # 1:29.293 - 0:00.000


def test_log_of_a_real_vramscope_run(tmp_path: Path) -> None:
    """A real child under `vramscope run`; no GPU here, so the report is about host memory."""
    log = tmp_path / "run.csv"
    child = "import time; b = [bytearray(20_000_000) for _ in range(6) if not time.sleep(0.1)]; time.sleep(0.3)"
    done = subprocess.run([*VRAMSCOPE, "run", "--quiet", "--log", str(log), "--interval", "0.05", "--",
                           sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = subprocess.run([*VRAMSCOPE, "report", str(log), "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    device = next(iter(data["devices"].values()))
    assert device["peaks"]["host_rss_bytes"]["bytes"] > 120_000_000
    assert data["log"]["duration_s"] > 0.5
    html = tmp_path / "run.html"
    assert main(["report", str(log), "--html", str(html)]) == 0
    assert "host RSS" in html.read_text()


def test_html_is_self_contained_and_escapes_what_the_log_says(tmp_path: Path) -> None:
    hostile = "<script>document.title='owned'</script><img src=x onerror=alert(1)>"
    folder = tmp_path / "<b>runs&co"
    folder.mkdir()
    log = write_training_log(folder / "m.csv", Run(steps=120, eval_every=60, eval_steps=10, eval_phase=hostile))
    out = tmp_path / "r.html"
    assert main(["report", str(log), "--html", str(out)]) == 0
    page = out.read_text()
    assert hostile not in page
    assert "&lt;script&gt;document.title=&#x27;owned&#x27;&lt;/script&gt;" in page
    assert "<b>runs" not in page and "&lt;b&gt;runs&amp;co" in page
    # Parsed as a browser would: the hostile text made no element, and nothing on the page is fetched.
    tags = Tags()
    tags.feed(page)
    assert not {"script", "img", "link", "iframe", "object", "embed"} & tags.names
    assert not {"src", "href", "onerror", "onload"} & tags.attributes
    assert "@import" not in page and "url(" not in page
    assert set(re.findall(r"https?://[^\"' )<]+", page)) == {"http://www.w3.org/2000/svg"}  # a namespace only


class Tags(HTMLParser):
    """Every element name and attribute name on a page."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.add(tag)
        self.attributes.update(name for name, _ in attrs)


@pytest.mark.slow
def test_html_stays_small_and_keeps_the_peak(tmp_path: Path) -> None:
    """20k samples with one short spike: the page is small, and the spike is still drawn."""
    log = write_training_log(tmp_path / "long.csv", Run(steps=20_000, eval_every=0, seconds_per_step=0.1))
    lines = log.read_bytes().decode().split("\r\n")
    spike_row = lines[13_337].split(",")
    spike_row[4] = str(23 * GIB)  # allocated_bytes: a 23 GiB spike in one sample
    lines[13_337] = ",".join(spike_row)
    log.write_bytes("\r\n".join(lines).encode())
    report = build_report(read_log(log))
    allocated = next(line for line in report.devices[0].timeline.lines if line.metric == "allocated_bytes")
    assert max(allocated.ys) == 23 * GIB
    assert len(allocated.xs) <= 2 * 1500 + 2
    out = tmp_path / "long.html"
    assert main(["report", str(log), "--html", str(out)]) == 0
    assert out.stat().st_size < 1_000_000
    assert log.stat().st_size > 3_000_000


@pytest.mark.slow
def test_png_is_written(tmp_path: Path, logs: dict[str, Path]) -> None:
    out = tmp_path / "r.png"
    assert main(["report", str(logs["leak"]), str(logs["clean"]), "--png", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 1500 and height > 600  # two logs side by side, two charts each
    from PIL import Image

    with Image.open(out) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # lines, bands and text, not a blank canvas


def test_rich_markup_in_the_log_is_printed_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_training_log(tmp_path / "m.csv", Run(steps=60, eval_every=30, eval_steps=5, eval_phase="[red]x[/red]"))
    assert main(["report", str(log)]) == 0
    assert "[red]x[/red]" in capsys.readouterr().out


# -- bad input: one line, exit 2, no traceback, nothing written ---------------------------------------


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["report", *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("vramscope: error: ")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert captured.out == ""
    return err


def test_missing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert "does not exist" in refused(capsys, str(tmp_path / "nope.csv"), "--html", str(out))
    assert not out.exists()


def test_not_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("dear diary,\ntoday the GPU ran out of memory\n")
    assert "not a vramscope log" in refused(capsys, str(path))


def test_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 10)
    assert "not a vramscope log" in refused(capsys, str(path))


def test_empty_log_and_header_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "empty" in refused(capsys, str(empty))
    header = tmp_path / "header.csv"
    header.write_text("time,elapsed_s,step,gpu,allocated_bytes\r\n")
    assert "no rows" in refused(capsys, str(header))


def test_a_folder_as_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "folder" in refused(capsys, str(tmp_path))
    # An empty name is the current folder to pathlib, and cannot be stat'ed: still one line, exit 2.
    out = tmp_path / "r.html"
    assert "folder" in refused(capsys, "", "--html", str(out))
    assert not out.exists()


def test_unwritable_outputs_fail_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 logs: dict[str, Path]) -> None:
    log = str(logs["clean"])
    assert "does not exist" in refused(capsys, log, "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert "is a folder" in refused(capsys, log, "--html", str(tmp_path))
    assert "is a folder" in refused(capsys, log, "--png", str(tmp_path))
    before = logs["clean"].read_bytes()
    assert "one of the logs" in refused(capsys, log, "--html", log)
    assert logs["clean"].read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_half_file(
    tmp_path: Path, logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills up while the page is written: no file at the path, no temporary file left."""
    import vramscope.cli.report as cli_report

    real_fdopen = cli_report.os.fdopen

    class FullDisk:
        def __init__(self, fd: int, mode: str) -> None:
            self.handle = real_fdopen(fd, mode)

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self.handle.close()

        def write(self, data: bytes) -> int:
            self.handle.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_report.os, "fdopen", FullDisk)
    out = tmp_path / "r.html"
    assert "No space left on device" in refused(capsys, str(logs["clean"]), "--html", str(out))
    assert list(tmp_path.iterdir()) == []


def test_entry_point_exit_code_without_traceback(tmp_path: Path) -> None:
    result = subprocess.run([*VRAMSCOPE, "report", str(tmp_path / "missing.csv")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# -- the planner's recommendations, when the user says what ran ----------------------------------------


def test_planner_prices_changes_for_the_model_that_ran(capsys: pytest.CaptureFixture[str],
                                                       logs: dict[str, Path]) -> None:
    data = report_json(capsys, str(logs["leak"]), "--model", "Llama-2-7B", "--batch-size", "4")
    planned = [r for r in data["recommendations"] if r["source"] == "planner"]
    assert planned and all(r["saves_bytes"] > 0 for r in planned)
    assert [r["saves_bytes"] for r in planned] == sorted((r["saves_bytes"] for r in planned), reverse=True)
    # The sequence length comes from the log: its longest batch (8192 tokens) over the batch size.
    assert "batch 4 x 2048 tokens" in planned[0]["detail"]
    # The leak found in the log stays ahead of the planner's list.
    assert data["recommendations"][0]["source"] == "log" and data["recommendations"][0]["urgent"]
    # Without the planner's inputs, only what the log shows.
    plain = report_json(capsys, str(logs["leak"]))
    assert {r["source"] for r in plain["recommendations"]} == {"log"}


def test_planner_advice_is_written_in_the_frameworks_keys(capsys: pytest.CaptureFixture[str],
                                                         logs: dict[str, Path]) -> None:
    # The same run under each program: the change is the line that program takes, the environment an export.
    by_style = {}
    for extra in (["--framework", "hf"], ["--framework", "trl"], ["--framework", "loop"],
                  ["--settings-style", "axolotl"]):
        data = report_json(capsys, str(logs["leak"]), "--model", "Llama-2-7B", "--batch-size", "4", *extra)
        planned = {r["name"]: r for r in data["recommendations"] if r["source"] == "planner"}
        by_style[extra[1]] = planned["micro_batch"]["detail"]
        assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in planned["expandable_segments"]["detail"]
    assert "TrainingArguments(per_device_train_batch_size=2, gradient_accumulation_steps=2)" in by_style["hf"]
    assert "SFTConfig(per_device_train_batch_size=2" in by_style["trl"] and "under trl" in by_style["trl"]
    assert "opt.step() every 2 backward passes" in by_style["loop"]
    assert "micro_batch_size: 2; gradient_accumulation_steps: 2" in by_style["axolotl"]


def test_planner_inputs_are_checked(capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    log = str(logs["clean"])
    assert "needs both --model and --batch-size" in refused(capsys, log, "--batch-size", "4")
    assert "closest" in refused(capsys, log, "--model", "Llama-9-7B", "--batch-size", "4")
    assert "positive" in refused(capsys, log, "--model", "Llama-2-7B", "--batch-size", "0")


def test_png_without_matplotlib_names_the_extra(tmp_path: Path, logs: dict[str, Path],
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """On an install without the `plot` extra, --png says how to get it, before reading any log."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    out = tmp_path / "r.png"
    assert "pip install 'vramscope[plot]'" in refused(capsys, str(logs["clean"]), "--png", str(out))
    assert not out.exists()


def test_log_of_the_training_loop_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real training loop on the CPU under MemoryMonitor, keeping 2 MiB per step (a planted leak)."""
    log = tmp_path / "loop.csv"
    child = (
        "import sys\n"
        "from vramscope.integrations.loop import MemoryMonitor\n"
        "kept = []\n"
        "with MemoryMonitor(log=sys.argv[1], warn=False) as mon:\n"
        "    for step in range(1, 181):\n"
        "        kept.append(bytearray(2 * 1024 * 1024))\n"
        "        mon.step(step, tokens=512 + 64 * (step % 5))\n"
        "        if step % 60 == 0:\n"
        "            with mon.phase('eval'):\n"
        "                scratch = bytearray(64 * 1024 * 1024)\n"
        "                mon.step(step, tokens=2048)\n"
        "                del scratch\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = report_json(capsys, str(log))
    assert list(data["devices"]) == ["host"]
    host = data["devices"]["host"]
    assert {"train", "eval"} <= set(host["phases"])
    assert host["peaks"]["host_rss_bytes"]["bytes"] > 300 * MIB
    assert data["leak"]["detected"] is True
    assert data["leak"]["slope_bytes_per_step"] == pytest.approx(2 * MIB, rel=0.25)


def test_the_renderers_typed_verdicts_agree_with_the_json() -> None:
    # A real H200 log: GPU 0 idle (other processes' memory), GPU 1 trained with evals. What the terminal and the
    # page read from the typed analysis is what --json writes of it at its edge.
    report = report_file(Path(__file__).parent / "data" / "traces" / "h200" / "clean_eval.csv")
    result = report.result
    json_summary = summary_of(report)
    assert [view.key for view, _ in devices_of(report)] == list(json_summary["devices"]) == ["0", "1"]
    for view, detail in devices_of(report):
        summary = json_summary["devices"][view.key]
        # Judged once, in the analysis; the views and the JSON carry the same field.
        assert device_idle(detail.key, detail.peaks, detail.step_range is not None) == detail.idle
        assert detail.idle == view.idle == summary["idle"]
        assert batches_note(detail.batch_metric, detail.longest_batches) == detail.batches_note
        assert detail.batches_note == summary["longest_batches_note"]
    assert detail_of(result, "0").idle is not None and detail_of(result, "1").idle is None
    severity = oom_severity(result)
    assert (None if severity is None else severity.to_json()) == json_summary["oom_severity"]
    for dev in result.devices:
        device_severity = json_summary["devices"][dev.key]["oom_severity"]
        assert (None if dev.forecast.severity is None else dev.forecast.severity.to_json()) == device_severity


def _styles(text: Any) -> set[str]:
    return {str(span.style) for span in text.spans}


@pytest.mark.parametrize(("capacity", "level", "style", "tone"), [
    (18 * GIB, "high", "bold red", "bad"),  # 1.8% left at the peak
    (19 * GIB + 512 * MIB, "medium", "yellow", "warn"),  # 9.9%
    (24 * GIB, "low", "green", "good"),  # 26%
])
def test_the_headroom_is_judged_in_the_analysis_and_the_renderers_only_colour_it(
        tmp_path: Path, capacity: int, level: str, style: str, tone: str) -> None:
    report = report_file(write_training_log(tmp_path / "run.csv", Run(capacity=capacity, steps=200)))
    [(view, detail)] = devices_of(report)
    room = detail.headroom
    assert room.level == level == headroom_level(room.headroom_bytes, room.headroom_fraction)
    assert style in _styles(device_heading(view, detail))
    assert f'<div class="card {tone}"><div class="k">headroom at the peak</div>' in render_html([report])
    # The terminal draws the analysis' level, whatever the fraction: it holds no threshold of its own.
    other = "low" if level != "low" else "high"
    assert style not in _styles(device_heading(view, replace(detail, headroom=replace(room, level=other))))


def test_headroom_levels_and_a_notable_imbalance_are_the_analysis_thresholds() -> None:
    cases = ((None, None), (-1, -0.1), (5, None), (4, 0.0499), (5, 0.05), (9, 0.0999), (10, 0.1))
    assert [headroom_level(room, fraction) for room, fraction in cases] == [
        None, "high", "high", "high", "medium", "medium", "low"]
    assert [imbalance_notable(x) for x in (None, 0.0, 0.0999, 0.1, 2.0)] == [False, False, False, True, True]

    def ranks(*peaks: int) -> Any:
        return _imbalance([RankPeak(i, 10, (i,), {"peak_allocated_bytes": p}, None) for i, p in enumerate(peaks)])

    even, uneven = ranks(100 * MIB, 105 * MIB), ranks(100 * MIB, 150 * MIB)
    assert (even.imbalance, even.notable, uneven.imbalance, uneven.notable) == (0.05, False, 0.5, True)
    assert "bold yellow" in _styles(rank_heading(uneven)) and "bold yellow" not in _styles(rank_heading(even))
    assert "bold yellow" not in _styles(rank_heading(replace(uneven, notable=False)))  # drawn, not judged there


def test_a_plan_with_a_figure_that_is_not_a_count_reads_it_as_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], logs: dict[str, Path]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"gpus": {"plan": {"strategy": "ddp", "world_size": 2, "per_gpu": [
        {"peak_allocated_bytes": "lots", "process_bytes": 20 * GIB}]}}}))
    saved = read_plan(plan)
    assert saved.strategy == "ddp" and saved.world_size == 2
    assert [(g.peak_allocated_bytes, g.process_bytes) for g in saved.per_gpu] == [(None, 20 * GIB)]
    data = report_json(capsys, str(logs["clean"]), "--plan", str(plan))
    gpu0 = data["parallelism"]["ranks"][0]
    assert gpu0["gpu"] == 0 and gpu0["planned_peak_allocated_bytes"] is None and gpu0["allocated_error"] is None
    assert gpu0["measured_peak_allocated_bytes"] == data["devices"]["0"]["peaks"]["peak_allocated_bytes"]["bytes"]
    assert gpu0["planned_process_bytes"] == 20 * GIB and gpu0["device_error"] is not None


def test_the_renderers_and_the_json_say_what_the_typed_report_holds(logs: dict[str, Path]) -> None:
    # One LogReport, typed; the terminal, the page and --json (made at its edge) each read its fields. Advice
    # taken out of the report is gone from all three alike, and a log's format is what each names.
    def drawn(reports: list[Any]) -> tuple[str, str]:
        out = io.StringIO()
        print_report(reports, Console(file=out, width=120, highlight=False))
        page = re.sub(r"generated [^<]* UTC", "", render_html(reports))
        return out.getvalue(), page

    reports = [report_file(logs["leak"]), report_file(Path(__file__).parent / "data" / "traces" / "h200" /
                                                                "clean_eval.csv")]
    before = [drawn([r]) for r in reports] + [drawn(reports)]
    leak = reports[0]
    assert leak.advice and [a.to_dict() for a in leak.advice] == summary_of(leak)["recommendations"]
    quiet = replace(leak, advice=[], log_format="hand-written")
    text, page = drawn([quiet])
    assert summary_of(quiet)["recommendations"] == [] and summary_of(quiet)["log"]["format"] == "hand-written"
    assert "recommendations (from" in before[0][0] and "recommendations (from" not in text
    assert leak.advice[0].title in before[0][1] and "Nothing to change" in page and leak.advice[0].title not in page
    assert "hand-written" in text.splitlines()[0] and "format hand-written" in page
    assert "leak test: leak: memory left after each step grows" in before[0][0]
    assert "GPU 0 (idle)" in before[1][1] and "peaks by phase" in before[1][1]


@pytest.mark.parametrize("x", [2.0**53, -(2.0**53), 1e17, 0.0])
def test_a_log_of_one_x_far_from_zero_draws_a_page_and_a_png(x: float, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # Every reading at one x: the hover's stretch is one unit wide, or one float step where x + 1.0 == x.
    log = tmp_path / "one.csv"
    log.write_text(f"time,allocated_bytes,elapsed_s\n,{2 * GIB},{x!r}\n,{3 * GIB},{x!r}\n")
    page, png = tmp_path / "r.html", tmp_path / "r.png"
    assert main(["report", str(log), "--html", str(page), "--png", str(png)]) == 0, capsys.readouterr().err
    assert "<h3>GPU 0</h3>" in page.read_text() and png.read_bytes().startswith(b"\x89PNG")
    hovers = hover_buckets(report_file(log).devices[0].timeline.lines, [])
    assert hovers and all(h.x0 <= x <= h.x1 for h in hovers[:1]) and hovers[0].values


def test_a_png_of_a_log_whose_gpus_are_all_idle_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The fuzzed log of one idle reading: the page says "idle" in a line, the PNG in a picture (not a crash).
    log = tmp_path / "idle.csv"
    log.write_text("time,allocated_bytes,time,elapsed_s,time\n,0,,9007199254740992.0,\n")
    page, png = tmp_path / "r.html", tmp_path / "r.png"
    assert main(["report", str(log), "--html", str(page), "--png", str(png)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" not in err
    assert "(idle)" in page.read_text() and png.read_bytes().startswith(b"\x89PNG")


def test_a_png_of_a_phase_with_control_characters_sends_none_to_the_terminal(
        tmp_path: Path, logs: dict[str, Path]) -> None:
    # matplotlib warns about a glyph it lacks with the raw character in the warning: an ESC in a phase name
    # reached the terminal through stderr. The PNG draws it as its escape, as the terminal report shows it.
    log = tmp_path / "hostile.csv"
    log.write_text(logs["clean"].read_text().replace(",eval,", ",ev\x1b[31mal\x07,"))
    png = tmp_path / "r.png"
    done = subprocess.run([*VRAMSCOPE, "report", str(log), "--png", str(png), "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    assert png.read_bytes().startswith(b"\x89PNG") and "\x1b" not in done.stderr and "\x07" not in done.stderr
    assert "ev\x1b[31mal\x07" in json.loads(done.stdout)["log"]["phases"]  # --json keeps the name as logged
