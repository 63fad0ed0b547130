"""One table of log formats (issue 23): the entry that recognised a file is the table's ``log_format``, and what a
log is (rotated how, imported, needing a memory column, its total's source) is asked of that entry's typed
fields, never of its name as a string outside ``logs/formats.py``.

Real files: the real sampler and sinks write vramscope's logs; nvidia-smi's CSV as nvidia-smi writes it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_report_fixtures import Run, write_nvidia_smi_log, write_rotated_log, write_training_log
from vramscope.cli import main
from vramscope.logs import formats
from vramscope.logs.errors import LogFormatError, UnknownLogError
from vramscope.logs.formats import FORMATS, MAPPED, OWN_CSV, LogFormat
from vramscope.logs.mapping import parse_columns
from vramscope.logs.reader import read_any_log, read_log
from vramscope.logs.table import MADE_IN_MEMORY, LogTable
from vramscope.report.load import report_file

SRC = Path(__file__).resolve().parent.parent / "src" / "vramscope"


def entry(kind: str, imported: bool = False) -> LogFormat:
    return next(f for f in FORMATS if f.kind == kind and f.imported == imported)


def test_each_file_is_marked_with_the_entry_that_read_it(tmp_path: Path) -> None:
    own = write_training_log(tmp_path / "train.csv", Run(steps=12, gpus=1))
    jsonl = write_training_log(tmp_path / "train.jsonl", Run(steps=12, gpus=1))
    smi = write_nvidia_smi_log(tmp_path / "smi.csv", rows=10, gpus=2)
    headerless = tmp_path / "noheader.csv"
    headerless.write_text("".join(smi.read_text().splitlines(keepends=True)[1:]))
    hand = tmp_path / "loop.csv"
    hand.write_text("".join(f"2026-12-01 08:00:{s:02d}.5,{s},{1.5 + s / 100:.2f},{2.0 + s / 100:.2f}\n"
                            for s in range(20)))
    read = {"own": read_any_log(own), "jsonl": read_any_log(jsonl), "smi": read_any_log(smi),
            "headerless": read_any_log(headerless), "hand": read_any_log(hand),
            "mapped": read_any_log(hand, parse_columns("step=1,allocated=2:GiB"))}
    assert read["own"].log_format is OWN_CSV and read_log(own).log_format is OWN_CSV
    assert read["jsonl"].log_format is entry("jsonl")
    assert read["smi"].log_format is entry("nvidia-smi")
    assert read["headerless"].log_format is entry("nvidia-smi", imported=True)
    assert read["hand"].log_format is entry("hand-written", imported=True)
    assert read["mapped"].log_format is MAPPED
    # The name people read is the entry's, whichever entry it is (two read nvidia-smi's CSV).
    assert {k: t.kind for k, t in read.items()} == {
        "own": "vramscope", "jsonl": "jsonl", "smi": "nvidia-smi", "headerless": "nvidia-smi",
        "hand": "hand-written", "mapped": "mapped"}
    # A selection of a table's rows is of the same log.
    assert read["smi"].select(gpu=1).log_format is entry("nvidia-smi") and len(read["smi"].select(gpu=1)) == 10


def test_a_rotated_log_joined_from_its_parts_is_of_its_first_parts_format(tmp_path: Path) -> None:
    write_rotated_log(tmp_path / "r.csv")
    assert (tmp_path / "r.csv.2").exists()
    for reader in (read_log, read_any_log):
        table = reader(tmp_path / "r.csv")
        assert table.log_format is OWN_CSV and OWN_CSV.rotated == "same-header"
        assert len(table) == 80 and table.ints("step")[-1] == 39  # every part, in order


def test_vramscopes_header_names_without_a_memory_column_are_someone_elses_csv(tmp_path: Path) -> None:
    """``time`` and ``gpu`` are all OWN_CSV's sniff sees: the entry says a memory column is needed too."""
    path = tmp_path / "theirs.csv"
    path.write_text("time,gpu,allocated_gb\n" + "".join(f"2026-12-01 08:00:{s:02d},0,{1 + s / 10:.1f}\n"
                                                          for s in range(20)))
    assert OWN_CSV.memory_column_needed and not any(f.memory_column_needed for f in FORMATS if f is not OWN_CSV)
    assert read_log(path).log_format is OWN_CSV  # vramscope's own formats only: its header is vramscope's
    table = read_any_log(path)
    assert table.log_format is entry("hand-written", imported=True)
    assert table.ints("allocated_bytes")[10] == 2 * 2**30


def test_the_capacity_caption_names_what_the_format_read_the_total_from(tmp_path: Path) -> None:
    smi = write_nvidia_smi_log(tmp_path / "smi.csv", rows=30, gpus=1)
    headerless = tmp_path / "noheader.csv"
    headerless.write_text("".join(smi.read_text().splitlines(keepends=True)[1:]))
    own = write_training_log(tmp_path / "train.csv", Run(steps=30, gpus=1))
    captions = {}
    for name, path in (("smi", smi), ("headerless", headerless), ("own", own)):
        report = report_file(path)
        captions[name] = report.devices[0].timeline.capacity_source
        assert report.log_format == read_any_log(path).log_format.kind  # type: ignore[union-attr]
    assert captions == {"smi": "GPU total, nvidia-smi memory.total",
                        "headerless": "GPU total, nvidia-smi memory.total", "own": "GPU total, NVML"}
    assert entry("nvidia-smi").total_from == entry("nvidia-smi", imported=True).total_from == \
        "nvidia-smi memory.total"
    assert report_file(smi, capacity_bytes=24 * 2**30).devices[0].timeline.capacity_source == "--gpu-memory"


def _loop_log(path: Path, header: str) -> Path:
    """A training loop's own log, as a user's loop writes it: time, step, allocated, reserved and the card's
    total (``torch.cuda.mem_get_info()[1] / 1024**3``), in GiB."""
    lines = [f"2026-12-01 08:{s // 60:02d}:{s % 60:02d}.5,{s},{10 + s / 20:.2f},{12 + s / 20:.2f},79.19"
             for s in range(60)]
    path.write_text(header + "\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_total_the_users_own_log_wrote_is_captioned_as_its_not_nvmls(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import html
    import re

    loop = _loop_log(tmp_path / "loop.csv", "time,step,allocated_gb,reserved_gb,total_gb")
    theirs = _loop_log(tmp_path / "theirs.csv", "when,it,a,r,cap")
    mapping = ["--columns", "time=when,step=it,allocated=a:GiB,reserved=r:GiB,total=cap:GiB"]
    expected = {"loop": "GPU total, your log's total column", "theirs": "GPU total, your log's --columns total= column"}
    assert entry("hand-written", imported=True).total_from == "your log's total column"
    assert MAPPED.total_from == "your log's --columns total= column"
    for name, path, extra in (("loop", loop, []), ("theirs", theirs, mapping)):
        caption = expected[name]
        capsys.readouterr()
        assert main(["report", str(path), *extra]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"GPU 0 · capacity 79.19 GiB ({caption})" in out and "NVML" not in out
        page = tmp_path / f"{name}.html"
        assert main(["report", str(path), "--html", str(page), *extra]) == 0
        texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", page.read_text("utf-8"))]
        named = {t for t in texts if t.startswith("capacity ")}  # each chart's label of its capacity line
        assert named and all(t.startswith(f"capacity 79.2 GiB ({caption})") for t in named), named
        assert not any("NVML" in t for t in texts)
        capsys.readouterr()
        assert main(["report", str(path), "--json", *extra]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [d["capacity_source"] for d in data["devices"].values()] == [caption]


def test_the_cli_json_says_the_entrys_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    smi = write_nvidia_smi_log(tmp_path / "smi.csv", rows=30, gpus=1)
    assert main(["report", str(smi), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["log"]["format"] == "nvidia-smi"
    assert [d["capacity_source"] for d in data["devices"].values()] == ["GPU total, nvidia-smi memory.total"]


def test_what_no_format_reads_is_refused_in_a_line_naming_every_format_of_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    notes = tmp_path / "notes.csv"
    notes.write_text("name,colour\nfoo,blue\n")
    assert all(f.called for f in FORMATS) and not MAPPED.called  # each format says how the refusal calls it
    assert main(["report", str(notes)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (f"vramscope: error: {notes} is not a vramscope log, an nvidia-smi --query-gpu CSV or a "
                    "datetime,step,allocated,reserved log (its first line is 'name,colour'); read any CSV with "
                    "--columns time=0,step=1,allocated=2:GiB,reserved=3:GiB (0-based columns or header names, a "
                    "unit for each memory column)")
    # A format added to the table is named with the others, no message written again (issue 23: one place).
    added = LogFormat("fake", lambda _source: False, OWN_CSV.read, imported=True, called="a FAKELOG file")
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, added))
    assert main(["report", str(notes)]) == 2
    assert "datetime,step,allocated,reserved log or a FAKELOG file (its first line" in capsys.readouterr().err


def _report_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(["report", "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_report_help_and_read_logs_refusal_name_the_formats_of_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``report --help`` and ``read_log``'s refusal say what they said in words of their own (save read_log's
    "nvidia-smi --query-gpu CSV", the table's ``called``), now from the table; a format added to it is named in
    both, nothing else written again (issue 23)."""
    monkeypatch.setenv("COLUMNS", "2000")  # one line an option: argparse wraps at hyphens ("nvidia-" "smi")
    notes = tmp_path / "notes.csv"
    notes.write_text("name,colour\nfoo,blue\n")
    made_by = ("use a file from 'vramscope run --log' or "
               "'nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total ")
    with pytest.raises(UnknownLogError) as refused:
        read_log(notes)
    assert str(refused.value) == (f"{notes} is not a vramscope log or an nvidia-smi --query-gpu CSV (its header is "
                                  f"'name,colour'); {made_by}--format=csv'")
    assert refused.value.first_line == "name,colour"
    usage = _report_help(capsys)
    assert "LOG memory logs (vramscope .csv/.jsonl or nvidia-smi CSV); two or more are compared" in usage
    assert ("Without it: vramscope .csv/.jsonl, nvidia-smi CSV, headerless nvidia-smi CSV (noheader, nounits) and "
            "datetime,step,allocated GiB,reserved GiB lines are read as they are") in usage

    added = LogFormat("fake", lambda source: source.header.startswith("FAKELOG"), OWN_CSV.read, called="a FAKELOG file",
                      made_by="'fakelog --out'", listed="FAKELOG files")
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, added))
    with pytest.raises(UnknownLogError) as refused:
        read_log(notes)
    assert str(refused.value) == (f"{notes} is not a vramscope log, an nvidia-smi --query-gpu CSV or a FAKELOG file "
                                  f"(its header is 'name,colour'); {made_by}--format=csv' or 'fakelog --out'")
    # A folder given for the log is told to give one of the same formats.
    with pytest.raises(LogFormatError, match=r"is a folder; give a vramscope log, an nvidia-smi --query-gpu CSV or "
                                             r"a FAKELOG file$"):
        read_log(tmp_path)
    usage = _report_help(capsys)
    assert "memory logs (vramscope .csv/.jsonl, nvidia-smi CSV or FAKELOG files); two or more are compared" in usage
    assert ("headerless nvidia-smi CSV (noheader, nounits), datetime,step,allocated GiB,reserved GiB lines and "
            "FAKELOG files are read as they are") in usage
    # An imported format (read only by read_any_log, the report's reader) is named where the report's help lists
    # every format, not among read_log's.
    imported = LogFormat("fake2", lambda _source: False, OWN_CSV.read, imported=True, called="a FAKE2 file",
                         listed="FAKE2 files")
    monkeypatch.setattr(formats, "FORMATS", (*FORMATS, imported))
    usage = _report_help(capsys)
    assert "memory logs (vramscope .csv/.jsonl or nvidia-smi CSV); two" in usage and "lines and FAKE2 files" in usage
    with pytest.raises(UnknownLogError) as refused:
        read_log(notes)
    assert "FAKE2" not in str(refused.value)
    with pytest.raises(LogFormatError) as folder:
        read_log(tmp_path)
    assert "FAKE2" not in str(folder.value)


def test_reading_the_words_of_the_table_loads_no_reader() -> None:
    """Every command builds ``report``'s parser, whose help names the formats: the table imports its readers (numpy,
    pyarrow) only when a log is read."""
    code = ("import sys; from vramscope.logs import formats; from vramscope.cli import build_parser; build_parser()\n"
            "print(formats.listed(imported=False), sorted(m for m in ('numpy', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "vramscope .csv/.jsonl or nvidia-smi CSV []"


def test_a_table_made_in_memory_is_called_what_the_report_calls_it() -> None:
    table = LogTable("x", {"gpu": ["0"], "allocated_bytes": ["1"]})
    assert table.log_format is None and table.kind == MADE_IN_MEMORY == OWN_CSV.kind


def _compares_a_log_kind(node: ast.Compare, kinds: set[str]) -> bool:
    operands = [node.left, *node.comparators]
    names = {c.value for o in operands for c in ast.walk(o) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    on_kind = any((isinstance(o, ast.Attribute) and o.attr in ("kind", "log_format"))
                  or (isinstance(o, ast.Name) and o.id in ("kind", "log_format")) for o in operands)
    return on_kind and bool(names & kinds)


def test_no_module_compares_a_log_kind_as_a_string_outside_the_formats_table() -> None:
    kinds = {f.kind for f in (*FORMATS, MAPPED)}
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "logs" / "formats.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(SRC)}:{n.lineno}" for n in ast.walk(tree)
                  if isinstance(n, ast.Compare) and _compares_a_log_kind(n, kinds)]
    assert found == []


def test_the_kind_checker_sees_a_comparison() -> None:
    kinds = {"nvidia-smi", "vramscope"}
    seen = [_compares_a_log_kind(n, kinds) for n in ast.walk(ast.parse(
        'a = table.kind != "vramscope"\nb = log_format in ("nvidia-smi", "x")\nc = mark.kind == "peak"\n'))
        if isinstance(n, ast.Compare)]
    assert seen == [True, True, False]
