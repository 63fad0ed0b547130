"""Security: no shell, servers on 127.0.0.1 unless told otherwise (and saying where), and text that comes
from processes (command lines, phase names, file names, OOM messages) shown inertly in terminals, logs
and HTML. docs/threat-model.md says what these protect against.
"""

from __future__ import annotations

import ast
import io
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console

import fake_nvml
from vramscope.backends import nvml as nvml_backend
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli import main
from vramscope.logs.reader import read_log
from vramscope.sampling.sampler import Collector

SRC = Path(__file__).resolve().parent.parent / "src" / "vramscope"
PYTHON = sys.executable

# -- no shell ---------------------------------------------------------------------------------------------

SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput")}


def shell_uses(source: str, filename: str) -> list[str]:
    """Every place in ``source`` that runs a command through a shell: ``shell=`` anything but a literal
    False, and the functions that always use one (``os.system``, ``os.popen``, ``subprocess.getoutput``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{filename}:{node.lineno}: shell={ast.unparse(kw.value)}")
            if kw.arg is None and _spawns(node.func):  # **kwargs into a process call could carry shell=True
                found.append(f"{filename}:{node.lineno}: **{ast.unparse(kw.value)} (could hold shell=True)")
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and (func.value.id, func.attr) in SHELL_CALLS
        ):
            found.append(f"{filename}:{node.lineno}: {func.value.id}.{func.attr}()")
    return found


def _spawns(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in {"run", "Popen", "call", "check_call", "check_output"}


def test_the_shell_check_finds_what_it_looks_for() -> None:
    snippet = (
        "import os, subprocess\n"
        "subprocess.run('ls', shell=True)\n"
        "subprocess.Popen(['ls'], shell=flag)\n"
        "subprocess.run(['ls'], shell=False)\n"
        "os.system('ls')\n"
        "subprocess.call(['ls'], **opts)\n"
        "print('x', **opts)\n"
    )
    found = shell_uses(snippet, "x.py")
    assert [f.split(": ", 1)[0] for f in found] == ["x.py:2", "x.py:3", "x.py:5", "x.py:6"], found


def test_no_module_in_src_runs_a_shell() -> None:
    modules = sorted(SRC.rglob("*.py"))
    assert len(modules) > 20  # the whole package, not an empty glob
    found = [hit for path in modules for hit in shell_uses(path.read_text(encoding="utf-8"), str(path))]
    assert found == []


# -- servers: where they listen, and that they say so ------------------------------------------------------

SERVER_CALLS = {
    "make_server",
    "HTTPServer",
    "ThreadingHTTPServer",
    "start_http_server",
    "start_wsgi_server",
    "create_server",
    "TCPServer",
    "ThreadingTCPServer",
    "bind",
    "listen",
}


def test_every_server_in_src_is_one_this_file_checks() -> None:
    """A new listening socket in src must be added here, with a test that it binds 127.0.0.1 by default."""
    servers = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in SERVER_CALLS:
                    servers.add(str(path.relative_to(SRC)))
    # The Prometheus exporter's server, and `vramscope run`'s relay: a unix datagram socket in a folder only its
    # user can enter (tests/test_relay.py: test_the_relay_socket_is_the_users_alone).
    assert servers == {"exporters/server.py", "exporters/relay.py"}


def listening(pid: int) -> list[tuple[str, int]]:
    return [
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


def other_addresses() -> list[str]:
    """This machine's IPv4 addresses that are not loopback (to try reaching the exporter from outside)."""
    return [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]


def test_run_exporter_binds_loopback_by_default_and_says_where(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    child = f"import os, time\nwhile not os.path.exists({str(stop)!r}): time.sleep(0.05)"
    proc = subprocess.Popen(
        [PYTHON, "-m", "vramscope", "run", "--prometheus", "0", "--interval", "0.1", "--", PYTHON, "-c", child],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().strip()
        prefix = "vramscope: serving Prometheus metrics at http://127.0.0.1:"
        assert line.startswith(prefix) and line.endswith("/metrics"), line
        port = int(line[len(prefix) :].split("/")[0])
        assert listening(proc.pid) == [("127.0.0.1", port)]  # that one socket, on loopback only
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        for address in other_addresses():
            with pytest.raises(OSError), socket.create_connection((address, port), timeout=2):
                pass  # not reachable from the network
    finally:
        stop.touch()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_every_interface_only_when_asked_and_then_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vramscope.exporters import PrometheusSink

    open_wide = PrometheusSink("0.0.0.0:0")
    try:
        assert open_wide.where == f"serving Prometheus metrics at http://0.0.0.0:{open_wide.port}/metrics"
        assert listening(os.getpid()).count(("0.0.0.0", open_wide.port)) == 1
    finally:
        open_wide.close()
    default = PrometheusSink("0")
    try:
        assert default.host == "127.0.0.1"
    finally:
        default.close()


def test_training_integrations_bind_loopback(tmp_path: Path) -> None:
    loop = pytest.importorskip("vramscope.integrations.loop")
    with loop.MemoryMonitor(prometheus="0", warn=False, nvml=fake_nvml.no_driver()) as mon:
        mine = [addr for addr in listening(os.getpid()) if addr[0] != "::1"]
        assert mine and all(ip == "127.0.0.1" for ip, _ in mine), mine
        mon.step(1)
    hf = pytest.importorskip("vramscope.integrations.hf")
    assert hf.prometheus_address(19400) == "127.0.0.1:19400"
    assert hf.prometheus_address("19400") == "127.0.0.1:19400"


# -- text from processes, shown in a terminal ---------------------------------------------------------------

# A command line another user's process can have: terminal escapes (set the title, clear the screen), a
# newline that would forge a line of output, a right-to-left override, and rich markup.
HOSTILE_ARGS = ["\x1b]0;pwned\x07", "\x1b[2J", "x\nGPU 9 FAKE: used 0.00 GiB", "\u202eevil", "[bold red]boo[/]"]


@pytest.fixture
def hostile_process() -> Any:
    proc = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(30)", *HOSTILE_ARGS])
    deadline = time.monotonic() + 10
    while len(psutil.Process(proc.pid).cmdline()) < 2 + len(HOSTILE_ARGS) and time.monotonic() < deadline:
        time.sleep(0.02)  # until the exec has happened and /proc shows the new command line
    yield proc
    proc.kill()
    proc.wait()


def assert_inert(text: str, console_styles: bool = False) -> None:
    if console_styles:  # rich's own colours are SGR sequences "ESC [ ... m"; nothing else may appear
        import re

        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text)
    assert not any(line.lstrip("│┃ ").startswith("GPU 9 FAKE") for line in text.splitlines())  # no forged line


def test_watch_shows_hostile_command_lines_inertly(
    hostile_process: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(processes={hostile_process.pid: 1 << 30})])
    monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: fake)
    assert main(["watch", "--once"]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    line = next(line for line in out.splitlines() if f"pid {hostile_process.pid:>7}" in line)
    assert "[bold red]boo[/]" in line or len(line) >= 100  # markup shown as typed (or cut at the width)
    assert "\\x1b" in line  # the escape is visible as text, so the user sees something is odd

    from vramscope.tui.dashboard import render

    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), name_processes=True)
    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="standard")
    console.print(render([collector.collect()], 1.0))
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert_inert(drawn, console_styles=True)
    assert "[bold red]boo[/]" in drawn


def test_text_from_the_loop_cannot_forge_log_rows(tmp_path: Path) -> None:
    loop = pytest.importorskip("vramscope.integrations.loop")
    phase = 'eval,"x"\n2026-01-01T00:00:00.000+00:00,0,999,0'
    log = tmp_path / "m.csv"
    with loop.MemoryMonitor(log=str(log), warn=False, nvml=fake_nvml.no_driver()) as mon:
        mon.step(1)
        with mon.phase(phase):
            mon.step(2)
    table = read_log(log)
    assert phase in table.strings("phase")  # kept exactly, as one cell
    assert 999 not in table.ints("step")  # and no row was forged from it


# -- HTML reports ----------------------------------------------------------------------------------------

MARKUP = '<script>alert(1)</script><img src=x onerror="alert(2)">\'"&'


class Structure(HTMLParser):
    """The tags of a page and their attribute names: what markup in the data would change."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: Counter[tuple[str, tuple[str, ...]]] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[(tag, tuple(sorted(name for name, _ in attrs)))] += 1


def structure(page: str) -> Counter[tuple[str, tuple[str, ...]]]:
    parser = Structure()
    parser.feed(page)
    return parser.tags


def write_log(path: Path, phase_names: tuple[str, str]) -> None:
    from vramscope.logs.sinks import CsvSink
    from vramscope.types import AllocatorReading, Sample

    sink = CsvSink(path)
    for step in range(1, 41):
        phase = phase_names[1] if step % 10 == 0 else phase_names[0]
        reading = AllocatorReading(
            device=0, allocated_bytes=step << 20, reserved_bytes=step << 21, peak_allocated_bytes=(step + 3) << 20
        )
        sink.write(
            Sample(
                time=1.7e9 + step,
                elapsed_s=float(step),
                allocator=(reading,),
                step=step,
                phase=phase,
                tokens=512,
                extra={"rank": 0},
            )
        )
    sink.close()


def test_report_html_escapes_text_from_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("vramscope.report.html")
    pages = []
    for label, phases, name in [("plain", ("alpha", "beta"), "plain"), ("hostile", (MARKUP, MARKUP + "2"), "h")]:
        folder = tmp_path / label
        folder.mkdir()
        # The file name is process-provided too (vramscope run --log NAME): markup there as well.
        log = folder / (f"{name}.csv" if label == "plain" else "<b>log<i> &'\".csv")
        write_log(log, phases)
        out = folder / "r.html"
        assert main(["report", str(log), "--html", str(out)]) == 0, capsys.readouterr().err
        pages.append(out.read_text(encoding="utf-8"))
    capsys.readouterr()
    plain, hostile = pages
    assert "<script>" not in hostile and "onerror=" not in hostile.replace("onerror=&quot;", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile  # shown, as text
    assert structure(hostile) == structure(plain)  # the same page: no tag or attribute came from the data


def test_oom_report_html_escapes_what_the_snapshot_and_the_loop_report() -> None:
    oom = pytest.importorskip("vramscope.oom")

    def snapshot(text: str) -> dict[str, Any]:
        frames = [{"filename": f"/home/u/{text}.py", "line": 7, "name": text}]
        blocks = [{"size": 1 << 30, "requested_size": 1 << 30, "state": "active_allocated", "frames": frames}]
        segment = {
            "device": 0,
            "address": 0,
            "total_size": 2 << 30,
            "allocated_size": 1 << 30,
            "active_size": 1 << 30,
            "segment_type": "large",
            "blocks": blocks,
        }
        return {"segments": [segment], "device_traces": [[]]}

    def page(text: str) -> str:
        event = oom.OomEvent(
            device=0,
            requested_bytes=1 << 30,
            capacity_bytes=2 << 30,
            device_free_bytes=0,
            message=f"CUDA out of memory. {text}",
            context={"phase": text, "step": 3},
        )
        return str(oom.render_html(oom.post_mortem(snapshot(text), event, snapshot_file=f"/tmp/{text}.pickle")))

    plain, hostile = page("train_step"), page(MARKUP)
    assert "<script>" not in hostile and "<img" not in hostile
    assert structure(hostile) == structure(plain)
