"""`vramscope tune -- CMD` leaves nothing behind: each trial's whole process group ends with the trial (after a
success, a crash, an out-of-memory exit), and SIGTERM, SIGHUP or SIGINT to the tuner end the running trial's
group, remove the `vramscope-tune-*` folder and then end the tuner by that signal.

Real processes throughout: the "training command" is a Python script that starts a helper `sleep` (as a
DataLoader worker or a launcher's rank would be started: same process group) and records both pids; the trial
record it writes stands in for the one the start-up hook writes from a CUDA Trainer, which needs a GPU. The
tuner is the real CLI in a child process; the one fake is `cuda_missing` (this machine has no GPU, and these
trials need none).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vramscope.commands import parse_command
from vramscope.tune.command import SearchSettings, TrialFailed, tune_command
from vramscope.tune.search import NoSizeFitsError

PY = sys.executable
GIB = 2**30

# Each trial: say whether the previous trials' processes still run, start a helper, record the pids, then end as
# FAKE_MODE says. A "done" trial's peak grows with the batch, 1 GiB a row on a 4 GiB base of a 24 GiB GPU.
FAKE_TRAINING = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    request = json.loads(os.environ["VRAMSCOPE_TRIAL"])
    pids_file, mode = os.environ["FAKE_PIDS"], os.environ["FAKE_MODE"]
    earlier = [int(p) for line in open(pids_file) for p in line.split()] if os.path.exists(pids_file) else []
    helper = subprocess.Popen(["sleep", "300"])
    with open(pids_file, "a") as f:
        f.write(f"{os.getpid()} {helper.pid}\\n")
    with open(os.environ["FAKE_STILL_RUNNING"], "a") as f:
        f.write("".join(f"{p}\\n" for p in earlier if running(p)))
    if mode == "hang-deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a trainer that ignores SIGTERM: SIGKILL after the grace
    if mode.startswith("hang"):
        time.sleep(300)
    if mode == "crash":
        sys.exit("RuntimeError: the data loader broke")
    batch = request["batch_size"]
    record = {"status": "done", "capacity_bytes": 24 * 2**30, "base_allocated_bytes": 4 * 2**30,
              "base_reserved_bytes": 4 * 2**30,
              "steps": [{"peak_allocated_bytes": (4 + batch) * 2**30, "peak_reserved_bytes": (4 + batch) * 2**30}]}
    if mode == "oom" or (mode == "oom-above-8" and batch > 8):
        record = dict(record, status="oom", error="OutOfMemoryError: CUDA out of memory", steps=[])
    with open(request["record"], "w") as f:
        json.dump(record, f)
    sys.exit(3 if record["status"] == "oom" else 0)
""")

TUNER = textwrap.dedent("""
    import signal, sys
    import vramscope.tune.cuda as cuda
    cuda.cuda_missing = lambda: None  # no GPU here, and these trials need none
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job
    if sys.argv[1] == "nohup":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from vramscope.cli import main
    sys.exit(main(["tune", "--", *sys.argv[2:]]))
""")


def running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (this machine's PID 1 reaps no orphans) ended and holds nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Callable[[str], Setup]]:
    setups: list[Setup] = []

    def make(mode: str) -> Setup:
        setups.append(Setup(tmp_path, mode))
        return setups[-1]

    yield make
    for setup in setups:
        setup.kill_all()


class Setup:
    def __init__(self, tmp_path: Path, mode: str) -> None:
        self.tmp = tmp_path
        self.pids = tmp_path / "pids"
        self.still_running = tmp_path / "still_running"
        self.still_running.write_text("")
        self.tmpdir = tmp_path / "tmpdir"
        self.tmpdir.mkdir()
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 512}))
        script = tmp_path / "train.py"
        script.write_text(FAKE_TRAINING)
        self.argv = [PY, str(script), "--model_name_or_path", str(model), "--output_dir", str(tmp_path / "out"),
                     "--per_device_train_batch_size", "4", "--max_seq_length", "64"]
        self.env = {**os.environ, "FAKE_PIDS": str(self.pids), "FAKE_MODE": mode,
                    "FAKE_STILL_RUNNING": str(self.still_running), "TMPDIR": str(self.tmpdir)}

    def all_pids(self) -> list[int]:
        return [int(p) for p in self.pids.read_text().split()] if self.pids.exists() else []

    def kill_all(self) -> None:
        """Teardown: a failing test leaves no processes behind either."""
        for pid in self.all_pids():
            if running(pid):
                os.kill(pid, signal.SIGKILL)

    def tune_folders(self) -> list[str]:
        return sorted(p.name for p in self.tmpdir.glob("vramscope-tune-*"))


@pytest.mark.parametrize("mode", ["done", "oom-above-8", "crash", "oom"])
def test_each_trial_ends_with_its_whole_process_group(made: Callable[[str], Setup], mode: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    setup = made(mode)
    for name in ("FAKE_PIDS", "FAKE_MODE", "FAKE_STILL_RUNNING"):
        monkeypatch.setenv(name, setup.env[name])
    monkeypatch.setattr(tempfile, "tempdir", str(setup.tmpdir))  # the trial folder, kept after a crash, here
    parsed = parse_command(setup.argv)
    if mode in ("done", "oom-above-8"):
        result = tune_command(parsed, SearchSettings(max_trials=3, timeout_s=60))
        assert len(result.trials) == 3
        oks = [t.trial.ok for t in result.trials]
        assert all(oks) if mode == "done" else (True in oks and False in oks)
        assert not Path(result.trials[0].log_path).parent.exists()  # the trial folder went with the search
    else:
        with pytest.raises(TrialFailed if mode == "crash" else NoSizeFitsError):
            tune_command(parsed, SearchSettings(max_trials=3, timeout_s=60))
        # A crash keeps the trial's output for the message that points to it; running out of memory keeps nothing.
        assert len(setup.tune_folders()) == (1 if mode == "crash" else 0)
    pids = setup.all_pids()
    assert pids, "the fake training command never ran"
    # No trial saw a process of an earlier trial still running; none runs after the tuner returned.
    assert setup.still_running.read_text() == ""
    assert [p for p in pids if running(p)] == []


@pytest.mark.slow  # real signals, the trial's grace period
@pytest.mark.parametrize(("sig", "mode", "code"), [
    (signal.SIGTERM, "hang", -signal.SIGTERM),
    (signal.SIGHUP, "hang", -signal.SIGHUP),
    (signal.SIGINT, "hang", 130),
    (signal.SIGHUP, "hang-deaf", -signal.SIGHUP),  # the trial ignores SIGTERM; a second signal comes meanwhile
])
def test_a_signal_to_the_tuner_ends_the_trial_its_helpers_and_the_folder(
        made: Callable[[str], Setup], sig: signal.Signals, mode: str, code: int) -> None:
    setup = made(mode)
    tuner = subprocess.Popen([PY, "-c", TUNER, "plain", *setup.argv], env=setup.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: len(setup.all_pids()) == 2)
        assert len(setup.tune_folders()) == 1
        tuner.send_signal(sig)
        if mode == "hang-deaf":
            time.sleep(0.5)
            tuner.send_signal(signal.SIGTERM)  # held while the first one's clean-up runs
        _, err = tuner.communicate(timeout=30)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    assert tuner.returncode == code, err
    assert "Traceback" not in err.decode()
    assert [p for p in setup.all_pids() if running(p)] == []
    assert setup.tune_folders() == []


def test_an_ignored_hangup_stays_ignored(made: Callable[[str], Setup]) -> None:
    """`nohup vramscope tune -- ...`: the ssh drop does not end the trials; SIGTERM still does."""
    setup = made("hang")
    tuner = subprocess.Popen([PY, "-c", TUNER, "nohup", *setup.argv], env=setup.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: len(setup.all_pids()) == 2)
        tuner.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert tuner.poll() is None and all(running(p) for p in setup.all_pids())
        tuner.send_signal(signal.SIGTERM)
        tuner.communicate(timeout=30)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    assert tuner.returncode == -signal.SIGTERM
    assert [p for p in setup.all_pids() if running(p)] == []
    assert setup.tune_folders() == []


def test_a_signal_while_a_trial_starts_waits_for_its_popen_then_ends_as_the_callers_handler_says() -> None:
    """Around Popen (held), a signal is only noted: raised inside it, the child would be started and not ended.
    Raised at the block's end instead; after the clean-up the caller's own handler gets the signal (here one
    that returns, so the tuner leaves with 128+signal)."""
    from vramscope.tune.groups import held, stop_on_signals

    seen: list[int] = []

    def callers_handler(signum: int, frame: object) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGTERM, callers_handler)
    reached = False
    try:
        with pytest.raises(SystemExit) as exit_info, stop_on_signals():
            with held():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)  # the handler runs in here and only notes it
                reached = True
            pytest.fail("the held signal was not raised at the end of the block")
        assert reached and exit_info.value.code == 128 + signal.SIGTERM and seen == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is callers_handler  # put back as it was
    finally:
        signal.signal(signal.SIGTERM, previous)
