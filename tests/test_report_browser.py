"""The HTML report in a real browser: headless Chromium renders it, and we look at the pixels and the DOM.

Needs Debian's ``chromium`` package (CI installs it). Off the network by construction: the page has
nothing to fetch, and Chromium runs with its background networking off and a fresh profile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.cli import main

WIDTH, HEIGHT = 1280, 1900
HOSTILE = "<script>document.title='owned'</script>"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; CI must apt-get install chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "profile"
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
               "--force-device-scale-factor=1", f"--user-data-dir={profile}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    log = write_training_log(root / "leak.csv", Run(steps=1500, leak_per_step=3 * MIB, leak_from=600,
                                                    eval_phase=f"eval{HOSTILE}"))
    out = root / "report.html"
    assert main(["report", str(log), "--html", str(out)]) == 0
    return out


@pytest.mark.slow
def test_screenshot_shows_the_charts(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    result = run_chromium(tmp_path, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), result.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (WIDTH, HEIGHT)
        pixels = Counter({colour: n for n, colour in image.convert("RGB").getcolors(maxcolors=WIDTH * HEIGHT) or []})
    assert len(pixels) > 200, "the page looks blank"
    background = pixels.most_common(1)[0][0]
    assert all(c > 235 for c in background)  # a light page, not an error screen

    def seen(rgb: tuple[int, int, int], tolerance: int = 12, at_least: int = 40) -> bool:
        return sum(n for colour, n in pixels.items()
                   if all(abs(a - b) <= tolerance for a, b in zip(colour, rgb, strict=True))) >= at_least

    assert seen((0x4E, 0x79, 0xA7)), "device used line (blue) not drawn"
    assert seen((0xF2, 0x8E, 0x2B)), "reserved line (orange) not drawn"
    assert seen((0xE1, 0x57, 0x59)), "peak allocated line (red) not drawn"
    assert seen((0x59, 0xA1, 0x4F)), "allocated line (green) not drawn"
    assert seen((0xC0, 0x39, 0x2B)), "capacity line / OOM forecast not drawn"
    # The eval band: #f6d55c at 35% over white.
    assert seen((252, 240, 198), tolerance=6, at_least=400), "eval bands not drawn"


@pytest.mark.slow
def test_the_browser_runs_nothing_from_the_log(page: Path, tmp_path: Path) -> None:
    result = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert "<title>vramscope report:" in dom and "owned" not in dom.split("</title>")[0]
    names: set[str] = set()

    class Elements(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            names.add(tag)

    Elements().feed(dom)
    assert "script" not in names
    assert {"svg", "polyline", "table"} <= names
    assert "eval&lt;script&gt;" in dom  # shown as text
