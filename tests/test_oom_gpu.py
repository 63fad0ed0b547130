"""The OOM post-mortem on a real GPU (run on the H200): a real allocator OOM under a 2 GiB cap."""

from __future__ import annotations

import gc
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

MIB = 1024**2
GIB = 1024**3
CAP = 2 * GIB
CONTEXT = {"step": 3, "phase": "forward", "tokens": 1024, "batch_shape": [2, 512]}


@pytest.fixture
def capped() -> Iterator[None]:
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP / total)
    yield
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)


def fill(chunk: int) -> tuple[list[Any], BaseException]:
    """Allocate ``chunk``-byte tensors until CUDA runs out; returns what was held and the error."""
    import torch

    held: list[Any] = []
    try:
        while True:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as exc:
        return held, exc


def test_post_mortem_of_a_real_oom(tmp_path: Path, capped: None) -> None:
    from torch.cuda import _memory_viz

    from vramscope.oom import OomRecorder

    recorder = OomRecorder(tmp_path, context=lambda: CONTEXT, max_entries=1000)
    recorder.start()
    held, error = fill(256 * MIB)
    recorder.record_exception(error)
    recorder.stop()
    n = len(held)
    del held, error
    names = {p.name for p in tmp_path.iterdir()}
    assert {"oom-1-snapshot.pickle", "oom-1.md", "oom-1.html", "oom-1.json", "oom-1.event.json"} <= names
    report = json.loads((tmp_path / "oom-1.json").read_text())
    assert report["requested_bytes"] == 256 * MIB
    assert report["allocated_bytes"] >= n * 256 * MIB
    assert abs(report["capacity_bytes"] - CAP) <= MIB  # the per-process limit, not the H200's 141 GB
    assert report["reserved_bytes"] <= report["capacity_bytes"]
    assert (report["step"], report["phase"], report["batch_shape"]) == (3, "forward", [2, 512])
    assert "test_oom_gpu.py" in report["top_sites"][0]["where"]
    assert report["top_sites"][0]["bytes"] >= n * 256 * MIB
    assert "CUDA out of memory" in report["message"]
    assert report["advice"]
    with open(tmp_path / "oom-1-snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)
    assert any(e["action"] == "oom" for e in snapshot["device_traces"][0])
    assert "total_reserved" in _memory_viz.segsum(snapshot)  # torch's own reader accepts it
    assert "<script" not in (tmp_path / "oom-1.html").read_text()


def test_history_is_bounded(tmp_path: Path, capped: None) -> None:
    import torch

    from vramscope.oom import OomRecorder

    recorder = OomRecorder(tmp_path, max_entries=50)
    recorder.start()
    for _ in range(500):
        x = torch.empty(MIB, device="cuda")
        del x
    held, error = fill(512 * MIB)
    recorder.stop()
    del held, error
    report = json.loads((tmp_path / "oom-1.json").read_text())
    assert 0 < report["history_entries"] <= 50


def test_stopped_recorder_writes_nothing_and_reports_are_capped(tmp_path: Path, capped: None) -> None:
    from vramscope.oom import OomRecorder

    stopped = OomRecorder(tmp_path / "stopped")
    stopped.start()
    stopped.stop()
    held, error = fill(512 * MIB)
    del held, error
    assert not list((tmp_path / "stopped").glob("oom-*"))

    capped_rec = OomRecorder(tmp_path / "capped", max_reports=1)
    with capped_rec:
        for _ in range(2):
            held, error = fill(512 * MIB)
            del held, error
    assert sorted(p.name for p in (tmp_path / "capped").glob("*.md")) == ["oom-1.md"]


def test_two_recorders_share_the_history(tmp_path: Path, capped: None) -> None:
    from vramscope.oom import OomRecorder

    first = OomRecorder(tmp_path / "first")
    second = OomRecorder(tmp_path / "second")
    first.start()
    second.start()
    first.stop()  # the second still needs the history
    held, error = fill(512 * MIB)
    second.stop()
    del held, error
    report = json.loads((tmp_path / "second" / "oom-1.json").read_text())
    assert report["history_entries"] > 0
    assert not list((tmp_path / "first").glob("oom-*"))
