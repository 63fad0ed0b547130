"""In a notebook a plan and a report display as HTML (Jupyter's ``_repr_html_``), and ``vramscope.report(path)``
returns the typed report of a real log."""

from __future__ import annotations

import html
import subprocess
import sys
from pathlib import Path

import vramscope
from vramscope.analysis.results import AnalysisResult
from vramscope.report import LogReport


def test_a_plan_displays_as_html() -> None:
    plan = vramscope.plan("Llama-2-7B", 2, 1024, gpu_memory="24GiB")
    page = plan._repr_html_()
    assert page.startswith("<div class='vramscope-plan'>") and "Llama-2-7B" in page
    assert f"{plan.peak_allocated_bytes / 2**30:.2f} GiB" in page and "fits" in page
    assert "breakdown at the peak" in page


def test_report_of_a_real_log_is_typed_and_displays_as_its_page(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    ran = subprocess.run([sys.executable, "-m", "vramscope", "run", "--log", str(log), "--", sys.executable, "-c",
                          "import time; time.sleep(0.5)"], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    report = vramscope.report(log)
    assert isinstance(report, LogReport) and isinstance(report.result, AnalysisResult)
    frame = report._repr_html_()
    assert frame.startswith("<iframe srcdoc=")
    page = html.unescape(frame.split('srcdoc="', 1)[1].split('" style=', 1)[0])
    assert page.lstrip().lower().startswith("<!doctype html") and str(log.name) in page
    import vramscope.report as package  # the package itself is callable the same way

    assert callable(package) and isinstance(package(log), LogReport)
