"""The report page as a person reads it (issue 16, item 8), on real logs: the H200 and CPU traces under
tests/data and logs written by vramscope's own sampler (test_report_fixtures).

The page is parsed as HTML; label extents are measured with the font Chromium draws them in here
(DejaVu Sans), not with the renderer's own estimate.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.cli import main
from vramscope.report.hover import HOVER_COLUMNS
from vramscope.report.svg import MIN_BAND_PX

DATA = Path(__file__).parent / "data" / "traces"
H200 = DATA / "h200"
CPU = DATA / "cpu"
FONTS = Path("/usr/share/fonts/truetype/dejavu")
GIB = 1024**3
START = datetime(2026, 11, 29, 20, 0, tzinfo=timezone.utc)


class Page(HTMLParser):
    """The page's charts: per ``<svg>`` (by its aria-label), its texts, bands and hover titles."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, list[Any]]] = {}
        self.cards: list[dict[str, str]] = []
        self.tags: set[str] = set()
        self._chart: dict[str, list[Any]] | None = None
        self._stack: list[tuple[str, dict[str, str]]] = []
        self._text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "svg":
            self._chart = self.charts.setdefault(a["aria-label"], {"labels": [], "texts": [], "bands": [],
                                                                   "hovers": []})
        if tag == "div" and "card" in a.get("class", "").split():
            self.cards.append(a)
        self._stack.append((tag, a))
        self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        text = "".join(self._text)
        if tag == "title" and self._chart is not None and len(self._stack) >= 2:
            parent, a = self._stack[-2]
            kind = a.get("class")
            if parent == "rect" and kind == "band":
                self._chart["bands"].append((float(a["width"]), text))
            elif parent == "rect" and kind == "hover":
                self._chart["hovers"].append(text)
        if tag == "text" and self._chart is not None:
            a = self._stack[-1][1]
            self._chart["texts"].append(text)
            if a.get("class") == "label":
                self._chart["labels"].append((text, float(a["x"]), float(a["y"]), a.get("text-anchor", "start"),
                                              "font-weight:600" in a.get("style", "")))
        if tag == "svg":
            self._chart = None
        while self._stack:
            if self._stack.pop()[0] == tag:
                break
        self._text = []


def render(tmp_path: Path, log: Path, *extra: str) -> tuple[Page, str]:
    out = tmp_path / f"{log.stem}.html"
    assert main(["report", str(log), "--html", str(out), *extra]) == 0
    text = out.read_text(encoding="utf-8")
    return Page(text), text


def summary(capsys: pytest.CaptureFixture[str], log: Path, *extra: str) -> Any:
    capsys.readouterr()  # what an earlier render printed
    assert main(["report", str(log), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def terminal(capsys: pytest.CaptureFixture[str], log: Path, *extra: str) -> str:
    capsys.readouterr()
    assert main(["report", str(log), *extra]) == 0
    return " ".join(capsys.readouterr().out.split())  # rich wraps lines at the console's width


@pytest.fixture(scope="module")
def leak_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' run: 3 MiB/step leaks from step 600 on a 24 GiB card, OOM in ~18 minutes."""
    return write_training_log(tmp_path_factory.mktemp("page") / "qlora-7b-bs4.csv",
                              Run(steps=1500, leak_per_step=3 * MIB, leak_from=600))


def small_leak_log(path: Path, per_step: int = 40) -> Path:
    """A monitor's log written every 100 steps for 600,000 steps, keeping ``per_step`` bytes every step."""
    header = ("time,elapsed_s,step,gpu,allocated_bytes,reserved_bytes,peak_allocated_bytes,device_used_bytes,"
              "device_total_bytes,phase,tokens")
    base = 5 * GIB
    lines = [header]
    for step in range(100, 600_001, 100):
        allocated = base + per_step * step + (step * 7919) % 4096
        seconds = step * 0.5
        stamp = (START + timedelta(seconds=seconds)).isoformat(timespec="milliseconds")
        lines.append(f"{stamp},{seconds},{step},0,{allocated},{base + 2 * GIB},{allocated + GIB},{base + 3 * GIB},"
                     f"{24 * GIB},train,1024")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _boxes(labels: list[tuple[str, float, float, str, bool]]) -> list[tuple[str, tuple[float, float, float, float]]]:
    from PIL import ImageFont

    regular, bold = FONTS / "DejaVuSans.ttf", FONTS / "DejaVuSans-Bold.ttf"
    if not (regular.exists() and bold.exists()):
        pytest.skip("DejaVu Sans (the page's fallback font) is not installed")
    fonts = {False: ImageFont.truetype(str(regular), 12), True: ImageFont.truetype(str(bold), 12)}
    out = []
    for text, x, y, anchor, heavy in labels:
        width = fonts[heavy].getlength(text)
        x0 = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
        out.append((text, (x0, y - 10.0, x0 + width, y + 3.0)))  # 12 px: ascent ~9.5, descent ~2.5
    return out


@pytest.mark.parametrize("log", [H200 / "leak_slow_256k.csv", H200 / "clean_eval.csv", "leak"])
def test_labels_do_not_cover_each_other(tmp_path: Path, log: Path | str, leak_log: Path) -> None:
    page, _ = render(tmp_path, leak_log if log == "leak" else Path(log))
    checked = 0
    for title, chart in page.charts.items():
        boxes = _boxes(chart["labels"])
        for i, (text_a, a) in enumerate(boxes):
            for text_b, b in boxes[i + 1:]:
                assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), \
                    f"{title}: {text_a!r} drawn over {text_b!r}"
                checked += 1
    assert checked >= 1  # the peak and the capacity were both labelled somewhere


def test_one_capacity_per_device_with_its_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = H200 / "leak_slow_256k.csv"  # the time chart said 140.4 GiB and the step chart 138.0 GiB
    page, _ = render(tmp_path, log)
    named = [t for chart in page.charts.values() for t in chart["texts"] if t.startswith("capacity")]
    assert len(named) == 2 and len(set(named)) == 1, named
    assert named[0].startswith("capacity 140.4 GiB (GPU total, NVML)")
    data = summary(capsys, log)
    gpu = data["devices"]["1"]
    assert gpu["capacity_source"] == "GPU total, NVML" and gpu["capacity_bytes"] == 150754820096
    # The forecast's own limit is lower (torch cannot reach the CUDA context): said, with the difference.
    forecast = data["forecast"]["devices"]["1"]
    assert forecast["capacity_bytes"] < gpu["capacity_bytes"]
    assert f"the forecast runs to the {forecast['capacity_bytes'] / GIB:.1f} GiB torch can allocate" in \
        _note(tmp_path, log)
    assert "capacity 140.40 GiB (GPU total, NVML)" in terminal(capsys, log)


def _note(tmp_path: Path, log: Path) -> str:
    text = (tmp_path / f"{log.stem}.html").read_text(encoding="utf-8")
    return " ".join(re.findall(r"<figcaption>(.*?)</figcaption>", text, re.S))


def test_nvidia_smi_capacity_names_nvidia_smi(tmp_path: Path) -> None:
    from test_report_fixtures import write_nvidia_smi_log

    page, _ = render(tmp_path, write_nvidia_smi_log(tmp_path / "smi.csv", rows=120, gpus=2))
    named = {t for chart in page.charts.values() for t in chart["texts"] if t.startswith("capacity")}
    assert named == {"capacity 24.0 GiB (GPU total, nvidia-smi memory.total)"}


def test_small_leak_rates_keep_their_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = summary(capsys, small_leak_log(tmp_path / "small.csv"))
    assert data["leak"]["detected"]
    assert "grows 40 B/step" in data["leak"]["verdict"]
    out = terminal(capsys, tmp_path / "small.csv")
    assert "grows 40 B/step" in out and "0.0 KiB" not in out
    assert "grows 256 KiB/step" in terminal(capsys, H200 / "leak_slow_256k.csv")  # was "256.0 KiB/step"


def test_oom_severity_follows_the_time_left(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            leak_log: Path) -> None:
    slow = write_training_log(tmp_path / "slow.csv", Run(steps=1500, leak_per_step=3 * MIB, leak_from=600,
                                                         seconds_per_step=30.0))
    cases = [(leak_log, "high", "bad"), (slow, "medium", "warn"), (small_leak_log(tmp_path / "small.csv"), "low", "")]
    for log, level, tone in cases:
        data = summary(capsys, log)
        seconds = data["forecast"]["seconds_to_oom"]
        assert data["oom_severity"]["level"] == level, (log.name, seconds)
        page, _ = render(tmp_path, log)
        card = next(c for c in page.cards if c.get("data-severity"))
        assert card["data-severity"] == level
        assert card["class"].split()[1:] == ([tone] if tone else []), card
    # A leak that runs out only in years is amber, not an alarm; the 18-minute one is red.
    assert '<div class="card warn"><div class="k">leak</div>' in render(tmp_path, cases[2][0])[1]
    assert '<div class="card bad"><div class="k">leak</div>' in render(tmp_path, leak_log)[1]
    # The years-away forecast is written as years, not thousands of days.
    assert re.search(r"about \d+\.\d years", terminal(capsys, tmp_path / "small.csv"))


def test_eval_bands_are_visible_and_say_when(tmp_path: Path) -> None:
    page, _ = render(tmp_path, H200 / "clean_eval.csv")
    timeline, steps = page.charts["GPU 1: memory over time"], page.charts["GPU 1: memory per training step"]
    for chart in (timeline, steps):
        evals = [(w, t) for w, t in chart["bands"] if t.startswith("eval")]
        assert len(evals) == 4  # after steps 50, 100, 150 and 200
        assert min(w for w, _ in evals) >= MIN_BAND_PX
    # The first eval ran between the row of step 50 (19.598 s) and its own row (19.848 s).
    assert re.fullmatch(r"eval: 0:19\.6 to 0:19\.8 \(0\.[23] s\), after step 50, 1 row", evals[0][1]), evals[0]


def test_hover_shows_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = H200 / "leak_slow_256k.csv"
    page, text = render(tmp_path, log)
    assert "script" not in page.tags
    data = summary(capsys, log)
    peak = data["devices"]["1"]["peaks"]["device_used_bytes"]["bytes"]
    for title, chart in page.charts.items():
        hovers = chart["hovers"]
        assert 0.5 * HOVER_COLUMNS <= len(hovers) <= HOVER_COLUMNS, title
        assert all(re.search(r": \d+(\.\d+)? (B|KiB|MiB|GiB)", h) for h in hovers), title
    # The stretch that holds the run's peak says its value, as the tables write it.
    assert any(f"device used: {peak / GIB:.2f} GiB" in h or f"to {peak / GIB:.2f} GiB" in h
               for h in page.charts["GPU 1: memory over time"]["hovers"])
    first = page.charts["GPU 1: memory per training step"]["hovers"][0]
    assert first.splitlines()[0].startswith("step")
    assert len(text.encode()) < 300_000


def test_capacity_option_drives_forecast_and_headroom(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      leak_log: Path) -> None:
    own = summary(capsys, leak_log)
    given = summary(capsys, leak_log, "--gpu-memory", "22GiB")
    gpu = given["devices"]["0"]
    assert gpu["capacity_bytes"] == 22 * GIB and gpu["capacity_source"] == "--gpu-memory"
    assert gpu["headroom_bytes"] == 22 * GIB - gpu["peak_used_bytes"]
    assert given["forecast"]["steps_to_oom"] < own["forecast"]["steps_to_oom"]
    page, _ = render(tmp_path, leak_log, "--gpu-memory", "80GB")
    named = {t for chart in page.charts.values() for t in chart["texts"] if t.startswith("capacity")}
    assert named == {f"capacity {80e9 / GIB:.1f} GiB (--gpu-memory), above the chart"}
    # A log without a GPU total: the forecast says which option gives it, and then forecasts.
    host = summary(capsys, CPU / "leak_loss_graph.csv")
    assert host["forecast"]["steps_to_oom"] is None and "--gpu-memory" in host["forecast"]["reason"]
    assert summary(capsys, CPU / "leak_loss_graph.csv", "--gpu-memory", "2GiB")["forecast"]["steps_to_oom"] > 0


@pytest.mark.parametrize("value", ["24", "lots", "-4GiB", "1KiB", ""])
def test_bad_capacity_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     value: str) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(H200 / "clean_eval.csv"), "--html", str(out), f"--gpu-memory={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gpu-memory" in err and "GiB" in err, err
    assert not out.exists()


def test_idle_gpu_is_reported_idle_with_no_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = H200 / "clean_eval.csv"  # GPU 0 holds one start row: 0 B of this run, 12.8 GiB of others
    data = summary(capsys, log)
    idle = data["devices"]["0"]["idle"]
    assert idle and idle.startswith("idle") and "other processes" in idle
    assert data["devices"]["1"]["idle"] is None
    assert not [r for r in data["recommendations"] if r["device"] == "0"]
    assert not any("GPU 0" in r["detail"] for r in data["recommendations"])
    page, text = render(tmp_path, log)
    assert "GPU 0 (idle)" in text and not any(t.startswith("GPU 0") for t in page.charts)
    # The peak card is this run's peak (4.28 GiB on GPU 1), not the other processes' 12.8 GiB on GPU 0.
    assert '<div class="v">4.28 GiB</div><div class="d">device used on GPU 1' in text
    assert "GPU 0 · idle: no training step" in terminal(capsys, log)


def test_unknown_batch_peaks_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = CPU / "clean_eval.csv"  # a CPU run: tokens per step, no allocator
    out = terminal(capsys, log)
    assert "tokens, ?" not in out
    # The training's longest batch, not eval's 512-token ones (tests/test_longest_training_batch.py).
    assert "step 274 (256 tokens)" in out and "no allocator readings" in out
    data = summary(capsys, log)
    assert "no allocator readings" in data["devices"]["host"]["longest_batches_note"]
    _, text = render(tmp_path, log)
    assert "<td class=\"n\">unknown</td>" in text and "no allocator readings" in text


@pytest.mark.slow
def test_eval_bands_show_in_the_browser(tmp_path: Path) -> None:
    """In headless Chromium the real H200 log's one-row evals are bands a person can see."""
    from collections import Counter

    from PIL import Image

    from test_report_browser import run_chromium

    render(tmp_path, H200 / "clean_eval.csv")
    shot = tmp_path / "shot.png"
    result = run_chromium(tmp_path, "--window-size=1400,2400", f"--screenshot={shot}",
                          (tmp_path / "clean_eval.html").as_uri())
    assert shot.exists(), result.stderr[-2000:]
    with Image.open(shot) as image:
        pixels = Counter({colour: n for n, colour in image.convert("RGB").getcolors(maxcolors=1400 * 2400) or []})
    # #f6d55c at 35% over white; the 8 one-row evals (4 per chart) drawn 1 px wide made ~1,300 such pixels.
    band = sum(n for colour, n in pixels.items()
               if all(abs(a - b) <= 6 for a, b in zip(colour, (252, 240, 198), strict=True)))
    assert band >= 8000, band


def test_a_clock_stepped_back_still_draws_the_page(tmp_path: Path) -> None:
    # an nvidia-smi stamp earlier than the one above it (the host's clock set back): the hover's columns took the
    # x range from a line's two ends, and the reading before them fell off the columns (IndexError)
    rows = [f"2026/11/29 10:00:{s:02d}.000, {5000 + 300 * s} MiB, 24000 MiB" for s in range(20)]
    rows.insert(5, "1969/12/31 23:59:59.500, 6400 MiB, 24000 MiB")
    log = tmp_path / "smi.csv"
    log.write_text("timestamp, memory.used [MiB], memory.total [MiB]\n" + "\n".join(rows) + "\n")
    page, _ = render(tmp_path, log)
    assert page.charts  # drawn, the stepped-back reading among them
