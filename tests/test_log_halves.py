"""A large log is read in two halves at once (:mod:`vramscope.logs.halves`): the table is the one stream's, cell
for cell, whatever lies on either side of the split.

Each log here is read twice: as one stream (the split turned off) and in halves (from the first byte on, as if
two cores were there), and every column is held to be the same in every way the analysis reads it. The logs put
what the second half's columns must join onto in its way: a column only one half fills, a label first seen after
the middle, a column of one value in each half but not the same one, an odd cell only past the middle, rows of
another width, a blank line, Windows line ends; a quote or a ``0x`` only in the second half leaves the fast
path as the one stream does; the second half never starts at a line that begins with a BOM (pyarrow would drop
it) or on rows of another width (parsed on pyarrow's own thread, ten times as dear). The per-cell rules themselves
are held by ``test_log_cells`` and ``test_log_blocks`` (run in halves too).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from test_log_cells import same_smi, same_table, smi_text
from vramscope.logs import csv_reader, halves, source
from vramscope.logs.reader import read_log
from vramscope.logs.source import LogSource
from vramscope.logs.table import LogTable

ROWS = 6_000  # several pyarrow blocks would need a MiB; the halves need only two lines each

HEADER = ["time", "elapsed_s", "step", "gpu", "allocated_bytes", "reserved_bytes", "device_total_bytes", "tokens",
          "num_ooms", "phase", "gpu_uuid", "rank"]


def _cells(i: int, rng: random.Random, what: str) -> dict[str, str]:
    second = i >= ROWS // 2
    cells = {
        "time": f"2026-11-29T10:{i // 600 % 60:02d}:{i // 10 % 60:02d}.{i % 10}00+00:00",
        "elapsed_s": f"{i * 0.1:.3f}",
        "step": str(i) if second else "",  # filled by the second half only
        "gpu": "0",
        "allocated_bytes": str(10**9 + rng.randrange(10**6)),
        "reserved_bytes": "7" if second else "",
        "device_total_bytes": "150754820096" if not second else "85899345920",  # one value a half, not the same
        "tokens": str(2048 + i % 7) if not second else "",  # filled by the first half only
        "num_ooms": "",  # never logged
        "phase": "train" if not second or i % 50 else "eval",  # "eval" first seen past the middle
        "gpu_uuid": "GPU-a" if not second else "GPU-b",
        "rank": "",
    }
    if what == "odd" and second and i % 401 == 7:
        cells["reserved_bytes"] = "-9223372036854775808"  # there, yet no number: only past the middle
    if what == "nan" and second and i % 333 == 1:
        cells["elapsed_s"] = "nan"
    if what == "quote" and i == ROWS - 5:
        cells["phase"] = '"train"'
    if what == "hex" and i == ROWS - 5:
        cells["allocated_bytes"] = "0x10"
    if what == "exponent" and i == ROWS - 5:
        cells["allocated_bytes"] = "1.2e9"
    return cells


def _write_log(path: Path, what: str, line_end: str = "\n") -> None:
    rng = random.Random(7)
    lines = [",".join(HEADER)]
    for i in range(ROWS):
        lines.append(",".join(_cells(i, rng, what)[h] for h in HEADER))
        if what == "torn" and i % 1500 == 3:
            lines.append("2026-11-29T10:00:00.000+00:00,1.0,7")  # another width: skipped
        if what == "blank" and i in (ROWS // 2 - 1, ROWS // 2, ROWS // 2 + 1):
            lines.append("")
    path.write_text(line_end.join(lines) + line_end + "2026-11-29T11:00:00.000+00:00,0.5,12", newline="")


def _split_on(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(halves, "SPLIT_FROM", 1 if on else 1 << 62)
    monkeypatch.setattr(halves, "cores", lambda: 2)


def _snapshot(table: LogTable) -> tuple[int, dict[str, object]]:
    out: dict[str, object] = {}
    for column in table.columns:
        data = table.column_data(column)
        assert data is not None
        ints, floats, labels = data.ints(), data.floats(), data.labels()
        out[column] = (ints.values.tobytes(), ints.known.tobytes(), floats.values.tobytes(), floats.known.tobytes(),
                       labels.codes.tobytes(), tuple(labels.names), data.filled(), tuple(data.texts()),
                       table.has(column))
    return len(table), out


def _both(path: Path, monkeypatch: pytest.MonkeyPatch, only: frozenset[str] | None = None
          ) -> tuple[LogTable, LogTable]:
    _split_on(monkeypatch, False)
    whole = read_log(path, only=only)
    _split_on(monkeypatch, True)
    return whole, read_log(path, only=only)


@pytest.mark.parametrize("what", ["plain", "odd", "nan", "torn", "blank", "quote", "hex", "exponent"])
def test_the_halves_make_the_one_streams_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    path = tmp_path / "mem.csv"
    _write_log(path, what)
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole)
    assert len(whole) == ROWS  # the torn last line is no row; rows of another width and blank lines neither
    _split_on(monkeypatch, True)
    same_table(path)  # and both are the per-cell rules' cells


def test_what_joins_at_the_middle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mem.csv"
    _write_log(path, "odd")
    _, split = _both(path, monkeypatch)
    step, tokens, total = split.int_column("step"), split.int_column("tokens"), split.int_column("device_total_bytes")
    assert not step.known[: ROWS // 2].any() and step.known[ROWS // 2 :].all()
    assert tokens.known[: ROWS // 2].all() and not tokens.known[ROWS // 2 :].any()
    assert set(total.values[: ROWS // 2].tolist()) == {150754820096}
    assert set(total.values[ROWS // 2 :].tolist()) == {85899345920}
    assert split.labels("phase").names == ["train", "eval"]
    assert split.labels("gpu_uuid").names == ["GPU-a", "GPU-b"]
    reserved = split.int_column("reserved_bytes")
    odd = [i for i in range(ROWS // 2, ROWS) if i % 401 == 7]  # there, yet no number: unknown
    assert not reserved.known[: ROWS // 2].any() and not reserved.known[odd].any()
    assert int(reserved.known.sum()) == ROWS - ROWS // 2 - len(odd)
    assert not split.has("num_ooms") and not split.has("rank")


def test_windows_line_ends_and_only_some_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mem.csv"
    _write_log(path, "plain", line_end="\r\n")
    only = frozenset({"time", "step", "phase", "tokens"})
    whole, split = _both(path, monkeypatch, only)
    assert split.columns == ["time", "step", "tokens", "phase"]
    assert _snapshot(split) == _snapshot(whole)


@pytest.mark.parametrize("odd", [None, "[N/A]"])
def test_nvidia_smi_halves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: str | None) -> None:
    header = ["timestamp", "name", "memory.used [MiB]", "memory.total [MiB]"]
    bad = None if odd is None else "2026/11/29 10:00:00, NVIDIA H200, [N/A], 143771 MiB"
    path = tmp_path / "smi.csv"
    path.write_text(smi_text(header, rows=30_000, gpus=2, units=True, odd=bad, rng=random.Random(5)))
    monkeypatch.setattr("vramscope.logs.smi_reader.STREAM_FROM", 1)
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole)
    same_smi(path)


def test_the_split_is_at_a_lines_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mem.csv"
    path.write_bytes(b"time,gpu\n" + b"".join(b"%d,0\n" % i for i in range(1000)) + b"7,")
    _split_on(monkeypatch, True)
    with LogSource(str(path), "a log") as source:
        start = source.header_end + 1
        first, second = halves.halves(source, start)
        head, tail = first.read(-1), second.read(-1)
        assert head.endswith(b"\n") and tail.endswith(b"\n") and not tail.startswith(b"\n")
        assert abs(len(head) - len(tail)) <= 12 and head + tail == path.read_bytes()[start : -2]
        assert first.length == len(head) and second.length == len(tail)
    _split_on(monkeypatch, False)
    with LogSource(str(path), "a log") as source:
        assert len(halves.halves(source, source.header_end + 1)) == 1


def test_one_core_reads_one_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mem.csv"
    path.write_bytes(b"time,gpu\n" + b"1,0\n" * 100)
    monkeypatch.setattr(halves, "SPLIT_FROM", 1)
    monkeypatch.setattr(halves, "cores", lambda: 1)
    with LogSource(str(path), "a log") as source:
        assert len(halves.halves(source, source.header_end + 1)) == 1


def test_jobs_run_at_once_and_a_failure_is_raised_after_all_end() -> None:
    both_in = threading.Barrier(2, timeout=10)  # each job waits for the other: they run at the same time
    ended: list[int] = []

    def job(k: int) -> int:
        both_in.wait()
        ended.append(k)
        return k * 10

    assert halves.read_at_once([lambda: job(0), lambda: job(1)]) == [0, 10]
    again = threading.Barrier(2, timeout=10)

    def fails() -> int:
        again.wait()
        raise ValueError("bad cell")

    def slow() -> int:
        again.wait()
        ended.append(2)
        return 1

    with pytest.raises(ValueError, match="bad cell"):
        halves.read_at_once([fails, slow])
    assert sorted(ended) == [0, 1, 2]  # the second job ended before the failure was raised
    assert halves.read_at_once([]) == []


def test_ctrl_c_in_the_callers_half_is_raised_without_waiting_for_the_other() -> None:
    """Python raises a Ctrl-C in the main thread, the caller's half; the report stops then, not once the other
    half's parse has ended."""
    released = threading.Event()
    ended: list[str] = []

    def interrupted() -> int:
        raise KeyboardInterrupt

    def other_half() -> int:
        released.wait(timeout=10)
        ended.append("other")
        return 1

    with pytest.raises(KeyboardInterrupt):
        halves.read_at_once([interrupted, other_half])
    assert ended == []  # raised while the other half was still parsing
    released.set()
    deadline = time.monotonic() + 10
    while not ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended == ["other"]


def test_cores_is_what_the_process_may_use() -> None:
    if hasattr(os, "sched_getaffinity"):
        assert halves.cores() == len(os.sched_getaffinity(0))  # a taskset's or a container's, not the machine's
    else:
        assert halves.cores() == (os.cpu_count() or 1)


@pytest.mark.parametrize("late", ["45.5 %", "[N/A]", "[Not Supported]"])
def test_nvidia_smi_percentages_of_a_fraction_in_one_half_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               late: str) -> None:
    # Each half parses its own cells; a fraction past the middle makes the whole column floats, as it does read
    # as one column (a whole number is exact either way), and "[N/A]" there is unknown in either.
    header = ["timestamp", "index", "name", "memory.used [MiB]", "memory.total [MiB]", "utilization.gpu [%]"]
    lines = [", ".join(header)]
    for t in range(20_000):
        util = late if t == 15_000 else f"{t % 101} %"
        used = "[N/A]" if t == 3 else f"{20_000 + t % 977} MiB"
        lines.append(f"2026/11/29 10:{t // 600 % 60:02d}:{t // 10 % 60:02d}.{t % 10}00, {t % 2}, NVIDIA H200, "
                     f"{used}, 143771 MiB, {util}")
    path = tmp_path / "smi.csv"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr("vramscope.logs.smi_reader.STREAM_FROM", 1)
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole)
    util_column = split.column_data("utilization_pct")
    assert util_column is not None
    assert util_column.floats().values[15_000] == (45.5 if late == "45.5 %" else 0.0)
    assert not split.int_column("device_used_bytes").known[3]
    same_smi(path)


def _bom_after_the_middle(header: bytes, lines: list[bytes]) -> bytes:
    """The log with a UTF-8 BOM at the start of the three lines after its middle (logs put end to end by cat, the
    second written by a Windows editor): the split's line, wherever the BOMs move the middle to, begins with one."""
    body = b"".join(lines)
    cut = body.find(b"\n", len(body) // 2) + 1
    after = body[cut:].split(b"\n")
    after[:3] = [b"\xef\xbb\xbf" + line for line in after[:3]]
    return header + body[:cut] + b"\n".join(after)


@pytest.mark.parametrize("kind", ["vramscope", "nvidia-smi"])
def test_a_bom_at_the_middle_stays_in_its_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    # pyarrow drops a BOM at a stream's start: the second half must not start at a line that begins with one.
    path = tmp_path / "log.csv"
    if kind == "vramscope":
        path.write_bytes(_bom_after_the_middle(b"time,gpu,allocated_bytes\n", [
            b"2026-11-29T10:%02d:%02d.000+00:00,0,%d\n" % (i // 60 % 60, i % 60, 10**9 + i) for i in range(4000)]))
    else:
        monkeypatch.setattr("vramscope.logs.smi_reader.STREAM_FROM", 1)
        path.write_bytes(_bom_after_the_middle(b"timestamp, index, memory.used [MiB]\n", [
            b"2026/11/29 10:%02d:%02d.000, 0, %d MiB\n" % (i // 60 % 60, i % 60, i) for i in range(4000)]))
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole)
    time = split.column_data("time")
    assert time is not None and len(split) == 4000
    if kind == "vramscope":
        assert sum(text.startswith("\ufeff") for text in time.texts() if text) == 3  # kept in the cells
    else:
        assert sum(text is None for text in time.texts()) == 3  # no stamp nvidia-smi writes: unknown


@pytest.mark.parametrize("split", [False, True])
def test_blank_mebibytes_where_a_stream_starts_cost_no_paced_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  split: bool) -> None:
    # pyarrow reads a stream's first blocks in open_csv, before any batch can be taken: a paced read there waited
    # its whole timeout for nothing (0.25 s a blank MiB). Here a wait would take the test past its bound.
    monkeypatch.setattr(source, "PACE_WAIT_S", 30.0)
    rows = b"".join(b"2026-11-29T10:00:00.000+00:00,%d,0,%d\n" % (i, 10**9 + i) for i in range(20_000))
    path = tmp_path / "mem.csv"
    # One stream starts on 6 MiB of blank lines; split, the second half on 5 MiB (the middle of 10 MiB of them).
    path.write_bytes(b"time,step,gpu,allocated_bytes\n" + (rows + b"\n" * (10 << 20) if split else
                                                          b"\n" * (6 << 20) + rows) + rows)
    _split_on(monkeypatch, split)
    began = time.monotonic()
    table = read_log(path)
    assert time.monotonic() - began < 20
    assert len(table) == 40_000
    assert table.int_column("step").values[-1] == 19_999


def test_rows_of_another_width_end_the_pacing(tmp_path: Path) -> None:
    # Each such row is skipped by a call into Python, ten times as dear on pyarrow's reading thread, where a paced
    # read moves the parse (a torn MiB 0.18 s against 0.015 s): the stream hands blocks out unpaced after one.
    good = b"".join(b"2026-11-29T10:00:00.000+00:00,%d,0\n" % i for i in range(30_000))
    path = tmp_path / "mem.csv"
    torn = b"2026-11-29T10:00:00.000+00:00,7\n" * 100_000
    for body, paced in ((good * 4, True), (good + torn + good, False), (torn + good * 4, False)):
        path.write_bytes(b"time,step,gpu\n" + body)
        with LogSource(str(path), "a log") as log:
            stream = log.lines(log.header_end + 1)
            blocks = list(csv_reader._blocks(stream, 3, {"time": 0, "step": 1, "gpu": 2}, typed=True, threads=False,
                                             quotes=False))
            assert sum(len(block["step"]) for block in blocks) == len(body.split(b"\n")) - 1 - (0 if paced else
                                                                                                 100_000)
            assert stream.paced is paced


def test_a_log_whose_every_line_begins_with_a_bom_is_one_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    # The middle passes over a few lines that begin with a BOM, not every line of the log (a read of 64 KiB each).
    path = tmp_path / "mem.csv"
    path.write_bytes(b"time,gpu,allocated_bytes\n" + b"".join(
        b"\xef\xbb\xbf2026-11-29T10:00:%02d.000+00:00,0,%d\n" % (i % 60, i) for i in range(4000)))
    _split_on(monkeypatch, True)
    looked: list[int] = []
    line_at = LogSource.line_at
    monkeypatch.setattr(LogSource, "line_at", lambda self, at: looked.append(at) or line_at(self, at))
    with LogSource(str(path), "a log") as log:
        assert len(halves.halves(log, log.header_end + 1)) == 1
    assert len(looked) <= 65  # 2000 lines lie past the middle
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole) and len(split) == 4000


@pytest.mark.parametrize("torn_from", [0.1, 0.5])
def test_the_second_half_starts_on_a_row_of_the_headers_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              torn_from: float) -> None:
    # A stream that starts on rows of another width is parsed on pyarrow's own thread, where the Python call that
    # skips each costs ten times as much: the middle moves on to a row of the header's width, or the log is one
    # stream (its rows of another width then parsed where the good rows before them were).
    good = [b"2026-11-29T10:00:%02d.000+00:00,%d,0,%d\n" % (i % 60, i, 10**9 + i) for i in range(40_000)]
    torn = b"2026-11-29T10:00:00.000+00:00,7\n"
    cut = int(len(good) * torn_from)
    path = tmp_path / "mem.csv"
    path.write_bytes(b"time,step,gpu,allocated_bytes\n" + b"".join(good[:cut]) + torn * 30_000 + b"".join(good[cut:]))
    _split_on(monkeypatch, True)
    with LogSource(str(path), "a log") as log:
        streams = halves.halves(log, log.header_end + 1)
        if len(streams) == 2:
            assert streams[1].read(4096).split(b"\n")[0].count(b",") == 3
    assert len(streams) == (2 if torn_from == 0.1 else 1)  # the middle past the rows of another width / amid them
    whole, split = _both(path, monkeypatch)
    assert _snapshot(split) == _snapshot(whole) and len(split) == 40_000
