"""Bad input on the command line: every flag of every subcommand, fuzzed with hypothesis.

The flags are not listed here: they are read from the real argparse parser, so a flag added tomorrow is
fuzzed tomorrow. Each example runs ``vramscope.cli.main(argv)`` in-process and checks what a person at
a terminal would see:

* the exit code is a documented one (0, 1 for a command that could not do its work, 2 for bad usage,
  127 for a command that does not exist);
* on failure, exactly one ``vramscope: error:`` line, and never a traceback or the catch-all
  "run with --debug for the traceback" (that line means an exception nobody meant to raise);
* no output file left behind by a failed command, and no temporary file by any command.

``run`` really runs ``true``, ``watch`` reads a fake NVML (two GPUs), ``report`` reads a real log; example
counts are kept small so the whole file takes seconds. Network stays on 127.0.0.1: fuzzed Prometheus
addresses that would bind a fixed port are left out (other tests on this machine use those).
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fake_nvml
from vramscope.backends import nvml as nvml_backend
from vramscope.cli import build_parser, main

DOCUMENTED_EXIT_CODES = {0, 1, 2, 127}
CRASH_MARK = "run with --debug for the traceback"
OUTPUT_DESTS = {"log", "csv", "html", "png"}  # flags that name a file the command writes

# Argument text as a shell can pass it: no NUL (argv is C strings) and no lone surrogates (tested with
# real bytes in a subprocess below).
SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
INTERESTING = [
    "",
    " ",
    "0",
    "-0",
    "1",
    "-1",
    "0.05",
    "0.049",
    "2",
    "1e308",
    "1e-308",
    "nan",
    "inf",
    "-inf",
    "abc",
    "1,2",
    "0,,1",
    "-1,0",
    ",",
    "99999999999999999999",
    "0x10",
    "1_000",
    "\uff11",  # a fullwidth 1: int() takes it
    "24GiB",
    "80GB",
    "-5GiB",
    "all-linear",
    "q_proj,v_proj",
    "Llama-2-7B",
    "H200",
    "--",
    "-",
    "=",
    "%s",
    "{}",
    "<b>x</b>",
]
VALUES = st.one_of(
    st.sampled_from(INTERESTING),
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    SAFE_TEXT,
)


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("vramscope has no subcommands")


SUBPARSERS = subparsers()


def flags(command: str) -> list[argparse.Action]:
    """Every optional flag of a subcommand, as argparse knows it (help left out: it exits by design)."""
    return [
        a
        for a in SUBPARSERS[command]._actions
        if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]


class Workspace:
    """A fresh folder per example, with paths good and bad for file flags."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="vramscope-fuzz-"))
        self.log = self.root / "in.csv"
        self.log.write_text(
            "time,elapsed_s,step,gpu,allocated_bytes,reserved_bytes,peak_allocated_bytes,device_used_bytes,"
            "device_total_bytes,process_bytes,host_rss_bytes\n"
            + "".join(
                f"2026-01-01T00:00:{i:02d}.000+00:00,{i},{i},0,{i << 20},{2 * i << 20},{i << 20},{3 * i << 20},"
                f"{80 << 30},{i << 20},{1 << 30}\n"
                for i in range(1, 30)
            )
        )
        self.inputs = {self.log.name}
        # A private /dev/full (when this machine lets us make one): output flags are fuzzed with a device,
        # and a command that goes wrong harms only this node, never the machine's /dev.
        self.device: Path | None = self.root / "full"
        try:
            os.mknod(self.device, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
            self.inputs.add(self.device.name)
        except OSError:
            self.device = None

    def outputs(self) -> st.SearchStrategy[str]:
        return st.sampled_from(
            [
                str(self.root / "out.csv"),
                str(self.root / "out.jsonl"),
                str(self.root / "out.html"),
                str(self.root / "out.png"),
                str(self.root / "missing" / "out.csv"),
                str(self.root),  # a folder
                str(self.log),  # the input itself
                str(self.device or self.root / "no-device"),
                "/proc/version",  # not writable
                "",
            ]
        )

    def inputs_paths(self) -> st.SearchStrategy[str]:
        return st.sampled_from(
            [str(self.log), str(self.root / "nope.csv"), str(self.root), "/dev/null", "/proc/self/status", ""]
        )

    def files(self) -> set[str]:
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*")}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def no_fixed_port(text: str) -> bool:
    """True unless ``text`` is an address that would bind a fixed port (port 0 picks a free one)."""
    from vramscope.exporters import PrometheusAddressError, parse_address

    try:
        _, port = parse_address(text)
    except PrometheusAddressError:
        return True
    return port == 0


def value_for(action: argparse.Action, ws: Workspace) -> st.SearchStrategy[list[str]]:
    flag = st.sampled_from(action.option_strings)
    if action.nargs == 0:
        return flag.map(lambda f: [f])
    if action.dest in OUTPUT_DESTS:
        values: st.SearchStrategy[str] = st.one_of(ws.outputs(), SAFE_TEXT.map(lambda t: str(ws.root / (t or "x"))))
    elif action.dest in {"config", "model_dir", "logs"}:
        values = st.one_of(ws.inputs_paths(), SAFE_TEXT)
    elif action.dest == "prometheus":
        values = st.one_of(st.sampled_from(["0", "127.0.0.1:0", "[::1]:0", ":0", "0.0.0.0:x"]), VALUES).filter(
            no_fixed_port
        )
    elif action.dest == "push":
        values = st.one_of(st.just("http://127.0.0.1:1"), VALUES.filter(lambda t: "://" not in t))
    elif action.choices is not None:
        values = st.one_of(st.sampled_from([str(c) for c in action.choices]), VALUES)
    elif action.dest == "count":
        values = st.sampled_from(["1", "0", "-1", "abc", "", "1.5", "nan"])  # never a long watch
    else:
        values = VALUES
    return st.tuples(flag, values).map(lambda fv: [fv[0], fv[1]] if not fv[1].startswith("-") else [f"{fv[0]}={fv[1]}"])


def argv_for(command: str, ws: Workspace) -> st.SearchStrategy[list[str]]:
    """A subcommand's flags, a random few of them with random values, plus sometimes an unknown one."""
    per_flag = [value_for(a, ws) for a in flags(command)]
    chosen = st.lists(st.sampled_from(range(len(per_flag))), max_size=5).flatmap(
        lambda idx: st.tuples(*(per_flag[i] for i in idx)) if idx else st.just(())
    ) if per_flag else st.just(())
    unknown = st.lists(st.sampled_from(["--bogus", "--interval-s", "-x", "extra"]), max_size=1)
    return st.tuples(chosen, unknown).map(lambda cu: [tok for pair in cu[0] for tok in pair] + cu[1])


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: fake_nvml.two_healthy_gpus(pid=os.getpid()))
    yield


def check(argv: list[str], ws: Workspace, capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    code = main(argv)
    _, err = capsys.readouterr()
    event(f"exit {code}")  # shown by --hypothesis-show-statistics: the fuzz reaches past argparse too
    assert code in DOCUMENTED_EXIT_CODES, (argv, code, err)
    assert "Traceback" not in err and CRASH_MARK not in err, (argv, err)
    if ws.device is not None:
        assert stat.S_ISCHR(ws.device.stat().st_mode), (argv, "the device was replaced by a file")
    left = ws.files() - ws.inputs
    assert not [f for f in left if ".tmp" in f or f.startswith(".")], (argv, left)  # no temporary file left
    if code != 0:
        errors = [line for line in err.splitlines() if line.startswith("vramscope: error:")]
        assert len(errors) == 1 and err.rstrip().endswith(errors[0]), (argv, err)
        assert not left, (argv, left)  # a failed command writes nothing
    return code


FUZZ = settings(
    max_examples=int(os.environ.get("VRAMSCOPE_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def needs(command: str) -> None:
    if command not in SUBPARSERS:
        pytest.skip(f"vramscope {command} is not in this build")


@FUZZ
@given(data=st.data())
def test_fuzz_run(data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    needs("run")
    ws = Workspace()
    try:
        argv = data.draw(argv_for("run", ws))
        tail = data.draw(st.sampled_from([["--", "true"], ["--", "true"], ["--"], [], ["--", "no-such-program-xyz"]]))
        code = check(["run", *argv, *tail], ws, capsys)
        if code == 0:  # a run that worked wrote a whole log where one was asked for
            assert tail == ["--", "true"]
    finally:
        ws.close()


@FUZZ
@given(data=st.data())
def test_fuzz_watch(data: st.DataObject, two_gpus: None, capsys: pytest.CaptureFixture[str]) -> None:
    needs("watch")
    ws = Workspace()
    try:
        argv = data.draw(argv_for("watch", ws))
        check(["watch", *argv, "--count", "1"], ws, capsys)  # one reading: a fuzzed watch must end
    finally:
        ws.close()


@FUZZ
@given(data=st.data())
def test_fuzz_report(data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    needs("report")
    ws = Workspace()
    try:
        good = st.just(str(ws.log))
        logs = data.draw(st.lists(st.one_of(good, good, ws.inputs_paths()), min_size=0, max_size=2))
        argv = data.draw(argv_for("report", ws))
        check(["report", *logs, *argv], ws, capsys)
    finally:
        ws.close()


@FUZZ
@given(data=st.data())
def test_fuzz_plan(data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    needs("plan")
    ws = Workspace()
    try:
        # Usually a valid base, so that the fuzzed flags reach the planner, not only argparse.
        base = data.draw(st.sampled_from([["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "256"], []]))
        argv = data.draw(argv_for("plan", ws))
        check(["plan", *base, *argv], ws, capsys)
    finally:
        ws.close()


@FUZZ
@given(data=st.data())
def test_fuzz_tune(data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    needs("tune")
    ws = Workspace()
    try:
        argv = data.draw(argv_for("tune", ws))
        code = check(["tune", "--model-dir", str(ws.root / "no-model"), *argv], ws, capsys)
        assert code != 0  # there is no model (nor a GPU): it must say so, not try
    finally:
        ws.close()


def test_every_subcommand_is_fuzzed() -> None:
    """A new subcommand must get a fuzz test here: this fails until it does."""
    fuzzed = {name.removeprefix("test_fuzz_") for name in globals() if name.startswith("test_fuzz_")}
    assert set(SUBPARSERS) <= fuzzed, set(SUBPARSERS) - fuzzed


def test_a_path_that_is_not_utf8_is_reported_not_crashed(tmp_path: Path) -> None:
    """Real argv bytes that are not UTF-8 (a Latin-1 file name) reach Python as lone surrogates."""
    bad = os.fsencode(str(tmp_path / "missing")) + b"/m\xe9moire.csv"
    result = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"vramscope", b"run", b"--log", bad, b"--", b"true"],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    err = result.stderr.decode("utf-8", errors="replace")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "does not exist" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--interval", "1e10", "--", "true"], "interval must be at most 86400 s"),
        (["run", "--interval", "1e308", "--", "true"], "interval must be at most 86400 s"),
        (["run", "--max-log-mb", "0", "--log", "x.csv", "--", "true"], "--max-log-mb must be between"),
        (["run", "--max-log-mb", "5", "--", "true"], "--max-log-mb limits the log's files; add --log FILE"),
        (["watch", "--max-log-mb", "5"], "apply to the --log file; add --log FILE"),
        (["watch", "--fsync"], "apply to the --log file; add --log FILE"),
    ],
)
def test_found_by_fuzzing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cases the fuzzer found (a huge interval crashed the sampler thread with OverflowError) or that the
    rotation flags added; kept as plain regression tests."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())


def test_report_with_an_empty_log_name_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by test_fuzz_report: ``report "" --html existing`` crashed in the output check (stat of "")."""
    existing = tmp_path / "old.html"
    existing.write_text("keep me")
    assert main(["report", "", "--html", str(existing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vramscope: error: ") and len(err.strip().splitlines()) == 1, err
    assert CRASH_MARK not in err
    assert existing.read_text() == "keep me"


def device_node(path: Path) -> Path:
    """A private copy of /dev/full (a character device) at ``path``, so that a test that goes wrong can only
    harm its own node, never the machine's /dev."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here ({exc})")
    return path


@pytest.mark.parametrize("flag", ["--html", "--png"])
def test_report_never_replaces_a_device_with_its_output(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by test_fuzz_report with /dev/full as --html: the atomic write (temporary file, then rename)
    replaced the device node itself with a regular file, as root for the whole machine."""
    node = device_node(tmp_path / "full")
    log = Workspace().log
    try:
        code = main(["report", str(log), flag, str(node)])
    finally:
        shutil.rmtree(log.parent, ignore_errors=True)
    err = capsys.readouterr().err
    assert stat.S_ISCHR(node.stat().st_mode)  # still the device
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1, err


@FUZZ
@given(data=st.data())
def test_fuzz_completion(data: st.DataObject, capsys: pytest.CaptureFixture[str]) -> None:
    needs("completion")
    ws = Workspace()
    try:
        shell = data.draw(st.sampled_from(["bash", "zsh", "fish", "", "powershell", "bash\x00"]))
        argv = data.draw(argv_for("completion", ws))
        check(["completion", *([shell] if shell else []), *argv], ws, capsys)
    finally:
        ws.close()
