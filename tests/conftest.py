"""Shared fixtures: NVML scenarios (fakes at the hardware boundary) and the `gpu` marker's skip."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # so tests can `import fake_nvml`

import fake_nvml

# One intra-op thread for torch in the test processes and every child they start (unless the caller chose):
# the models here are tiny, so a second thread buys nothing, and with pytest-xdist's workers and their children
# all on the same few cores, OpenMP threads waiting on each other at every barrier only burn time.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A run started in the background by a non-interactive shell (`make test &`, a CI step behind `&`) inherits SIGINT
# and SIGQUIT ignored, and so does every process a test starts: `vramscope run` then rightly passes the ignore on to
# its command, as exec would, and the tests that type Ctrl-C into a real bash or send SIGINT expect a terminal's
# defaults. Give the test processes those defaults (a terminal emulator gives them to its shell).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (what `make test` runs): half again as many workers as cores, at least one more than them.

    About a quarter of the suite's time is spent waiting, not computing: on a child process's start-up, a
    real server's interval, a signal's grace period, a sampler's ticks. With one worker per core, a core
    sits idle while its worker waits; the extra workers run other tests meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS
    still chooses, as pytest-xdist documents.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + (cores + 1) // 2


# Seconds each test module took in a whole `make test` (setup, call and teardown of its tests, summed), to order the
# run by. VRAMSCOPE_RECORD_DURATIONS=tests/durations.json make test  writes it anew.
DURATIONS = Path(__file__).with_name("durations.json")


def _module_seconds() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _chunk_sizes(n: int, workers: int) -> list[int]:
    """How many tests pytest-xdist's worksteal scheduler first sends each worker: the collection cut in order."""
    sizes = []
    for i in range(workers):
        sizes.append((n - sum(sizes)) // (workers - i))
    return sizes


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected: the order is of the tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the run so that the workers finish together: the longest modules first, each module's tests together.

    worksteal cuts the collection into one run of tests per worker and, when a worker runs dry, moves half of
    the longest queue's tail to it. A long test started last keeps the whole run waiting for it, and a module
    split between workers runs its module fixture (a real trainer, a Pushgateway, the benchmarks) in both.
    So the modules are dealt, longest first, to the worker whose run is shortest so far, whole where they fit
    (a worker's run has the length the scheduler will cut), each run starting with its longest module; a
    steal then takes the short modules at the tails. Every worker computes the same order from the same file
    (pytest-xdist requires identical collections). Without the file, or without xdist, the longest modules
    still come first. A module missing from the file counts as a short one.
    """
    _skip_gpu_tests_without_cuda(items)
    seconds = _module_seconds()
    modules: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        modules[item.nodeid.split("::", 1)[0]].append(item)
    longest_first = sorted(modules, key=lambda m: -seconds.get(m, 0.0))  # stable: ties keep collection order
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or config.getoption("dist", "no") != "worksteal":
        items[:] = [item for m in longest_first for item in modules[m]]
        return
    room = _chunk_sizes(len(items), workers)
    runs: list[list[tuple[str, list[pytest.Item]]]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for m in longest_first:
        tests, share = modules[m], seconds.get(m, 0.0) / len(modules[m])
        while tests:
            fitting = [w for w in range(workers) if room[w] >= len(tests)] or [w for w in range(workers) if room[w]]
            w = min(fitting, key=lambda w: load[w])
            part, tests = tests[: room[w]], tests[room[w] :]
            runs[w].append((m, part))
            room[w] -= len(part)
            load[w] += share * len(part)
    items[:] = [item for run in runs for _, part in run for item in part]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """VRAMSCOPE_RECORD_DURATIONS=PATH: write each module's seconds in this run (the controller's view)."""
    path = os.environ.get("VRAMSCOPE_RECORD_DURATIONS")
    if path and not hasattr(session.config, "workerinput"):
        Path(path).write_text(json.dumps(dict(sorted(_RECORDED.items())), indent=0) + "\n", encoding="utf-8")


_RECORDED: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("VRAMSCOPE_RECORD_DURATIONS"):
        module = report.nodeid.split("::", 1)[0]
        _RECORDED[module] = round(_RECORDED[module] + report.duration, 2)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def nvml_two_gpus() -> fake_nvml.FakeNvml:
    return fake_nvml.two_healthy_gpus()


@pytest.fixture
def nvml_gpu_lost() -> fake_nvml.FakeNvml:
    return fake_nvml.one_gpu_lost()


@pytest.fixture
def nvml_not_supported() -> fake_nvml.FakeNvml:
    return fake_nvml.not_supported_fields()


@pytest.fixture
def nvml_old_driver() -> fake_nvml.FakeNvml:
    return fake_nvml.old_driver_without_v2()


@pytest.fixture
def nvml_no_driver() -> fake_nvml.FakeNvml:
    return fake_nvml.no_driver()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight one-layer Llama saved as a checkpoint folder (no tokenizer), for the tests that start a real
    trainer on it in a child: made once per test process."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny") / "model"
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=128, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(out)
    return out
