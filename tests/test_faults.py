"""Fault injection: the monitor never hurts the training, degrades with one clear warning, and keeps
every row written before the fault.

Each test runs real code against a real fault: real child processes and signals, real files deleted
under the writer, a real full disk (a small tmpfs mounted for the test; skipped where mounting is not
allowed), real imports blocked in a child. NVML alone is faked, at its module boundary
(``tests/fake_nvml.py``), because this machine has no GPU to lose.

"Rows before the fault" is measured, not assumed: the log's bytes are read at the moment the fault is
injected, and the final log must start with exactly those bytes.

Set ``VRAMSCOPE_RELIABILITY_JSON=path`` to collect what each test observed (docs/reliability.md's table
is built from it).
"""

from __future__ import annotations

import errno
import importlib.util
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.reader import read_log
from vramscope.logs.sinks import CsvSink
from vramscope.run.runner import run_monitored
from vramscope.types import Sample

GIB = fake_nvml.GIB
PYTHON = sys.executable
ROOT = Path(__file__).resolve().parent.parent

# What each fault test observed, for docs/reliability.md.
RESULTS: list[dict[str, Any]] = []


def record(fault: str, outcome: str, rows_before: int, rows_kept: int, **more: Any) -> None:
    assert rows_kept == rows_before, f"{fault}: {rows_before - rows_kept} rows written before the fault were lost"
    RESULTS.append(
        {
            "fault": fault,
            "outcome": outcome,
            "rows_before": rows_before,
            "rows_kept": rows_kept,
            "rows_lost": rows_before - rows_kept,
            **more,
        }
    )


@pytest.fixture(scope="module", autouse=True)
def _write_results() -> Iterator[None]:
    yield
    out = os.environ.get("VRAMSCOPE_RELIABILITY_JSON")
    if out and RESULTS:
        previous = json.loads(Path(out).read_text()) if Path(out).is_file() else []
        Path(out).write_text(json.dumps(previous + RESULTS, indent=1))


# -- helpers ------------------------------------------------------------------------------------------

# A stand-in training script: steps until told to stop (a file appears), so that each test sets the
# timeline itself instead of racing a fixed sleep. Writes its progress; exits 0 when stopped.
TRAIN = textwrap.dedent(
    """
    import pathlib, sys, time
    stop, progress = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    held, step, deadline = [], 0, time.monotonic() + 60
    while not stop.exists() and time.monotonic() < deadline:
        held.append(bytearray(200_000)); held = held[-10:]  # memory that moves, like activations
        step += 1
        progress.write_text(str(step))
        time.sleep(0.02)
    progress.write_text(f"done {step}")
    sys.exit(0 if stop.exists() else 3)
    """
)


class Training:
    """Paths of one stand-in training run."""

    def __init__(self, root: Path) -> None:
        self.script = root / "train.py"
        self.script.write_text(TRAIN)
        self.stop = root / "stop"
        self.progress = root / "progress"
        self._steps = 0

    @property
    def argv(self) -> list[str]:
        return [PYTHON, str(self.script), str(self.stop), str(self.progress)]

    def steps(self) -> int:
        try:
            words = self.progress.read_text().split()
            self._steps = int(words[-1])
        except (OSError, IndexError, ValueError):  # not written yet, or caught between truncate and write
            pass
        return self._steps

    def finished(self) -> bool:
        return self.progress.exists() and self.progress.read_text().startswith("done")


def csv_rows(path: Path) -> list[bytes]:
    """The data rows of a vramscope CSV, asserting that every line is a whole row (none torn)."""
    content = path.read_bytes()
    lines = content.split(b"\r\n")
    assert lines[-1] == b"", "the log does not end with a whole row"
    width = lines[0].count(b",")
    torn = [line for line in lines[1:-1] if line.count(b",") != width]
    assert not torn, f"torn rows in the log: {torn[:3]}"
    return lines[1:-1]


def kept_rows(before: bytes, path: Path) -> tuple[int, int]:
    """(rows in ``before``, how many of them the log at ``path`` still holds, in order, at its start)."""
    old = before.split(b"\r\n")[1:-1]  # whole rows only: the last piece has no line end yet
    new = path.read_bytes().split(b"\r\n")[1:]
    kept = 0
    while kept < len(old) and kept < len(new) and old[kept] == new[kept]:
        kept += 1
    return len(old), kept


def wait_for(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def row_count(path: Path) -> int:
    try:
        return max(path.read_bytes().count(b"\r\n") - 1, 0)
    except FileNotFoundError:
        return 0


def warnings_about(caplog: pytest.LogCaptureFixture, *words: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and all(w in r.getMessage() for w in words)
    ]


def run_in_background(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target()), daemon=True)
    thread.start()
    return thread, out


# -- NVML faults on one GPU mid-run ---------------------------------------------------------------------

NVML_FUNCTIONS = (
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetComputeRunningProcesses",
)
NVML_FAULTS = {
    "GPU lost": (dict.fromkeys(NVML_FUNCTIONS, fake_nvml.NVML_ERROR_GPU_IS_LOST), "GPU is lost"),
    "NotSupported": (
        dict.fromkeys(
            (
                "nvmlDeviceGetMemoryInfo",
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetUtilizationRates",
                "nvmlDeviceGetComputeRunningProcesses",
            ),
            fake_nvml.NVML_ERROR_NOT_SUPPORTED,
        ),
        "not supported",
    ),
    "Unknown": (dict.fromkeys(NVML_FUNCTIONS, fake_nvml.NVML_ERROR_UNKNOWN), "NVML error 999"),
}


@pytest.mark.parametrize("fault", list(NVML_FAULTS))
def test_nvml_error_on_one_gpu_mid_run(fault: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    errors, cause = NVML_FAULTS[fault]
    train = Training(tmp_path)
    log = tmp_path / "m.csv"
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=20 * GIB), fake_nvml.FakeGpu(used=30 * GIB)])
    before: dict[str, Any] = {}

    def inject(child: subprocess.Popen[bytes]) -> None:
        fake.gpus[0].processes[child.pid] = 3 * GIB

        def later() -> None:
            wait_for(lambda: row_count(log) >= 6 and train.steps() >= 3, what="three samples and steps")
            before["bytes"] = log.read_bytes()
            before["steps"] = train.steps()
            fake.gpus[1].errors.update(errors)  # from now on every read of GPU 1 fails
            wait_for(lambda: row_count(log) >= before["bytes"].count(b"\r\n") - 1 + 8, what="samples after")
            wait_for(lambda: train.steps() > before["steps"] + 3, what="steps after")
            train.stop.touch()

        threading.Thread(target=later, daemon=True).start()

    with caplog.at_level(logging.WARNING):
        result = run_monitored(
            train.argv, log_path=str(log), interval=0.05, nvml=NvmlBackend(nvml=fake), on_start=inject
        )

    assert result.exit_code == 0 and train.finished()  # the training ended as it would have
    assert train.steps() > before["steps"]  # ... and went on after the fault
    content = log.read_bytes()
    assert content.startswith(before["bytes"])  # every row written before the fault is kept, unchanged
    rows = csv_rows(log)
    assert len(rows) == 2 * result.peaks.samples  # no sample lost: both GPUs' rows every time
    table = read_log(log)
    used, gpus = table.ints("device_used_bytes"), table.ints("gpu")
    rows_before, rows_kept = kept_rows(before["bytes"], log)
    # One sample may be in flight while the fault is set (read before it, written after the snapshot): its GPU 1
    # row still holds a good reading, so the check starts one sample (two rows) later. Under load that sample
    # made this test fail now and then.
    after = range(rows_before + 2, len(table))
    assert all(used[i] == 20 * GIB for i in after if gpus[i] == 0)  # the healthy GPU keeps its readings
    assert all(used[i] is None for i in after if gpus[i] == 1)  # the bad one is unknown, never 0
    assert max(v or 0 for v in table.ints("process_bytes")) == 3 * GIB  # the child's own GPU memory
    gpu1 = warnings_about(caplog, "GPU 1", cause)
    assert len(gpu1) == 1, gpu1  # one clear line, not one per sample
    assert not warnings_about(caplog, "GPU 0")
    record(
        f"NVML: {fault} on GPU 1 of 2, mid-run",
        f"exit 0; GPU 1 cells empty; 1 warning: {gpu1[0]!r}",
        rows_before,
        rows_kept,
        test=f"test_nvml_error_on_one_gpu_mid_run[{fault}]",
    )


# -- NVML or torch missing: import blocked in a real child process ---------------------------------------

# Runs `vramscope run` in a Python where the named modules cannot be imported (None in sys.modules is
# how the import system spells "not installed": ModuleNotFoundError, find_spec() is None).
BLOCKED_RUN = textwrap.dedent(
    """
    import sys
    for name in sys.argv[1].split(","):
        sys.modules[name] = None
    from vramscope.cli import main
    raise SystemExit(main(sys.argv[2:]))
    """
)


def test_nvml_missing_gives_host_memory_and_one_line_why(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    child = "import time\nfor _ in range(10): time.sleep(0.03)\nprint('trained')"
    result = subprocess.run(
        [
            PYTHON,
            "-c",
            BLOCKED_RUN,
            "pynvml",
            "run",
            "--log",
            str(log),
            "--interval",
            "0.05",
            "--",
            PYTHON,
            "-c",
            child,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    assert "Traceback" not in result.stderr
    why = [line for line in result.stderr.splitlines() if "no NVIDIA GPU" in line]
    assert why == ["  no NVIDIA GPU seen (nvidia-ml-py is not installed); host memory only"]
    rows = csv_rows(log)
    table = read_log(log)
    assert len(rows) == len(table) >= 3
    assert all(g is None for g in table.ints("gpu"))
    # The child's RSS while it ran (the samples at its exit find it gone or a zombie: unknown).
    assert len([v for v in table.ints("host_rss_bytes") if v]) >= 3
    record(
        "NVML missing (nvidia-ml-py not importable)",
        f"exit 0; host memory only; summary says {why[0].strip()!r}",
        0,
        0,
        test="test_nvml_missing_gives_host_memory_and_one_line_why",
    )


TORCH_LOOP = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # torch is not installed here
    import vramscope
    with vramscope.MemoryMonitor(log=sys.argv[1], every_n_steps=2, warn=False) as mon:
        for step in range(1, 21):
            block = bytearray(100_000 * step)
            mon.step(step)
    print("trained", mon.rows_logged)
    """
)


def test_torch_missing_under_run_and_in_the_training_loop(tmp_path: Path) -> None:
    pytest.importorskip("vramscope.integrations.loop")
    outer, inner = tmp_path / "run.csv", tmp_path / "loop.csv"
    script = tmp_path / "train.py"
    script.write_text(TORCH_LOOP)
    result = subprocess.run(
        [
            PYTHON,
            "-c",
            BLOCKED_RUN,
            "torch",
            "run",
            "--log",
            str(outer),
            "--interval",
            "0.05",
            "--",
            PYTHON,
            str(script),
            str(inner),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith("trained")
    assert len(csv_rows(outer)) >= 1
    loop = read_log(inner)
    steps = [s for s in loop.ints("step") if s is not None]
    assert steps == list(range(2, 21, 2))  # every logged step, host memory only
    assert all(v is None for v in loop.ints("allocated_bytes"))
    assert all(loop.ints("host_rss_bytes"))
    record(
        "torch missing (blocked in the child and in vramscope)",
        "exit 0; loop logs host RSS at every 2nd step",
        0,
        0,
        test="test_torch_missing_under_run_and_in_the_training_loop",
    )


# -- the log's disk fills; the log is deleted ------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 32 KiB tmpfs: writes past it fail with ENOSPC from the kernel."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32k", "vramscope-test", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path) -> Path:
    """Take every free block of the file system at ``folder``; returns the filler to delete later."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_disk_full_mid_run_keeps_earlier_rows_and_resumes_whole(
    small_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = Training(tmp_path)
    log = small_disk / "m.csv"
    fake = fake_nvml.two_healthy_gpus()
    seen: dict[str, Any] = {}

    def inject(child: subprocess.Popen[bytes]) -> None:
        def later() -> None:
            wait_for(lambda: row_count(log) >= 6 and train.steps() >= 3, what="three samples and steps")
            seen["bytes"] = log.read_bytes()
            filler = fill(small_disk)
            wait_for(lambda: bool(warnings_about(caplog, "No space left")), what="the ENOSPC warning")
            seen["steps_at_fault"] = train.steps()
            full_rows = row_count(log)
            time.sleep(0.3)  # samples keep failing while the disk is full
            seen["rows_while_full"] = row_count(log) - full_rows
            filler.unlink()
            wait_for(lambda: row_count(log) >= full_rows + 6, what="rows after space came back")
            wait_for(lambda: train.steps() > seen["steps_at_fault"] + 3, what="steps after")
            train.stop.touch()

        threading.Thread(target=later, daemon=True).start()

    with caplog.at_level(logging.WARNING):
        result = run_monitored(
            train.argv, log_path=str(log), interval=0.05, nvml=NvmlBackend(nvml=fake), on_start=inject
        )

    assert result.exit_code == 0 and train.finished()
    assert train.steps() > seen["steps_at_fault"]
    assert log.read_bytes().startswith(seen["bytes"])  # nothing written before the disk filled is lost
    rows = csv_rows(log)  # and no torn row where a write was cut by the full disk
    assert len(rows) % 2 == 0  # whole samples only: a sample's two rows land together or not at all
    assert seen["rows_while_full"] == 0
    assert len(rows) < 2 * result.peaks.samples  # the samples taken while full are missing, and only those
    full = warnings_about(caplog, "No space left")
    assert len(full) == 1, full
    rows_before, rows_kept = kept_rows(seen["bytes"], log)
    record(
        "disk full (real 32 KiB tmpfs) mid-run, then space freed",
        f"exit 0; {2 * result.peaks.samples - len(rows)} rows of samples taken while full not written; "
        f"1 warning: {full[0]!r}; no torn row; logging resumed",
        rows_before,
        rows_kept,
        test="test_disk_full_mid_run_keeps_earlier_rows_and_resumes_whole",
    )


def test_log_deleted_mid_run_is_recreated_with_every_row(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    train = Training(tmp_path)
    log = tmp_path / "m.csv"
    seen: dict[str, Any] = {}

    def inject(child: subprocess.Popen[bytes]) -> None:
        def later() -> None:
            wait_for(lambda: row_count(log) >= 5 and train.steps() >= 3, what="five samples and steps")
            seen["bytes"] = log.read_bytes()
            log.unlink()  # rm m.csv while the run writes it
            wait_for(lambda: row_count(log) > seen["bytes"].count(b"\r\n") + 3, what="the log to come back")
            train.stop.touch()

        threading.Thread(target=later, daemon=True).start()

    with caplog.at_level(logging.WARNING):
        result = run_monitored(
            train.argv, log_path=str(log), interval=0.05, nvml=NvmlBackend(nvml=fake_nvml.no_driver()), on_start=inject
        )

    assert result.exit_code == 0 and train.finished()
    assert log.read_bytes().startswith(seen["bytes"])
    rows = csv_rows(log)
    assert len(rows) == result.peaks.samples  # every sample, before and after the deletion
    said = warnings_about(caplog, "was deleted")
    assert len(said) == 1, said
    rows_before, rows_kept = kept_rows(seen["bytes"], log)
    record(
        "log file deleted (rm) mid-run",
        f"exit 0; log re-created with all rows; 1 warning: {said[0]!r}",
        rows_before,
        rows_kept,
        test="test_log_deleted_mid_run_is_recreated_with_every_row",
    )


def test_log_on_a_full_disk_from_the_start_is_refused_before_the_command(tmp_path: Path) -> None:
    """A full device (a private copy of /dev/full: every write fails with ENOSPC). Nothing starts, nothing
    half-written is left, and the device is not mistaken for a half-written log and removed."""
    full = tmp_path / "full"
    try:
        os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here ({exc})")
    marker = tmp_path / "ran"
    result = subprocess.run(
        [PYTHON, "-m", "vramscope", "run", "--log", str(full), "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"vramscope: error: cannot write log {full}: No space left on device; free some space or choose another path"
    )
    assert not marker.exists()
    assert stat.S_ISCHR(full.stat().st_mode)
    record(
        "log on a full device from the start (a private /dev/full node)",
        "exit 2 before the command starts; one line",
        0,
        0,
        test="test_log_on_a_full_disk_from_the_start_is_refused_before_the_command",
    )


# -- the training process killed with -9; vramscope itself killed with -9 ------------------------------


def test_training_killed_with_sigkill_mid_run(tmp_path: Path) -> None:
    train = Training(tmp_path)
    log = tmp_path / "m.csv"
    seen: dict[str, Any] = {}

    def inject(child: subprocess.Popen[bytes]) -> None:
        def later() -> None:
            wait_for(lambda: row_count(log) >= 5 and train.steps() >= 3, what="five samples and steps")
            seen["bytes"] = log.read_bytes()
            os.kill(child.pid, signal.SIGKILL)

        threading.Thread(target=later, daemon=True).start()

    result = run_monitored(
        train.argv, log_path=str(log), interval=0.05, nvml=NvmlBackend(nvml=fake_nvml.no_driver()), on_start=inject
    )

    assert result.exit_code == 128 + signal.SIGKILL
    assert log.read_bytes().startswith(seen["bytes"])
    rows = csv_rows(log)
    assert len(rows) == result.peaks.samples
    assert len(rows) > seen["bytes"].count(b"\r\n") - 1  # the sample at the end is recorded too
    rows_before, rows_kept = kept_rows(seen["bytes"], log)
    record(
        "training process killed with -9",
        "exit 137 (128+9), as a shell reports it; log complete",
        rows_before,
        rows_kept,
        test="test_training_killed_with_sigkill_mid_run",
    )


def test_vramscope_killed_with_sigkill_training_goes_on_and_rows_are_whole(tmp_path: Path) -> None:
    train = Training(tmp_path)
    log = tmp_path / "m.csv"
    monitor = subprocess.Popen(
        [PYTHON, "-m", "vramscope", "run", "--log", str(log), "--interval", "0.05", "--quiet", "--", *train.argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: row_count(log) >= 10 and train.steps() >= 3, what="ten samples and steps")
        monitor.kill()
        monitor.wait(timeout=10)
        rows_at_kill = row_count(log)
        steps_at_kill = train.steps()
        wait_for(lambda: train.steps() > steps_at_kill + 5, what="training to go on")  # it does not die with us
    finally:
        train.stop.touch()
    wait_for(train.finished, what="the training to finish")
    rows = csv_rows(log)  # every line whole: what was written before the kill is all there
    assert len(rows) == rows_at_kill >= 10
    assert len(read_log(log)) == len(rows)
    record(
        "vramscope run itself killed with -9",
        "training went on and finished; every row whole",
        rows_at_kill,
        len(rows),
        test="test_vramscope_killed_with_sigkill_training_goes_on_and_rows_are_whole",
    )


# A writer that reports each sample only after the sampler has handed it to every sink.
WRITER = textwrap.dedent(
    """
    import sys
    from vramscope.backends.host import HostBackend
    from vramscope.sampling.sampler import Collector, Sampler
    from vramscope.logs.sinks import log_sink
    sink = log_sink(sys.argv[1])
    def done(sample):
        print(sampler.samples_taken, flush=True)
    sampler = Sampler(Collector(host=HostBackend()), [sink], interval=0.05, on_sample=done)
    sampler.start()
    import time; time.sleep(60)
    """
)


@pytest.mark.parametrize("name", ["m.csv", "m.jsonl"])
def test_every_reported_sample_is_on_disk_when_the_writer_is_killed(name: str, tmp_path: Path) -> None:
    log = tmp_path / name
    writer = subprocess.Popen([PYTHON, "-c", WRITER, str(log)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    reported = 0
    try:
        while reported < 15:
            reported = int(writer.stdout.readline())
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=10)
    # Lines the writer printed before it died but we had not read yet: the last one is the true count.
    reported = max([reported, *(int(line) for line in writer.stdout.read().split())])
    content = log.read_bytes()
    assert content.endswith(b"\n")  # no half row at the end
    rows = len(read_log(log))
    assert rows >= reported  # every sample reported written is on disk; at most one more got there
    assert rows <= reported + 1
    record(
        f"writer process killed with -9 ({Path(name).suffix} log)",
        f"{rows} rows on disk for {reported} samples reported written",
        reported,
        min(rows, reported),
        test=f"test_every_reported_sample_is_on_disk_when_the_writer_is_killed[{name}]",
    )


# -- SIGTERM and SIGINT to `vramscope run` ---------------------------------------------------------------

GRACEFUL = textwrap.dedent(
    """
    import pathlib, signal, sys, time
    progress, how = pathlib.Path(sys.argv[1]), sys.argv[2]
    got = []
    if how == "ignore":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        last = 40
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        last = 400
    print("ready", flush=True)
    step = 0
    while step < last:
        step += 1
        progress.write_text(str(step))
        time.sleep(0.02)
        if got and last == 400:
            last = step + 10  # finish ten more steps (save a checkpoint, say), then leave, as trainers do
    progress.write_text(f"done {step}")
    """
)


@pytest.mark.parametrize(
    ("sig", "how"),
    [(signal.SIGTERM, "graceful"), (signal.SIGINT, "ignore")],
    ids=["SIGTERM-child-finishes-its-steps", "SIGINT-child-ignores-it"],
)
def test_signals_to_vramscope_run_let_the_training_end_as_it_would(
    sig: signal.Signals, how: str, tmp_path: Path
) -> None:
    log, progress = tmp_path / "m.csv", tmp_path / "progress"
    script = tmp_path / "train.py"
    script.write_text(GRACEFUL)
    proc = subprocess.Popen(
        [
            PYTHON,
            "-m",
            "vramscope",
            "run",
            "--log",
            str(log),
            "--interval",
            "0.05",
            "--",
            PYTHON,
            str(script),
            str(progress),
            how,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    wait_for(lambda: row_count(log) >= 4, what="four samples")
    before = log.read_bytes()
    proc.send_signal(sig)
    signalled_at = time.time()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # the child's own exit code: it ended as it would have
    assert progress.read_text().startswith("done")
    steps = int(progress.read_text().split()[1])
    assert 10 < steps < 400 if how == "graceful" else steps == 40
    assert log.read_bytes().startswith(before)
    rows = csv_rows(log)
    table = read_log(log)
    from datetime import datetime

    times = [datetime.fromisoformat(t).timestamp() for t in table.strings("time") if t]
    assert any(t > signalled_at for t in times)  # sampling went on after the signal, to the end
    assert "exited with 0" in err and f"samples: {len(rows)}" in err
    rows_before, rows_kept = kept_rows(before, log)
    record(
        f"{sig.name} to vramscope run (child {'finishes its steps' if how == 'graceful' else 'ignores it'})",
        "forwarded; exit 0 (the child's); sampling went on until the child ended; summary printed",
        rows_before,
        rows_kept,
        test=f"test_signals_to_vramscope_run_let_the_training_end_as_it_would[{sig.name}]",
    )


# -- faults inside a training loop (MemoryMonitor) -------------------------------------------------------


class FailingSink:
    """A sink whose writes start failing at the ``fail_from``-th sample (a remote store going away).

    At its first failure it keeps a copy of ``log`` (the monitor's CSV), to count the rows before the fault.
    """

    def __init__(self, fail_from: int, log: Path) -> None:
        self.fail_from = fail_from
        self.log = log
        self.calls = 0
        self.log_at_fault = b""

    def write(self, sample: Sample) -> None:
        self.calls += 1
        if self.calls >= self.fail_from:
            if self.calls == self.fail_from:
                self.log_at_fault = self.log.read_bytes()
            raise ConnectionResetError(104, "Connection reset by peer")

    def close(self) -> None:
        raise OSError(5, "Input/output error")  # closing fails too


def test_sink_failing_mid_training_does_not_reach_the_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loop = pytest.importorskip("vramscope.integrations.loop")
    log = tmp_path / "m.csv"
    bad = FailingSink(fail_from=10, log=log)
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    monitor = loop.MemoryMonitor(log=str(log), sinks=[bad], nvml=fake, warn=False)
    with caplog.at_level(logging.WARNING), monitor as mon:
        for step in range(1, 51):
            mon.step(step)
    assert bad.calls >= 50
    table = read_log(log)
    assert [s for s in table.ints("step") if s is not None] == [s for s in range(1, 51) for _ in (0, 1)]
    said = warnings_about(caplog, "Connection reset")
    assert len(said) == 1, said
    rows_before, rows_kept = kept_rows(bad.log_at_fault, log)
    assert rows_before > 0 and rows_kept == rows_before
    record(
        "a sink failing mid-training (MemoryMonitor)",
        f"all 50 steps ran; CSV log complete; 1 warning: {said[0]!r}",
        rows_before,
        rows_kept,
        test="test_sink_failing_mid_training_does_not_reach_the_loop",
    )


def test_gpu_lost_and_log_deleted_mid_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loop = pytest.importorskip("vramscope.integrations.loop")
    log = tmp_path / "m.csv"
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    with caplog.at_level(logging.WARNING), loop.MemoryMonitor(log=str(log), nvml=fake, warn=False) as mon:
        for step in range(1, 41):
            if step == 15:
                before = log.read_bytes()
                fake.gpus[1].errors.update(dict.fromkeys(NVML_FUNCTIONS, fake_nvml.NVML_ERROR_GPU_IS_LOST))
                log.unlink()
            mon.step(step)
    assert log.read_bytes().startswith(before)
    table = read_log(log)
    steps, gpus, used = table.ints("step"), table.ints("gpu"), table.ints("device_used_bytes")
    assert sorted({s for s in steps if s is not None}) == list(range(1, 41))
    assert all(used[i] is None for i in range(len(table)) if gpus[i] == 1 and (steps[i] or 0) >= 15)
    assert len(warnings_about(caplog, "GPU 1", "GPU is lost")) == 1
    assert len(warnings_about(caplog, "was deleted")) == 1
    rows_before, rows_kept = kept_rows(before, log)
    record(
        "GPU lost + log deleted mid-training (MemoryMonitor)",
        "all 40 steps ran; log re-created; one warning each",
        rows_before,
        rows_kept,
        test="test_gpu_lost_and_log_deleted_mid_training",
    )


# -- rotation (--max-log-mb): every row kept, a header in every part, read back as one log --------------


def fake_samples(n: int, gpus: int = 2) -> list[Sample]:
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=(i + 1) * GIB) for i in range(gpus)])
    clock = iter(range(10**9))
    from vramscope.backends.host import HostBackend
    from vramscope.sampling.sampler import Collector

    collector = Collector(nvml=NvmlBackend(nvml=fake), host=HostBackend(), clock=lambda: 1.7e9 + next(clock))
    return [collector.collect(step=i) for i in range(n)]


@pytest.mark.parametrize("name", ["m.csv", "m.jsonl"])
def test_rotation_keeps_every_row_and_reads_back_as_one_log(name: str, tmp_path: Path) -> None:
    from vramscope.logs.sinks import log_parts, log_sink

    samples = fake_samples(120)
    plain, rotated = tmp_path / "plain" / name, tmp_path / "rot" / name
    plain.parent.mkdir()
    rotated.parent.mkdir()
    one, many = log_sink(plain), log_sink(rotated, max_bytes=4096)
    for sample in samples:
        one.write(sample)
        many.write(sample)
    one.close()
    many.close()
    parts = log_parts(rotated)
    assert parts == [str(rotated)] + [f"{rotated}.{i}" for i in range(1, len(parts))]  # m.csv, m.csv.1, ...
    assert len(parts) >= 5
    first_line = plain.read_bytes().split(b"\n", 1)[0]
    for part in parts:
        data = Path(part).read_bytes()
        assert len(data) <= 4096
        if name.endswith(".csv"):
            assert data.split(b"\n", 1)[0] == first_line  # the header in every part
        assert data.endswith(b"\n")  # whole rows only; a sample's two rows never split across parts
        assert data.count(b"\n") % 2 == (1 if name.endswith(".csv") else 0)
    whole, joined = read_log(plain), read_log(rotated)
    assert joined.raw == whole.raw  # the set reads back exactly as the single file
    assert joined.ints("step") == [i for i in range(120) for _ in (0, 1)]


def test_a_new_log_removes_the_parts_of_an_old_one_but_not_foreign_files(tmp_path: Path) -> None:
    log = tmp_path / "m.csv"
    old = CsvSink(log, max_bytes=2048)
    for sample in fake_samples(60):
        old.write(sample)
    old.close()
    assert (tmp_path / "m.csv.3").exists()
    new = CsvSink(log)  # a second run to the same path, without rotation
    new.write(fake_samples(1)[0])
    new.close()
    assert not (tmp_path / "m.csv.1").exists()  # the old run's parts are not read as this run's
    assert len(read_log(log)) == 2
    (tmp_path / "m.csv.1").write_text("my notes\n")  # someone's own file that happens to have the name
    again = CsvSink(log)
    again.close()
    assert (tmp_path / "m.csv.1").read_text() == "my notes\n"
    assert len(read_log(log)) == 0


def test_run_and_watch_rotate_with_max_log_mb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vramscope.backends import nvml as nvml_backend
    from vramscope.cli import main

    log = tmp_path / "run.csv"
    child = "import time\nfor _ in range(30): time.sleep(0.03)"
    done = subprocess.run(
        [
            PYTHON,
            "-m",
            "vramscope",
            "run",
            "--log",
            str(log),
            "--max-log-mb",
            "0.001",
            "--interval",
            "0.05",
            "--",
            PYTHON,
            "-c",
            child,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    samples = int(done.stderr.rsplit("samples: ", 1)[1].split(",")[0])
    assert (tmp_path / "run.csv.1").exists()
    assert len(read_log(log)) == samples  # one row per sample (no GPU here), across every part
    if importlib.util.find_spec("vramscope.cli.report"):  # `vramscope report` takes the set by its first file
        capsys.readouterr()
        assert main(["report", str(log), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["log"]["rows"] == samples

    monkeypatch.setattr(nvml_backend, "_load_pynvml", fake_nvml.two_healthy_gpus)
    watched = tmp_path / "watch.csv"
    assert (
        main(["watch", "--log", str(watched), "--max-log-mb", "0.01", "--fsync", "--interval", "0.05", "--count", "40"])
        == 0
    )
    capsys.readouterr()
    assert (tmp_path / "watch.csv.1").exists()
    assert read_log(watched).ints("gpu") == [0, 1] * 40


# -- faults inside a real Hugging Face Trainer run -------------------------------------------------------


def test_faults_inside_a_hugging_face_trainer_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Prometheus port taken, a sink that starts failing, the GPU lost and the log deleted, all in one real
    Trainer run on a tiny CPU model: the run trains every step and the log keeps every row."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("vramscope.integrations.hf")
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    log = tmp_path / "mem.csv"
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    bad = FailingSink(fail_from=4, log=log)
    callback = hf.MemoryMonitorCallback(
        log=str(log), prometheus=taken.getsockname()[1], warn=False, nvml=fake, sinks=[bad]
    )

    class Faults(transformers.TrainerCallback):  # type: ignore[misc]
        """The GPU is lost at step 6; an operator deletes the log at step 8."""

        log_at_fault = b""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 6:
                fake.gpus[1].errors.update(dict.fromkeys(NVML_FUNCTIONS, fake_nvml.NVML_ERROR_GPU_IS_LOST))
            if state.global_step == 8:
                self.log_at_fault = log.read_bytes()
                log.unlink()

    faults = Faults()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
    data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.randint(0, 64, (8,))} for _ in range(24)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=12,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="no",
    )
    trainer = transformers.Trainer(
        model=transformers.LlamaForCausalLM(config),
        args=args,
        train_dataset=data,
        callbacks=[callback, faults],
    )
    try:
        with caplog.at_level(logging.WARNING):
            trainer.train()
            callback.close()
    finally:
        taken.close()
    assert trainer.state.global_step == 12  # every step trained
    assert log.read_bytes().startswith(faults.log_at_fault)
    steps = read_log(log).ints("step")
    assert sorted({s for s in steps if s is not None}) == list(range(1, 13))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for cause in ("already in use", "Connection reset", "GPU is lost", "was deleted"):
        assert len([w for w in warnings if cause in w]) == 1, (cause, warnings)
    rows_before, rows_kept = kept_rows(faults.log_at_fault, log)
    record(
        "HF Trainer run: Prometheus port taken, a sink failing, GPU lost, log deleted",
        "all 12 steps trained; one warning per fault; log re-created with every row",
        rows_before,
        rows_kept,
        test="test_faults_inside_a_hugging_face_trainer_run",
    )
