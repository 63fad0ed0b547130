"""Bad input in files: memory logs (vramscope CSV and JSON Lines, nvidia-smi CSV), rotated log sets, and
the config.json that ``plan --config`` reads, fuzzed with hypothesis.

The contract: ``read_log`` either returns a rectangular table or raises ``LogFormatError`` (one line
saying what is wrong), never anything else; a log cut anywhere by a crash keeps exactly its whole rows;
``vramscope report`` and ``vramscope plan --config`` answer a bad file with one line and exit 2, never a
traceback, and leave no half-written output.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vramscope.cli import main
from vramscope.logs.errors import LogFormatError
from vramscope.logs.reader import read_log
from vramscope.logs.schema import COLUMNS
from vramscope.logs.table import LogTable

CRASH_MARK = "run with --debug for the traceback"
EXAMPLES = int(os.environ.get("VRAMSCOPE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@contextmanager
def folder() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="vramscope-fuzzf-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def read_or_refuse(path: Path) -> LogTable | None:
    """The contract of read_log: a rectangular table, or LogFormatError with a one-line message."""
    try:
        table = read_log(path)
    except LogFormatError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return None
    lengths = {len(values) for values in table.raw.values()}
    assert len(lengths) <= 1, f"columns of different lengths: {lengths}"
    for column in table.columns:  # typed views never raise, whatever the cells hold
        table.ints(column)
        table.floats(column)
    return table


# -- cells and rows ---------------------------------------------------------------------------------------

CELL = st.one_of(
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "1.5",
            "1e9",
            "1e999",
            "nan",
            "inf",
            "-",
            "None",
            "null",
            "٣",
            "12 MiB",
            "2026-01-01T00:00:00+00:00",
            '"',
            '""',
            ",",
            "\r",
            "\n",
            "\x00",
            "\ufeff",
        ]
    ),
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
    st.text(max_size=8),
)
HEADERS = st.one_of(
    st.just(list(COLUMNS)),
    st.lists(st.sampled_from([*COLUMNS, "gpu", "time", "x", "", "time"]), min_size=1, max_size=12),
)


@st.composite
def vramscope_csv(draw: st.DrawFn) -> str:
    header = draw(HEADERS)
    rows = draw(st.lists(st.lists(CELL, min_size=0, max_size=len(header) + 2), max_size=8))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    text = newline.join([",".join(header), *(",".join(r) for r in rows)])
    return text + draw(st.sampled_from(["", newline]))


@st.composite
def nvidia_smi_csv(draw: st.DrawFn) -> str:
    fields = draw(
        st.lists(
            st.sampled_from(
                [
                    "timestamp",
                    "name",
                    "index",
                    "memory.used [MiB]",
                    "memory.total [MiB]",
                    "utilization.gpu [%]",
                    "memory.used",
                    "memory.free [MiB]",
                    "pci.bus_id",
                ]
            ),
            min_size=1,
            max_size=6,
            unique=True,
        ).filter(lambda f: any("memory.used" in x or "memory.total" in x for x in f))
    )
    cell = st.one_of(
        st.sampled_from(
            [
                "2024/01/15 10:23:45.123",
                "2024-01-15 10:23:45",
                "garbage",
                "1.2.3 MiB",
                ". MiB",
                "1e999 MiB",
                "9" * 400,
                "81559 MiB",
                "42 %",
                "[N/A]",
                "",
                "NVIDIA H200",
                "0",
            ]
        ),
        CELL,
    )
    rows = draw(st.lists(st.lists(cell, min_size=len(fields) - 1, max_size=len(fields) + 1), max_size=6))
    text = "\n".join([", ".join(fields), *(", ".join(r) for r in rows)])
    return text + draw(st.sampled_from(["", "\n"]))


@st.composite
def jsonl(draw: st.DrawFn) -> str:
    value = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5)),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
        max_leaves=6,
    )
    row = st.one_of(
        st.dictionaries(st.sampled_from(list(COLUMNS)), value, max_size=6).map(json.dumps),
        value.map(json.dumps),
        st.sampled_from(["{", "{}", '{"time":', "[1,2]", '{"a":' + "[" * 5000 + "]" * 5000 + "}", "1" * 5000]),
        st.text(max_size=20),
    )
    lines = draw(st.lists(row, min_size=1, max_size=6))
    first = "{" + json.dumps(draw(st.dictionaries(st.sampled_from(list(COLUMNS)), value, max_size=3)))[1:]
    return "\n".join([first, *lines]) + draw(st.sampled_from(["", "\n"]))


ANY_LOG = st.one_of(
    vramscope_csv(),
    nvidia_smi_csv(),
    jsonl(),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.text(max_size=200),
)


@FUZZ
@given(text=ANY_LOG)
def test_read_log_reads_or_refuses_any_file(text: str) -> None:
    with folder() as root:
        path = root / "log.csv"
        path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
        read_or_refuse(path)


@FUZZ
@given(text=ANY_LOG, parts=st.lists(ANY_LOG, min_size=1, max_size=3))
def test_a_rotated_set_with_damaged_parts_reads_or_refuses(text: str, parts: list[str]) -> None:
    with folder() as root:
        path = root / "m.csv"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        for n, part in enumerate(parts, start=1):
            Path(f"{path}.{n}").write_text(part, encoding="utf-8", errors="surrogatepass")
        table = read_or_refuse(path)
        alone = read_or_refuse_alone(path)
        if table is not None and alone is not None:
            assert len(table) >= len(alone)  # later parts add rows, never take the first file's away


def read_or_refuse_alone(path: Path) -> LogTable | None:
    with folder() as root:
        copy_ = root / path.name
        shutil.copy(path, copy_)
        return read_or_refuse(copy_)


# -- a log cut by a crash -------------------------------------------------------------------------------


def real_log(root: Path, name: str, samples: int = 12) -> Path:
    """A log written by the real sink (two fake GPUs), as a crash would find it."""
    import fake_nvml
    from vramscope.backends.host import HostBackend
    from vramscope.backends.nvml import NvmlBackend
    from vramscope.logs.sinks import log_sink
    from vramscope.sampling.sampler import Collector

    path = root / name
    sink = log_sink(path)
    collector = Collector(nvml=NvmlBackend(nvml=fake_nvml.two_healthy_gpus(pid=os.getpid())), host=HostBackend())
    for step in range(samples):
        sink.write(collector.collect(step=step))
    sink.close()
    return path


@pytest.mark.parametrize("name", ["m.csv", "m.jsonl"])
def test_a_log_cut_at_any_byte_keeps_exactly_its_whole_rows(name: str, tmp_path: Path) -> None:
    full = real_log(tmp_path, name).read_bytes()
    header = full.index(b"\n") + 1 if name.endswith(".csv") else 0
    cut = tmp_path / ("cut" + Path(name).suffix)
    # Every byte of the last three rows, and a spread over the rest: the reader must keep the whole rows.
    ends = sorted(set(range(len(full) - 700, len(full) + 1)) | set(range(header + 1, len(full), 97)))
    for end in ends:
        cut.write_bytes(full[:end])
        whole_rows = full[header:end].count(b"\n")
        if whole_rows == 0 and name.endswith(".jsonl"):
            with pytest.raises(LogFormatError):
                read_log(cut)
            continue
        table = read_log(cut)
        assert len(table) == whole_rows, end
        assert table.ints("step") == [i // 2 for i in range(whole_rows)]


def test_report_reads_a_cut_log_without_complaint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = real_log(tmp_path, "m.csv", samples=30).read_bytes()
    cut = tmp_path / "cut.csv"
    cut.write_bytes(full[: len(full) - 37])  # a crash mid-row
    assert main(["report", str(cut), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out)  # a report, from the whole rows


@FUZZ
@given(text=ANY_LOG, html=st.booleans())
# Found by this test: one reading at x = 2**53, where the hover's one-unit stretch (x + 1.0) is x again.
@example(text="time,allocated_bytes,time,elapsed_s,time\n,0,,9007199254740992.0,\n", html=True)
def test_report_on_any_file_answers_in_one_line(text: str, html: bool, capsys: pytest.CaptureFixture[str]) -> None:
    with folder() as root:
        path = root / "log.csv"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        out_file = root / "r.html"
        capsys.readouterr()
        code = main(["report", str(path), "--json", *(["--html", str(out_file)] if html else [])])
        out, err = capsys.readouterr()
        assert code in (0, 2), (code, err)
        assert "Traceback" not in err and CRASH_MARK not in err, err
        if code == 0:
            json.loads(out)
            assert out_file.exists() == html
        else:
            assert len(err.strip().splitlines()) == 1, err
            assert not out_file.exists()
        assert sorted(p.name for p in root.iterdir()) == sorted(
            {"log.csv", *(["r.html"] if code == 0 and html else [])}
        )


# -- config.json for plan -------------------------------------------------------------------------------


def llama_config() -> dict[str, Any]:
    from vramscope.planner import registry

    return copy.deepcopy(registry.get_config("Llama-2-7B"))


MUTATION = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(),
    st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([0, -1, 1, 2**63, 1e308, "4096", "silu", [], {}]),
)


@st.composite
def config_text(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "raw", "deep", "not-object"]))
    if kind == "raw":
        return draw(st.text(max_size=60))
    if kind == "deep":
        return '{"hidden_size": ' + "[" * 20_000 + "]" * 20_000 + "}"
    if kind == "not-object":
        return json.dumps(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=5))))
    cfg = llama_config()
    for key in draw(st.lists(st.sampled_from(sorted(cfg)), max_size=4, unique=True)):
        if draw(st.booleans()):
            del cfg[key]
        else:
            cfg[key] = draw(MUTATION)
    for key, value in draw(
        st.dictionaries(
            st.sampled_from(["text_config", "quantization_config", "head_dim", "num_experts", "sliding_window"]),
            MUTATION,
            max_size=2,
        )
    ).items():
        cfg[key] = value
    return json.dumps(cfg)


@FUZZ
@given(text=config_text(), json_out=st.booleans())
def test_plan_config_answers_any_config_in_one_line(
    text: str, json_out: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    with folder() as root:
        path = root / "config.json"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        capsys.readouterr()
        code = main(
            ["plan", "--config", str(path), "--batch-size", "1", "--seq-len", "256", *(["--json"] if json_out else [])]
        )
        out, err = capsys.readouterr()
        assert code in (0, 2), (code, err)
        assert "Traceback" not in err and CRASH_MARK not in err, (text[:300], err)
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and err.startswith("vramscope: error: "), err
        elif json_out:
            json.loads(out)


@pytest.mark.parametrize(
    ("name", "content", "rows"),
    [
        ("smi.csv", "timestamp, memory.used [MiB]", 0),  # killed before its first line end: StopIteration
        ("smi.csv", "timestamp, memory.used [MiB]\n2024/01/01 00:00:00, 1.2.3 MiB\n", 1),  # ValueError
        ("smi.csv", "timestamp, memory.used [MiB]\n2024/01/01 00:00:00, " + "9" * 400 + " MiB\n", 1),  # Overflow
        ("m.csv", ",".join(COLUMNS) + "\n\r0\n", 0),  # a stray carriage return: csv.Error
        ("m.jsonl", '{"time": "t", "gpu": 0}\n{"a":' + "[" * 5000 + "]" * 5000 + "}\n", 1),  # RecursionError
        ("m.jsonl", '{"time": "t", "gpu": 0}\n' + "1" * 5000 + "\n", 1),  # int beyond 4300 digits: ValueError
    ],
)
def test_found_by_fuzzing(name: str, content: str, rows: int, tmp_path: Path) -> None:
    """Files the fuzzer found crashing read_log; each now reads, the bad cells as unknown, bad lines skipped."""
    path = tmp_path / name
    path.write_text(content)
    table = read_or_refuse(path)
    assert table is not None and len(table) == rows
    if name == "smi.csv" and rows:
        assert table.ints("device_used_bytes") == [None]


def test_config_nested_too_deep_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by test_plan_config_answers_any_config_in_one_line: RecursionError escaped load_config_file."""
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": ' + "[" * 20_000 + "]" * 20_000 + "}")
    assert main(["plan", "--config", str(config), "--batch-size", "1", "--seq-len", "256"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vramscope: error: ") and "not a config.json vramscope can read" in err
    assert len(err.strip().splitlines()) == 1
