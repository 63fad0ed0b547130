"""`vramscope run` never hurts the command it runs (issue 14): each fault here is real.

* the injected HF callback cannot create or write its step log (a directory in the way; the kernel's
  file-size limit, RLIMIT_FSIZE, set in the training process: EFBIG, as a full disk or a quota gives);
* the user's PYTHONPATH with empty entries (the current directory);
* a FIFO as the log whose reader stopped (its buffer shrunk to one page, so that it fills in seconds);
* a Pushgateway on 127.0.0.1 that answers one byte a second;
* an existing log, and a second `vramscope run` writing the same log;
* vramscope's own stderr or stdout a closed pipe or /dev/full;
* a child that double-forks a daemon and exits.

Job control in a real terminal is in tests/test_run_jobcontrol.py.
"""

from __future__ import annotations

import array
import dataclasses
import fcntl
import http.server
import json
import os
import signal
import socketserver
import subprocess
import sys
import termios
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli.run import files_written, format_summary, summary_json
from vramscope.logs.reader import read_log
from vramscope.run.inject import ENV_INJECT, ENV_PACKAGE_PARENT, ENV_STEP_LOG, SITE_DIR
from vramscope.run.runner import CLEANUP_LIMIT_S, ENV_RUN_ID, run_monitored

PYTHON = sys.executable
SRC = str(Path(__file__).resolve().parent.parent / "src")
VRAMSCOPE = [PYTHON, "-m", "vramscope"]
GIB = fake_nvml.GIB


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user would run vramscope in: vramscope importable, nothing of ours set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = SRC
    env.update(extra)
    return env


def one_line_warnings(stderr: str, *words: str) -> list[str]:
    return [line for line in stderr.splitlines() if all(w in line for w in words)]


# -- 1. the injected callback never stops the training ----------------------------------------------------

TRAIN = textwrap.dedent(
    """
    import resource, sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    limit = int(sys.argv[1])
    if limit:  # files this process writes may not grow past `limit` bytes: writes fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=32)
    data = [{"input_ids": torch.randint(0, 32, (8,)), "labels": torch.randint(0, 32, (8,))} for _ in range(12)]
    args = TrainingArguments(output_dir="out", max_steps=6, per_device_train_batch_size=2, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, logging_steps=100)
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=data)
    trainer.train()
    print("trained", trainer.state.global_step, "steps")
    """
)


@pytest.mark.slow  # a real HF Trainer in a child Python per fault
@pytest.mark.parametrize(
    ("fault", "limit"),
    [("step log path is a directory", 0), ("step log cannot be written at the start (EFBIG)", 64),
     ("step log fills up mid-run (EFBIG)", 500)],
    ids=["dir-in-the-way", "full-at-train-begin", "full-mid-run"],
)
def test_the_injected_callback_never_stops_the_training(fault: str, limit: int, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "train.py").write_text(TRAIN)
    if limit == 0:
        (tmp_path / "dd.steps.csv").mkdir()
    result = subprocess.run([*VRAMSCOPE, "run", "--log", "dd.csv", "--", PYTHON, "train.py", str(limit)],
                            cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 6 steps" in result.stdout  # every step ran, as it does without vramscope
    assert "Traceback" not in result.stderr
    if limit == 500:
        # The step log took rows until the limit, then the sampler warned once and the callback went on.
        warned = one_line_warnings(result.stderr, "dd.steps.csv", "File too large", "training goes on")
        rows = read_log(tmp_path / "dd.steps.csv")
        assert 1 <= len(rows) < 7
    else:
        warned = one_line_warnings(result.stderr, "the memory callback stopped", "training goes on without it")
    assert len(warned) == 1, result.stderr
    assert len(read_log(tmp_path / "dd.csv")) >= 2  # the run's own log is whole


# -- 2. the user's PYTHONPATH reaches the child unchanged ------------------------------------------------

SHOW = "import json, os, sys; print(json.dumps({'path': sys.path, 'env': dict(os.environ)}))"
# `vramscope run` started with the user's PYTHONPATH left exactly as it is (vramscope found by sys.path).
CLI = f"import sys; sys.path.insert(0, {SRC!r}); from vramscope.cli import main; raise SystemExit(main(sys.argv[1:]))"


def _with_and_without_vramscope(tmp_path: Path, python_path: str) -> tuple[Any, Any]:
    (tmp_path / "mymod.py").write_text("VALUE = 42\n")  # in the current directory, not the script's
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "t.py").write_text(f"import mymod\n{SHOW}\n")
    env = {**user_env(), "PYTHONPATH": python_path}
    plain = subprocess.run([PYTHON, "s/t.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    under = subprocess.run([PYTHON, "-c", CLI, "run", "--quiet", "--", PYTHON, "s/t.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    return plain, under


@pytest.mark.parametrize("python_path", [":", f"{os.sep}nowhere::{os.sep}else", f":{os.sep}nowhere"])
def test_the_childs_environment_and_path_are_the_users(python_path: str, tmp_path: Path) -> None:
    plain, under = _with_and_without_vramscope(tmp_path, python_path)
    assert plain.returncode == 0, plain.stderr  # the empty entry is the current directory: mymod is found
    assert under.returncode == 0, under.stderr  # ... under vramscope too
    mine, theirs = json.loads(plain.stdout), json.loads(under.stdout)
    assert [p for p in theirs["path"] if p != SITE_DIR] == mine["path"]
    assert theirs["env"]["PYTHONPATH"] == SITE_DIR + os.pathsep + python_path  # theirs, whole, after our folder
    added = {"PYTHONPATH", ENV_INJECT, ENV_PACKAGE_PARENT, ENV_RUN_ID, ENV_STEP_LOG}
    assert set(theirs["env"]) - set(mine["env"]) <= added
    assert {k: v for k, v in theirs["env"].items() if k not in added} == {
        k: v for k, v in mine["env"].items() if k not in added}


def test_an_empty_pythonpath_adds_no_current_directory(tmp_path: Path) -> None:
    plain, under = _with_and_without_vramscope(tmp_path, "")
    assert plain.returncode == under.returncode == 1  # Python ignores an empty PYTHONPATH: not found either way
    assert "ModuleNotFoundError" in plain.stderr and "ModuleNotFoundError" in under.stderr


def test_a_signal_ignored_by_the_user_stays_ignored_in_the_child(tmp_path: Path) -> None:
    # `nohup vramscope run -- CMD`: SIGHUP is ignored for vramscope and must be for CMD too.
    code = "import signal, time; print(signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True); time.sleep(1)"
    proc = subprocess.Popen([*VRAMSCOPE, "run", "--quiet", "--", PYTHON, "-c", code], env=user_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "True"
    proc.send_signal(signal.SIGHUP)  # the hang-up nohup protects from
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


# -- 3. nothing blocks the end: a FIFO nobody reads, a slow Pushgateway; signals work meanwhile -------------

FILL_AND_END = textwrap.dedent(
    """
    import pathlib, sys, time
    time.sleep(float(sys.argv[2]))
    pathlib.Path(sys.argv[1]).write_text(str(time.time()))
    """
)
# The same child, ending when the test says so (the file argv[2] appears) rather than after a fixed time.
END_WHEN_TOLD = textwrap.dedent(
    """
    import pathlib, sys, time
    told, deadline = pathlib.Path(sys.argv[2]), time.monotonic() + 60
    while not told.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    pathlib.Path(sys.argv[1]).write_text(str(time.time()))
    """
)


@dataclasses.dataclass(frozen=True)
class StalledFifo:
    path: Path
    reader: int

    def held(self) -> int:
        """Bytes written to the FIFO and never read (FIONREAD on its reader)."""
        count = array.array("i", [0])
        fcntl.ioctl(self.reader, termios.FIONREAD, count)
        return count[0]

    def wait_until_a_writer_blocks(self, proc: subprocess.Popen[str]) -> None:
        """Until the log's writer is stuck in write(): the buffer over half full and no byte added for ten
        sample intervals (it writes a row per sample, so a writer still able to write adds one every 0.05 s)."""
        deadline = time.monotonic() + 60
        last, since = -1, time.monotonic()
        while True:
            held, now = self.held(), time.monotonic()
            if held != last:
                last, since = held, now
            elif held > 2048 and now - since >= 0.5:
                return
            assert proc.poll() is None, f"vramscope run ended early: {proc.communicate()[1][-2000:]}"
            assert now < deadline, f"the FIFO never filled: {held} bytes in it"
            time.sleep(0.02)


@pytest.fixture
def stalled_fifo(tmp_path: Path) -> Iterator[StalledFifo]:
    """A FIFO whose one reader has stopped reading, its buffer one page: writes to it block in seconds."""
    fifo = tmp_path / "mem.csv"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a reader (and writer) that never reads
    fcntl.fcntl(reader, 1031, 4096)  # F_SETPIPE_SZ: one page
    yield StalledFifo(fifo, reader)
    os.close(reader)


def _run_until_the_child_ends(argv: list[str], ended: Path, then: Any = None,
                              blocked: StalledFifo | None = None) -> tuple[int, str, float, float]:
    """Runs `argv`, waits for its child to write `ended` (with `blocked`: first until that FIFO's writer is
    stuck, then tells the END_WHEN_TOLD child to end), calls `then(proc)`, and waits for vramscope to exit."""
    proc = subprocess.Popen(argv, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if blocked is not None:
        blocked.wait_until_a_writer_blocks(proc)
        (ended.parent / "told").touch()
    deadline = time.monotonic() + 60
    while not ended.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended.exists(), "the child never ended"
    ended_at = time.monotonic()
    if then is not None:
        then(proc)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err, ended_at, time.monotonic()


@pytest.mark.slow  # the FIFO fills, then vramscope's 3 s bound on the end
def test_a_log_fifo_nobody_reads_does_not_hold_up_the_end(stalled_fifo: StalledFifo, tmp_path: Path) -> None:
    ended = tmp_path / "ended"
    code, err, ended_at, exited_at = _run_until_the_child_ends(
        [*VRAMSCOPE, "run", "--log", str(stalled_fifo.path), "--interval", "0.05", "--",
         PYTHON, "-c", END_WHEN_TOLD + "\nraise SystemExit(5)", str(ended), str(tmp_path / "told")], ended,
        blocked=stalled_fifo)
    assert code == 5, err  # the child's code
    assert exited_at - ended_at < CLEANUP_LIMIT_S + 2.0, err  # bounded, instead of forever
    warned = one_line_warnings(err, "gave up on", str(stalled_fifo.path),
                               f"still blocked after {CLEANUP_LIMIT_S:g} s")
    assert len(warned) == 1, err
    assert "exited with 5" in err  # the summary still came


@pytest.mark.slow  # the FIFO fills at the sampling rate first
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_wait_for_a_blocked_sink_at_once(stalled_fifo: StalledFifo, tmp_path: Path,
                                                           sig: signal.Signals) -> None:
    ended = tmp_path / "ended"

    def signal_soon(proc: subprocess.Popen[str]) -> None:
        time.sleep(0.3)
        proc.send_signal(sig)

    code, err, ended_at, exited_at = _run_until_the_child_ends(
        [*VRAMSCOPE, "run", "--log", str(stalled_fifo.path), "--interval", "0.05", "--",
         PYTHON, "-c", END_WHEN_TOLD, str(ended), str(tmp_path / "told")], ended, signal_soon, blocked=stalled_fifo)
    assert code == 0, err  # still the child's code: it ended well before the signal
    assert exited_at - ended_at < 0.3 + 1.0, err
    assert len(one_line_warnings(err, "gave up on", "a signal asked vramscope to end")) == 1, err


class _SlowGateway(http.server.BaseHTTPRequestHandler):
    """A Pushgateway that takes the push, then answers one byte a second (each read well within the
    client's socket timeout, so only a bound on the whole close can stop waiting)."""

    pushes = 0

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).pushes += 1
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
            try:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            except OSError:
                return
            time.sleep(1.0)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.slow  # vramscope's 3 s bound on the end
def test_a_slow_pushgateway_does_not_hold_up_the_end(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SlowGateway)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ended = tmp_path / "ended"
        code, err, ended_at, exited_at = _run_until_the_child_ends(
            [*VRAMSCOPE, "run", "--push", f"http://127.0.0.1:{server.server_address[1]}", "--push-interval", "0.2",
             "--interval", "0.1", "--", PYTHON, "-c", FILL_AND_END + "\nraise SystemExit(3)", str(ended), "1"], ended)
    finally:
        server.shutdown()
        server.server_close()
    assert _SlowGateway.pushes >= 1  # the gateway was really pushed to (and answered slowly)
    assert code == 3, err
    assert exited_at - ended_at < CLEANUP_LIMIT_S + 2.0, err
    assert len(one_line_warnings(err, "gave up on", "PushgatewaySink", "still blocked")) == 1, err


# -- 4. an existing log is never overwritten without --overwrite; two writers are refused -----------------


def test_an_existing_file_given_as_log_is_refused_and_kept(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("print('the script ran')\n")
    before = script.read_bytes()
    result = subprocess.run([*VRAMSCOPE, "run", "--log", "x.py", "--", PYTHON, "x.py"], cwd=tmp_path,
                            env=user_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""  # the command did not run
    assert result.stderr.splitlines() == [
        "vramscope: error: log x.py already exists; give a new name, e.g. --log x-2.py, or add --overwrite "
        "to replace it"]
    assert script.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]  # nothing written


def test_a_rerun_with_the_same_log_needs_overwrite(tmp_path: Path) -> None:
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*VRAMSCOPE, "run", *extra, "--log", "m.csv", "--interval", "0.05", "--", "true"],
                              cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=60)

    assert run().returncode == 0
    first = (tmp_path / "m.csv").read_bytes()
    again = run()
    assert again.returncode == 2 and "--log m-2.csv" in again.stderr and "--overwrite" in again.stderr
    assert (tmp_path / "m.csv").read_bytes() == first
    assert run("--overwrite").returncode == 0
    assert (tmp_path / "m.csv").read_bytes() != first
    # The step log the injection would write beside it is protected the same way.
    (tmp_path / "n.steps.csv").write_text("step\n1\n")
    beside = subprocess.run([*VRAMSCOPE, "run", "--log", "n.csv", "--", "true"], cwd=tmp_path, env=user_env(),
                            capture_output=True, text=True, timeout=60)
    assert beside.returncode == 2 and "n.steps.csv (written beside log n.csv) already exists" in beside.stderr
    assert "--log n-2.csv" in beside.stderr
    # An empty file (mktemp's) holds nothing to lose: it is used.
    (tmp_path / "empty.csv").touch()
    used = subprocess.run([*VRAMSCOPE, "run", "--log", "empty.csv", "--", "true"], cwd=tmp_path, env=user_env(),
                          capture_output=True, text=True, timeout=60)
    assert used.returncode == 0 and len(read_log(tmp_path / "empty.csv")) >= 1


def test_a_second_writer_of_a_log_is_refused_by_its_lock(tmp_path: Path) -> None:
    log, stop = tmp_path / "m.csv", tmp_path / "stop"
    wait = f"import os, time\nwhile not os.path.exists({str(stop)!r}): time.sleep(0.02)"
    first = subprocess.Popen([*VRAMSCOPE, "run", "--log", str(log), "--interval", "0.05", "--", PYTHON, "-c", wait],
                             env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while (not log.exists() or log.read_bytes().count(b"\r\n") < 4) and time.monotonic() < deadline:
            time.sleep(0.02)
        marker = tmp_path / "second-ran"
        second = subprocess.run([*VRAMSCOPE, "run", "--overwrite", "--log", str(log), "--", "touch", str(marker)],
                                env=user_env(), capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert len(second.stderr.splitlines()) == 1, second.stderr
        assert "is being written by another process" in second.stderr and "m-2.csv" in second.stderr
        assert not marker.exists()  # refused before the command started
    finally:
        stop.touch()
        _, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    samples = int(err.split("samples: ")[1].split(",")[0])
    assert len(read_log(log)) == samples  # the first run's log lost no row to the second


# -- 6. the child's exit code wins over vramscope's own output failing ---------------------------------------


@pytest.mark.parametrize("where", ["stderr closed pipe", "stderr /dev/full", "stdout /dev/full (--json)"])
def test_the_childs_exit_code_wins_when_our_output_fails(where: str, tmp_path: Path) -> None:
    argv = [*VRAMSCOPE, "run", *(["--json"] if "json" in where else []), "--log", str(tmp_path / "m.csv"),
            "--interval", "0.05", "--", "sh", "-c", "sleep 0.3; exit 7"]
    if where == "stderr closed pipe":
        read, write = os.pipe()
        os.close(read)  # `2>&1 | head -c0`: nobody reads vramscope's stderr
        proc = subprocess.run(argv, env=user_env(), stdout=subprocess.DEVNULL, stderr=write, timeout=60)
        os.close(write)
    else:
        with open("/dev/full", "w") as full:
            streams: dict[str, Any] = {"stderr": full} if where.startswith("stderr") else {"stdout": full}
            proc = subprocess.run(argv, env=user_env(), timeout=60, **streams)
    assert proc.returncode == 7
    assert len(read_log(tmp_path / "m.csv")) >= 3


def test_vramscope_dies_of_the_signal_that_killed_the_child(tmp_path: Path) -> None:
    result = subprocess.run([*VRAMSCOPE, "run", "--", "sh", "-c", "kill -TERM $$"], env=user_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGTERM, result.stderr  # not 143: a shell sees the same death
    assert "was killed by signal 15" in result.stderr


# -- 11. a daemon the child started is named, not silently dropped ------------------------------------------

DAEMONISE = textwrap.dedent(
    """
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:  # the daemon: reparented away from the command's tree
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            with open(sys.argv[1], "w") as out:
                out.write(str(os.getpid()))
            time.sleep(float(sys.argv[2]))
            os._exit(0)
        os._exit(0)
    while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
        time.sleep(0.01)
    """
)


def test_a_daemon_left_running_by_the_child_is_named(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    started = time.monotonic()
    result = subprocess.run([*VRAMSCOPE, "run", "--json", "--", PYTHON, "-c", DAEMONISE, str(pid_file), "8"],
                            env=user_env(), capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    daemon = int(pid_file.read_text())
    try:
        assert result.returncode == 0, result.stderr
        assert took < 6  # not held up by the daemon's 8 s
        warned = one_line_warnings(result.stderr, "still runs after it exited", f"pid {daemon} (python")
        assert len(warned) == 1, result.stderr
        summary = json.loads(result.stdout.splitlines()[-1])
        assert [p["pid"] for p in summary["still_running"]] == [daemon]
    finally:
        try:
            os.kill(daemon, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_child_that_leaves_nothing_behind_names_nothing(tmp_path: Path) -> None:
    result = subprocess.run([*VRAMSCOPE, "run", "--json", "--", PYTHON, "-c", "import os; os.system('true')"],
                            env=user_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert json.loads(result.stdout.splitlines()[-1])["still_running"] == []
    assert "still run" not in result.stderr


# -- the summary: the files written, the GPUs used; --json -------------------------------------------------


def test_the_summary_lists_only_the_gpus_the_command_used(tmp_path: Path) -> None:
    fake = fake_nvml.FakeNvml([fake_nvml.FakeGpu(used=5 * GIB), fake_nvml.FakeGpu(used=9 * GIB),
                               fake_nvml.FakeGpu(used=1 * GIB)])

    def on_start(child: subprocess.Popen[bytes]) -> None:
        fake.gpus[1].processes[child.pid] = 3 * GIB

    log = tmp_path / "m.csv"
    started = time.time()
    result = run_monitored([PYTHON, "-c", "import time; time.sleep(0.4)"], log_path=str(log), interval=0.05,
                           nvml=NvmlBackend(nvml=fake), on_start=on_start)
    files = files_written(result, started)
    text = format_summary(result, files)
    assert [line.split(":")[0].strip() for line in text.splitlines() if line.strip().startswith("GPU")] == [
        "GPU 1 NVIDIA H200"]
    assert "peak of this command 3.00 GiB" in text
    assert f"wrote: {log}" in text
    data = summary_json(result, files)
    assert [g["index"] for g in data["gpus"]] == [1] and data["gpus_watched"] == 3
    assert data["gpus"][0]["process_peak_bytes"] == 3 * GIB


def test_json_summary_names_every_file_written(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    (tmp_path / "train.py").write_text(TRAIN)
    result = subprocess.run([*VRAMSCOPE, "run", "--json", "--log", "mem.csv", "--", PYTHON, "train.py", "0"],
                            cwd=tmp_path, env=user_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.splitlines()[-1])  # the last line of stdout, after the command's own
    assert summary["schema_version"] == 1
    assert summary["exit_code"] == 0 and summary["signal"] is None
    assert summary["command"] == [PYTHON, "train.py", "0"]
    assert summary["files"][0] == "mem.csv"
    assert "mem.steps.csv" in summary["files"] and "mem.steps.analysis.json" in summary["files"]
    assert all((tmp_path / f).is_file() for f in summary["files"])
    assert summary["samples"] == len(read_log(tmp_path / "mem.csv"))
    assert "exited with" not in result.stderr  # --json replaces the text summary
