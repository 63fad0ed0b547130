"""The monitor's parts on their own: the rank gather's wire format, the bounded row history, the live rows, the
step window, the analysis pacing.

The monitor itself is driven end to end in test_loop.py and test_distributed.py (real gloo ranks); these pin
what each part promises, with real objects (a Sample, a clock that the test advances).
"""

from __future__ import annotations

import itertools

from vramscope.logs.schema import sample_rows
from vramscope.training.gather import GATHER_FIELDS, row_numbers, row_sample
from vramscope.training.history import RowHistory
from vramscope.training.live import LiveRows
from vramscope.training.pacing import AnalysisPacer
from vramscope.training.window import StepWindow
from vramscope.types import AllocatorReading, GpuReading, HostReading, ProcessGpuReading, Sample

GIB = 1024**3


def _sample() -> Sample:
    gpu = GpuReading(index=3, uuid="GPU-b", used_bytes=30 * GIB, total_bytes=80 * GIB, free_bytes=50 * GIB,
                     utilization_pct=97, processes=(ProcessGpuReading(pid=4242, gpu_bytes=29 * GIB),))
    other = GpuReading(index=0, uuid="GPU-a", used_bytes=1 * GIB, total_bytes=80 * GIB, free_bytes=79 * GIB)
    reading = AllocatorReading(device=0, allocated_bytes=20 * GIB, reserved_bytes=25 * GIB, active_bytes=21 * GIB,
                               inactive_split_bytes=GIB, peak_allocated_bytes=24 * GIB, num_alloc_retries=2,
                               num_ooms=0, uuid="GPU-b")
    return Sample(time=1.0e9, elapsed_s=12.5, gpus=(other, gpu), allocator=(reading,),
                  host=HostReading(rss_bytes=5 * GIB, system_used_bytes=100 * GIB), watched_pids=frozenset({4242}),
                  step=40, phase="train", tokens=4096, extra={"rank": 2})


def test_a_rank_row_travels_whole_and_comes_back_as_the_same_log_row() -> None:
    sent = _sample()
    numbers = row_numbers(sent, rank=2)
    assert len(numbers) == len(GATHER_FIELDS)
    values = dict(zip(GATHER_FIELDS, numbers, strict=True))
    assert values["gpu"] == 3  # its own GPU, matched by UUID, not the first one listed
    assert values["process_bytes"] == 29 * GIB
    received = row_sample(values, own=Sample(time=2.0e9, elapsed_s=99.0, phase="eval"))
    (row,) = sample_rows(received)
    (expected,) = [r for r in sample_rows(sent) if r["gpu"] == 3]
    for name in ("step", "tokens", "rank", "gpu", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
                 "device_used_bytes", "device_total_bytes", "process_bytes", "host_rss_bytes"):
        assert row[name] == expected[name], name
    assert (row["phase"], received.time) == ("eval", 2.0e9)  # stamped with rank 0's moment, taken at the same step


def test_unknown_values_stay_unknown_on_the_wire() -> None:
    bare = Sample(time=0.0, elapsed_s=0.0, step=7, extra={"rank": 1})
    values = dict(zip(GATHER_FIELDS, row_numbers(bare, rank=1), strict=True))
    assert values["allocated_bytes"] == -1 and values["gpu"] == -1
    back = row_sample(values, own=bare)
    assert back.allocator == () and back.gpus == () and back.host.rss_bytes is None
    assert (back.step, back.extra) == (7, {"rank": 1})


def test_the_history_is_bounded_and_still_spans_the_whole_run() -> None:
    history = RowHistory(256, ("step",))
    for step in range(100_000):
        history.add((step,))
    steps = history.as_columns()["step"]
    assert len(history) == len(steps) <= 256
    assert steps[-128:] == list(range(100_000 - 128, 100_000))  # the newest half as they are
    assert steps[0] < 1_000  # the oldest part of the run is still represented
    archive = steps[:-128]
    gaps = [b - a for a, b in itertools.pairwise(archive)]
    assert max(gaps) <= 2 * min(gaps)  # evenly thinned


def test_the_analysis_waits_for_rows_time_and_its_own_cost() -> None:
    now = [0.0]
    pacer = AnalysisPacer(every=3, min_interval_s=2.0, max_share=0.01, clock=lambda: now[0])
    assert [pacer.due() for _ in range(3)] == [False, False, True]
    now[0] += 0.5  # the analysis took 0.5 s: the next one only after 50 s (1% of the wall time)
    pacer.ran()
    now[0] += 10.0
    assert not any(pacer.due() for _ in range(10))
    now[0] += 41.0
    assert pacer.due()


def test_the_live_rows_keep_what_the_analysis_and_the_figures_read() -> None:
    import dataclasses

    live = LiveRows(256)
    step = _sample()
    live.record(step)
    between = dataclasses.replace(step, step=None, allocator=(), host=HostReading(rss_bytes=9 * GIB,
                                  system_total_bytes=512 * GIB))
    live.record(between, background=True)
    columns, has_gpu, system_total = live.columns()
    # The step's row is its own GPU's; the background sample, without the allocator, is a row per GPU.
    assert len(live) == 3 and columns["step"] == [40, None, None] and columns["gpu"] == [3, 0, 3]
    assert has_gpu and system_total == 512 * GIB
    assert live.latest is step and live.logged == 1  # a background sample is for the analysis only
    assert live.figures(reset=True) == (step, 24 * GIB)  # the step's allocator peak, not the background RSS
    assert live.figures(reset=False) == (step, None)  # reset: the next peak starts afresh


def test_the_step_window_covers_the_steps_since_the_last_row() -> None:
    window = StepWindow()
    window.batch(512, (2, 256))
    window.step_done(1, None)
    window.batch(300, (1, 300))
    window.step_done(2, 100)
    assert (window.last_step, window.pending, window.tokens) == (2, True, 512)  # the largest batch since the row
    assert (window.batch_tokens, window.batch_shape) == (300, (1, 300))  # the batch an OOM report names
    window.logged()
    assert (window.pending, window.tokens, window.last_step, window.batch_tokens) == (False, None, 2, 300)
