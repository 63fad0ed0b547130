"""Which allocator segments a run's pool holds, and who opened each: a Trainer callback for the whole-run truth.

With ``WR_SNAPSHOT_DIR`` set, ``whole_run_hf.py`` records the allocator's history from before the model loads
(``torch.cuda.memory._record_memory_history``, Python frames only) and, after each of the first train steps and
after the first evaluation, writes ``<dir>/<pid>/segments-<moment>.json``: every segment of at least ``WR_SNAPSHOT_MIB``
(64 by default) with its size, what of it is allocated, its blocks (size, state) and the frames of the allocation
that opened it (the trace's ``segment_alloc``), innermost last. This is what tells which block of the pool a plan
does not list (docs/planner.md, "Left as they are"): sizes alone cannot say which tensor made a segment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

_MIB = 1 << 20


def start_recording() -> Path | None:
    """Start the history when ``WR_SNAPSHOT_DIR`` is set; returns the folder, or None."""
    where = os.environ.get("WR_SNAPSHOT_DIR")
    if not where or not torch.cuda.is_available():
        return None
    torch.cuda.memory._record_memory_history(max_entries=400_000, context="all", stacks="python")
    path = Path(where) / str(os.getpid())  # several runs at once share the variable
    path.mkdir(parents=True, exist_ok=True)
    return path


def _frames(event: dict[str, Any]) -> list[str]:
    frames = event.get("frames") or []
    # Innermost first in torch's list: keep the ten nearest the allocation, outermost first for reading.
    return [f"{Path(f.get('filename', '?')).name}:{f.get('line', '?')} {f.get('name', '?')}" for f in frames[:10]][::-1]


def write_segments(folder: Path, moment: str) -> None:
    """The pool's large segments now, each with the frames that opened it."""
    snap = torch.cuda.memory._snapshot()
    smallest = int(os.environ.get("WR_SNAPSHOT_MIB", "64")) * _MIB
    opened: dict[int, dict[str, Any]] = {}
    for trace in snap.get("device_traces", []):
        for event in trace:
            if event.get("action") == "segment_alloc":
                opened[int(event["addr"])] = event
    segments = []
    for seg in snap.get("segments", []):
        if int(seg["total_size"]) < smallest:
            continue
        event = opened.get(int(seg["address"]))
        segments.append({
            "address": int(seg["address"]),
            "mib": round(int(seg["total_size"]) / _MIB, 2),
            "allocated_mib": round(int(seg["allocated_size"]) / _MIB, 2),
            "blocks": [[round(int(b["size"]) / _MIB, 2), b["state"]] for b in seg.get("blocks", [])],
            "opened_by": _frames(event) if event else "before the recording (or its entries rolled over)",
            "block_frames": [_frames(b) for b in seg.get("blocks", []) if b.get("frames")][:4],
        })
    segments.sort(key=lambda s: -s["mib"])
    # Inside the largest segment (transformers' caching_allocator_warmup: the loaded weights), every large
    # allocation and free the history kept, in order: who held which part of it, and when it was let go.
    events: list[dict[str, Any]] = []
    if snap.get("segments"):
        top = max(snap["segments"], key=lambda seg: int(seg["total_size"]))
        lo, hi = int(top["address"]), int(top["address"]) + int(top["total_size"])
        for trace in snap.get("device_traces", []):
            for event in trace:
                if lo <= int(event.get("addr", -1)) < hi and int(event.get("size", 0)) >= smallest:
                    offset = round((int(event["addr"]) - lo) / _MIB, 2)
                    events.append({"action": event.get("action"), "offset_mib": offset,
                                   "mib": round(int(event["size"]) / _MIB, 2), "frames": _frames(event)[-6:]})
    stats = torch.cuda.memory_stats()
    out = {
        "moment": moment,
        "argv": sys.argv,
        "allocated_bytes": stats.get("allocated_bytes.all.current"),
        "reserved_bytes": stats.get("reserved_bytes.all.current"),
        "peak_allocated_bytes": stats.get("allocated_bytes.all.peak"),
        "segments_at_least_mib": smallest // _MIB,
        "segments": segments,
        "largest_segment_events": events,
    }
    (folder / f"segments-{moment}.json").write_text(json.dumps(out, indent=1))


class SegmentSnapshots(TrainerCallback):  # type: ignore[misc]
    """Writes the segments after train steps 1..``steps`` and after the first ``evaluate()``."""

    def __init__(self, folder: Path, steps: int = 3) -> None:
        self.folder = folder
        self.steps = steps
        self.evaluations = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        write_segments(self.folder, "train-begin")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step <= self.steps:
            write_segments(self.folder, f"after-step{state.global_step}")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.evaluations += 1
        if self.evaluations == 1:
            write_segments(self.folder, f"after-eval-at-step{state.global_step}")
