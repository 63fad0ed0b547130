"""The numpy reader of large logs (vramscope.fastcsv) gives cell for cell what the string reader gives.

Every comparison reads one file both ways: ``read_log`` with the size floor lowered so that fastcsv
takes it, and the string path (the plain splitter, or the csv module for what it refuses). Typed views
are compared too, since fastcsv parses numbers from bytes itself and must agree with ``int()`` and
``float()`` on every cell it accepts, and hand every other cell back to them.
"""

from __future__ import annotations

import math
import random
import string
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vramscope import fastcsv, logfile
from vramscope.logfile import LazyText, LogTable, read_log
from vramscope.schema import COLUMNS
from vramscope.sinks.csvlog import CsvSink


@pytest.fixture(autouse=True)
def small_files_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastcsv, "MIN_BYTES", 0)


def by_strings(path: Path) -> LogTable:
    """The same file read without fastcsv (the string and csv-module path)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return logfile._read_csv(str(path), text)


def same_table(path: Path, *, fast_expected: bool = True) -> LogTable:
    fast = read_log(path)
    assert isinstance(fast.raw, LazyText) == fast_expected
    slow = by_strings(path)
    assert fast.columns == slow.columns
    assert len(fast) == len(slow)
    for column in slow.columns:
        assert fast.has(column) == slow.has(column), column
        fast_ints, slow_ints = fast.ints(column), slow.ints(column)
        assert fast_ints == slow_ints, column
        assert all(type(a) is type(b) for a, b in zip(fast_ints, slow_ints, strict=True)), column
        fast_floats, slow_floats = fast.floats(column), slow.floats(column)
        assert [_key(v) for v in fast_floats] == [_key(v) for v in slow_floats], column
        assert fast.strings(column) == slow.strings(column), column
    assert dict(fast.raw) == dict(slow.raw)
    return fast


def _key(value: float | None) -> object:
    # NaN != NaN: compare floats by their exact bits (repr round-trips a double exactly).
    return None if value is None else ("nan" if math.isnan(value) else repr(value))


def test_a_log_written_by_our_sink_is_read_by_fastcsv(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    sink = CsvSink(path)
    rows = []
    for i in range(500):
        rows.append({"time": f"2026-11-29T10:00:{i % 60:02d}.{i % 1000:03d}+00:00", "elapsed_s": round(i * 0.1, 3),
                     "step": i if i % 7 else None, "gpu": i % 2, "allocated_bytes": 5 * 2**30 + i * 4096,
                     "reserved_bytes": 6 * 2**30, "device_total_bytes": 150_000_000_000, "phase": "train" if i % 50
                     else "eval", "tokens": 512 * (1 + i % 4), "utilization_pct": i % 101})
    sink.write_rows(rows)
    sink.close()
    assert path.read_bytes().count(b"\r\n") == 501  # the csv module's line end: the fast path must take it
    table = same_table(path)
    assert table.ints("allocated_bytes")[3] == 5 * 2**30 + 3 * 4096
    assert table.floats("elapsed_s")[:4] == [0.0, 0.1, 0.2, 0.3]
    assert table.ints("step")[:2] == [None, 1]
    assert set(table.strings("phase")) == {"train", "eval"}
    assert table.has("tokens") and not table.has("process_bytes")


NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=10**20).map(str),
    st.floats(min_value=0, max_value=1e12, allow_nan=False).map(repr),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda f: f"{f:.3f}"),
    st.builds(lambda a, b: f"{a}.{b}", st.integers(0, 10**9), st.integers(0, 10**9)),
    st.sampled_from(["", "", "0", "007", "1.", ".5", ".", "1.2.3", "-4", "+5", " 5", "5 ", "1e3", "1_000",
                     "nan", "inf", "0x10", "12 MiB", "train", "9" * 16, "9" * 17, "1" + "0" * 15, "0.000000000000001",
                     "1234567890.12345", "1234567890.123456"]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(width=st.integers(2, 5), data=st.data(), crlf=st.booleans(), torn=st.booleans())
def test_fastcsv_matches_the_string_path_cell_for_cell(tmp_path: Path, width: int, data: st.DataObject, crlf: bool,
                                                       torn: bool) -> None:
    header = ["time", "gpu", *(f"c{j}" for j in range(width - 2))][:width]
    rows = data.draw(st.lists(st.lists(NUMBERS, min_size=width, max_size=width), min_size=1, max_size=30))
    newline = "\r\n" if crlf else "\n"
    text = newline.join(",".join(r) for r in [header, *rows]) + newline + ("9,partial" if torn else "")
    path = tmp_path / "fuzz.csv"
    path.write_bytes(text.encode())
    # A cell with a space is still plain CSV; any other refusal below is the csv module's job.
    same_table(path)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("quotes", 'time,gpu\n"a,b",1\n'),
        ("mixed line ends", "time,gpu\r\n1,2\n3,4\r\n"),
        ("carriage return in a cell", "time,gpu\n1\r5,2\n"),
        ("ragged rows", "time,gpu\n1,2,3\n4\n"),
        ("one short row", "time,gpu,c\n1,2,3\n4,5\n"),
        ("blank line", "time,gpu\n1,2\n\n3,4\n"),
        ("not ASCII", "time,gpu\nphase\u00e9,1\n"),
    ],
)
def test_files_fastcsv_refuses_are_read_as_before(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / "odd.csv"
    path.write_bytes(text.encode())
    assert fastcsv.locate(path.read_bytes()) is None, name
    assert read_log(path).raw == by_strings(path).raw


def test_a_torn_last_line_is_dropped_and_the_rows_before_kept(tmp_path: Path) -> None:
    path = tmp_path / "torn.csv"
    path.write_bytes(b"time,gpu,allocated_bytes\r\nt0,0,100\r\nt1,0,200\r\nt2,0,3")
    table = same_table(path)
    assert table.ints("allocated_bytes") == [100, 200]
    # Cut between "\r" and "\n": without its whole line end a row counts as torn, on both paths.
    path.write_bytes(b"time,gpu,allocated_bytes\r\nt0,0,100\r\nt1,0,200\r")
    assert same_table(path).ints("allocated_bytes") == [100]


def test_a_header_alone_is_an_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "head.csv"
    path.write_bytes(",".join(COLUMNS).encode() + b"\r\n")
    table = same_table(path)
    assert len(table) == 0 and table.ints("step") == [] and not table.has("step")


def test_large_random_log_and_long_cells(tmp_path: Path) -> None:
    rng = random.Random(7)
    lines = ["time,gpu,big,small,ratio,name"]
    for i in range(20_000):
        big = str(rng.randrange(10 ** rng.randrange(1, 17)))
        ratio = f"{rng.random() * 10 ** rng.randrange(0, 9):.{rng.randrange(0, 6)}f}"
        name = "".join(rng.choices(string.ascii_letters, k=rng.randrange(0, 300)))  # past the text window
        lines.append(f"t{i},{i % 8},{big},{'' if i % 5 == 0 else i % 300},{ratio},{name}")
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n")
    table = same_table(path)
    assert table.ints("small")[:2] == [None, 1]
    columns = table.raw.columns  # type: ignore[attr-defined]
    # These came from the bytes, not from int()/float() over strings:
    assert columns.ints(2) is not None and columns.ints(3) is not None and columns.floats(4) is not None
    assert columns.ints(5) is None and columns.floats(5) is None  # names: handed back


def test_read_log_of_a_large_file_without_numpy_is_the_same(tmp_path: Path) -> None:
    path = tmp_path / "mem.csv"
    rng = random.Random(3)
    body = "".join(f"2026-11-29T10:00:00.{i % 1000:03d}+00:00,{i / 10},{i % 2},{rng.randrange(2**40)}\r\n"
                   for i in range(60_000))
    path.write_text("time,elapsed_s,gpu,reserved_bytes\r\n" + body, newline="")
    assert path.stat().st_size > 1 << 20  # over the floor the child keeps (this process lowered it)
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'numpy': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from vramscope.logfile import read_log\n"
        f"t = read_log({str(path)!r})\n"
        "print(type(t.raw).__name__, sum(t.ints('reserved_bytes')), repr(sum(t.floats('elapsed_s'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    table = read_log(path)
    assert isinstance(table.raw, LazyText)
    expected = f"dict {sum(table.ints('reserved_bytes'))} {sum(table.floats('elapsed_s'))!r}"  # type: ignore[arg-type]
    assert done.stdout.strip() == expected


# -- nvidia-smi's CSV: the whole-column path against the per-line one ---------------------------------------

SMI_HEADERS = [
    ["timestamp", "name", "memory.used [MiB]", "memory.total [MiB]"],
    ["timestamp", "index", "name", "memory.used [MiB]", "memory.total [MiB]", "utilization.gpu [%]"],
    ["index", "timestamp", "memory.used [MiB]"],
]


def smi_text(header: list[str], rows: int, gpus: int, units: bool, odd: str | None, rng: random.Random) -> str:
    lines = [", ".join(header)]
    for t in range(rows):
        stamp = f"2026/11/29 {10 + t // 3600:02d}:{t // 60 % 60:02d}:{t % 60:02d}.{rng.randrange(1000):03d}"
        for g in range(gpus):
            cells = {"timestamp": stamp, "index": str(g), "name": "NVIDIA H200",
                     "memory.used [MiB]": f"{rng.randrange(150_000) if t else 0}" + (" MiB" if units else ""),
                     "memory.total [MiB]": "143771" + (" MiB" if units else ""),
                     "utilization.gpu [%]": f"{rng.randrange(101)}" + (" %" if units else "")}
            lines.append(", ".join(cells[h] for h in header))
    if odd is not None:
        lines.insert(len(lines) // 2, odd)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("header", SMI_HEADERS, ids=["default", "index-util", "minimal"])
@pytest.mark.parametrize("odd", [None, "odd", "torn", "gap"])
@pytest.mark.parametrize("units", [True, False])
def test_nvidia_smi_fast_path_gives_the_per_line_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       header: list[str], odd: str | None, units: bool) -> None:
    rng = random.Random(len(header) * 7 + units)
    bad = None
    if odd == "odd":  # one line the fast path cannot vouch for: [N/A], a negative, a second-only timestamp
        cells = {"timestamp": "2026/11/29 10:00:00", "index": "0", "name": "X", "memory.used [MiB]": "[N/A]",
                 "memory.total [MiB]": "-5 MiB", "utilization.gpu [%]": "[Not Supported]"}
        bad = ", ".join(cells[h] for h in header)
    text = smi_text(header, rows=300, gpus=2, units=units, odd=bad, rng=rng)
    if odd == "torn":
        text = text[:-7]
    if odd == "gap":  # one GPU missing from one tick: positions counted line by line
        lines = text.split("\n")
        del lines[101]
        text = "\n".join(lines)
    path = tmp_path / "smi.csv"
    path.write_text(text)
    located = read_log(path)  # numpy (fastcsv), for this small file too: the fixture lowered its floor
    monkeypatch.setattr(logfile, "_smi_located", lambda *args: None)
    plain = read_log(path)  # whole-column str operations
    calls: list[str] = []
    monkeypatch.setattr(logfile, "_smi_plain", lambda *args: calls.append("plain") or None)
    slow = read_log(path)
    assert calls == ["plain"]  # the last read went line by line
    for fast in (located, plain):
        assert fast.kind == slow.kind == "nvidia-smi"
        assert dict(fast.raw) == dict(slow.raw)
        for column in slow.columns:
            assert fast.has(column) == slow.has(column), column
            assert fast.ints(column) == slow.ints(column), column
            assert [_key(v) for v in fast.floats(column)] == [_key(v) for v in slow.floats(column)], column
        assert fast.raw["time"][0].startswith("2026-11-29T10:00:00.") and fast.raw["time"][0].endswith("+00:00")
        assert len(fast) == 600 - (1 if odd in ("torn", "gap") else 0) + (1 if odd == "odd" else 0)
    # Which path took it: the usual output goes through numpy, anything odd line by line.
    assert isinstance(located.raw, LazyText) == (odd != "odd")


def test_nvidia_smi_fast_path_is_taken_for_the_usual_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "smi.csv"
    path.write_text(smi_text(SMI_HEADERS[0], rows=50, gpus=2, units=True, odd=None, rng=random.Random(1)))
    taken: list[str] = []

    def spying(name: str) -> Any:
        real = getattr(logfile, name)

        def spy(*args: object) -> object:
            result = real(*args)
            taken.append(f"{name}: {result is not None}")
            return result

        return spy

    for name in ("_smi_located", "_smi_plain"):
        monkeypatch.setattr(logfile, name, spying(name))
    table = read_log(path)
    assert taken == ["_smi_located: True"]
    assert table.ints("gpu")[:4] == [0, 1, 0, 1]
    assert table.ints("device_total_bytes")[0] == 143771 * 1024 * 1024


@pytest.mark.parametrize(
    ("stamp", "real"),
    [("2024/02/29 23:59:59.999", True), ("2000/02/29 00:00:00.000", True), ("1969/12/31 23:59:59.500", True),
     ("2026/02/29 10:00:00.000", False), ("1900/02/29 10:00:00.000", False), ("2026/13/01 10:00:00.000", False),
     ("2026/11/31 10:00:00.000", False), ("2026/11/29 24:00:00.000", False), ("2026/11/29 10:60:00.000", False),
     ("2026/11/29 10:00:60.000", False), ("0000/01/01 00:00:00.000", False), ("2026/00/10 10:00:00.000", False)],
)
@pytest.mark.parametrize("numpy_path", [True, False])
def test_nvidia_smi_stamps_are_real_dates_or_left_to_the_per_line_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamp: str, real: bool, numpy_path: bool
) -> None:
    rows = [f"2026/11/29 10:00:{s:02d}.000, 100 MiB, 200 MiB" for s in range(20)]
    rows.insert(5, f"{stamp}, 100 MiB, 200 MiB")
    path = tmp_path / "smi.csv"
    path.write_text("timestamp, memory.used [MiB], memory.total [MiB]\n" + "\n".join(rows) + "\n")
    if not numpy_path:
        monkeypatch.setattr(logfile, "_smi_located", lambda *args: None)
    table = read_log(path)
    assert isinstance(table.raw, LazyText) == real  # an impossible time: numpy hands the file back
    cell = table.raw["time"][5]
    if real:
        expected = stamp.replace("/", "-").replace(" ", "T") + "+00:00"
        assert cell == expected
        moment = datetime.fromisoformat(expected).timestamp()
        assert table.floats("elapsed_s")[5] == round(moment - table_start(table), 3)
    else:
        assert cell == ""  # datetime refuses it; the cell is unknown, the rows around it are read
        assert table.raw["time"][6] == "2026-11-29T10:00:05.000+00:00"


def table_start(table: LogTable) -> float:
    return datetime.fromisoformat(table.raw["time"][0]).timestamp()
