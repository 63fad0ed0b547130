"""MemoryMonitor in real training loops: rows, phases, tokens, ranks, warnings, and what it saves.

On this CPU the monitor reads host memory (no CUDA allocator); NVML is faked at its boundary only
where a test needs GPU rows. The tests marked ``gpu`` check the allocator's exact per-step peak on a
real GPU.
"""

from __future__ import annotations

import io
import json
import mmap
from pathlib import Path

import pytest

import fake_nvml
from vramscope.analysis.alerts import read_warnings
from vramscope.analysis.summary import analyze
from vramscope.integrations.loop import MemoryMonitor, batch_tokens, rank_path
from vramscope.logs.files import LogPathError
from vramscope.logs.reader import read_log

MIB = 1024 * 1024
torch = pytest.importorskip("torch")


def tiny_model() -> tuple[object, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model: object, opt: object, batch: int, length: int) -> None:
    ids = torch.randint(0, 64, (batch, length))
    loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))  # type: ignore[operator]
    loss.backward()
    opt.step()  # type: ignore[attr-defined]
    opt.zero_grad()  # type: ignore[attr-defined]


class HostLeak:
    """Keeps ``size`` bytes of fresh, written anonymous memory per call: RSS grows by exactly that.

    (A list of tensors would reuse memory that glibc already holds from earlier tests, and the RSS
    of this long-lived pytest process would not move.)
    """

    def __init__(self) -> None:
        self.kept: list[mmap.mmap] = []

    def __call__(self, size: int) -> None:
        block = mmap.mmap(-1, size)
        block.write(b"\x01" * size)
        self.kept.append(block)

    def close(self) -> None:
        for block in self.kept:
            block.close()


def test_rows_carry_step_phase_tokens_and_rank(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    model, opt = tiny_model()
    with MemoryMonitor(log=log, every_n_steps=3, warn=False) as mon:
        mon.watch_model(model)
        for step in range(1, 13):
            train_step(model, opt, batch=2, length=5 + step)  # tokens grow: 2 x (5 + step)
            mon.step(step)
            if step == 6:
                with mon.phase("eval"), torch.no_grad():
                    model(torch.randint(0, 64, (4, 30)))  # type: ignore[operator]
    table = read_log(log)
    phases = table.strings("phase")
    steps = table.ints("step")
    tokens = table.ints("tokens")
    assert phases[0] == "start" and steps[0] is None
    train = [(s, t) for s, p, t in zip(steps, phases, tokens, strict=True) if p == "train"]
    # One row per 3 steps; its tokens are the largest batch since the previous row.
    assert train == [(3, 16), (6, 22), (9, 28), (12, 34)]
    eval_rows = [i for i, p in enumerate(phases) if p == "eval"]
    assert len(eval_rows) == 1 and steps[eval_rows[0]] == 6 and tokens[eval_rows[0]] == 120
    assert set(table.ints("rank")) == {0}
    assert all(v is not None and v > 0 for v in table.ints("host_rss_bytes"))


def test_steps_left_over_are_logged_at_close(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    with MemoryMonitor(log=log, every_n_steps=10, warn=False) as mon:
        for step in range(1, 14):
            mon.step(step)
    assert [s for s in read_log(log).ints("step") if s is not None] == [10, 13]


def test_a_planted_leak_is_warned_once_saved_beside_the_log_and_analysed(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    stream = io.StringIO()
    leak = HostLeak()
    try:
        with MemoryMonitor(log=log, analyze_every=10, analyze_min_interval_s=0, analyze_max_share=1.0,
                           warn_stream=stream) as mon:
            for step in range(1, 121):
                if step >= 30:
                    leak(2 * MIB)
                mon.step(step)
            live = mon.analysis()
            first_warning_step = mon.alerts.history[0].step if mon.alerts and mon.alerts.history else None
    finally:
        leak.close()
    assert first_warning_step is not None and 30 < first_warning_step < 120  # while training, not at the end
    printed = [line for line in stream.getvalue().splitlines() if "leak:" in line]
    assert len(printed) == 1, stream.getvalue()  # throttled: one line, not one per analysis
    assert printed[0].startswith("vramscope: step ")
    saved = read_warnings(tmp_path / "mem.warnings.jsonl")
    assert saved[0].kind == "leak" and saved[0].step is not None and saved[0].step >= 30
    assert live["leak"]["detected"] is True
    assert live["leak"]["slope_bytes_per_step"] == pytest.approx(2 * MIB, rel=0.25)
    assert abs(live["leak"]["start_step"] - 30) <= 15
    from_file = json.loads((tmp_path / "mem.analysis.json").read_text())
    assert from_file["leak"]["detected"] is True
    # The same verdict from the log on disk, as `vramscope report` would compute it.
    assert analyze(read_log(log)).to_json()["leak"]["detected"] is True


def test_a_clean_loop_raises_no_warning(tmp_path: Path) -> None:
    stream = io.StringIO()
    model, opt = tiny_model()
    with MemoryMonitor(log=tmp_path / "mem.csv", analyze_every=10, analyze_min_interval_s=0, analyze_max_share=1.0,
                       warn_stream=stream) as mon:
        for step in range(1, 81):
            train_step(model, opt, batch=2, length=8 + step % 7)
            mon.step(step)
    assert stream.getvalue() == ""
    assert not (tmp_path / "mem.warnings.jsonl").exists()
    assert mon.last_analysis is not None and mon.last_analysis["leak"]["detected"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": 0}, "every_n_steps must be a whole number of at least 1"),
        ({"every_n_steps": 2.5}, "every_n_steps must be a whole number"),
        ({"interval": 0.001}, "interval must be at least"),
    ],
)
def test_bad_arguments_say_what_to_do(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryMonitor(**kwargs)  # type: ignore[arg-type]


def test_a_log_in_a_missing_folder_fails_before_training(tmp_path: Path) -> None:
    with pytest.raises(LogPathError, match="does not exist; create it first"):
        MemoryMonitor(log=tmp_path / "nope" / "mem.csv").start()


def test_each_rank_writes_its_own_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    with MemoryMonitor(log=tmp_path / "mem.csv", warn=False) as mon:
        mon.step(1)
    assert mon.log_path == str(tmp_path / "mem.rank2.csv")
    assert not (tmp_path / "mem.csv").exists()
    assert set(read_log(tmp_path / "mem.rank2.csv").ints("rank")) == {2}
    assert rank_path("a/b.jsonl", 0) == "a/b.jsonl"


def test_gpu_rows_come_from_nvml(tmp_path: Path) -> None:
    nvml = fake_nvml.two_healthy_gpus()
    with MemoryMonitor(log=tmp_path / "mem.csv", nvml=nvml, warn=False) as mon:
        for step in range(1, 4):
            mon.step(step)
    table = read_log(tmp_path / "mem.csv").select(phase="train")
    assert table.ints("step") == [1, 1, 2, 2, 3, 3]
    assert table.ints("gpu") == [0, 1, 0, 1, 0, 1]
    assert table.ints("device_total_bytes") == [g.total for g in nvml.gpus] * 3


def test_background_sampling_adds_rows_between_steps(tmp_path: Path) -> None:
    import time

    with MemoryMonitor(log=tmp_path / "mem.csv", interval=0.05, warn=False) as mon:
        for step in range(1, 4):
            time.sleep(0.15)
            mon.step(step)
    table = read_log(tmp_path / "mem.csv")
    between = [p for s, p in zip(table.ints("step"), table.strings("phase"), strict=True) if s is None and p != "start"]
    assert len(between) >= 3 and set(between) == {"train"}
    assert [s for s in table.ints("step") if s is not None] == [1, 2, 3]


def test_figures_for_a_trainers_logs(tmp_path: Path) -> None:
    with MemoryMonitor(warn=False) as mon:
        mon.step(1)
        figures = mon.figures()
    assert figures["mem/host_rss_gib"] > 0
    assert figures["mem/peak_rss_gib"] >= figures["mem/host_rss_gib"] * 0.5
    assert "mem/leak_mib_per_step" not in figures  # no leak: absent, not 0


def test_prometheus_gets_the_samples_and_the_analysis(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    leak = HostLeak()
    try:
        with MemoryMonitor(prometheus="127.0.0.1:0", analyze_every=1000, warn=False) as mon:
            for step in range(1, 121):  # host RSS: 50 steps of warm-up are skipped
                leak(2 * MIB)
                mon.step(step)
            mon.update_analysis()
            text = mon.prometheus_sink.exposition().decode()
    finally:
        leak.close()
    assert "vramscope_leak_slope_bytes_per_step" in text
    assert "vramscope_forecast_steps_to_oom" in text


def test_oom_context_names_the_running_step_and_batch(tmp_path: Path) -> None:
    model, opt = tiny_model()
    with MemoryMonitor(warn=False) as mon:
        mon.watch_model(model)
        train_step(model, opt, batch=3, length=7)
        mon.step(41)
        model(torch.randint(0, 64, (5, 9)))  # type: ignore[operator]
        context = mon.oom_context()
    held = context.pop("breakdown")
    assert context == {"step": 42, "last_completed_step": 41, "phase": "train", "tokens": 45,
                       "batch_shape": [5, 9], "rank": 0}
    # what the watched model held, for the post-mortem (no optimizer given: no states counted)
    assert held["trainable_params"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert held["optimizer_states"] == 0


def test_oom_snapshot_without_cuda_is_off_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the GPU test covers it")
    with MemoryMonitor(log=tmp_path / "mem.csv", oom_snapshot=True, warn=False) as mon:
        mon.step(1)
    assert "OOM snapshots are off" in caplog.text


def test_memory_held_for_analysis_is_bounded(tmp_path: Path) -> None:
    with MemoryMonitor(history=256, analyze_every=10_000, warn=False) as mon:
        for step in range(1, 2001):
            mon.step(step)
        assert mon.rows_held() <= 256
        result = mon.analysis()
    assert result["steps"]["first"] < 50  # the start of the run is thinned, not dropped
    assert result["steps"]["last"] == 2000


def test_batch_tokens_reads_shapes_only() -> None:
    assert batch_tokens((), {"input_ids": torch.zeros(4, 128)}) == (512, (4, 128))
    assert batch_tokens((torch.zeros(2, 10),), {}) == (20, (2, 10))
    assert batch_tokens((), {"inputs_embeds": torch.zeros(2, 3, 8)}) == (6, (2, 3))
    assert batch_tokens((), {}) == (None, None)


@pytest.mark.gpu
def test_each_row_has_the_exact_peak_since_the_previous_row(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    with MemoryMonitor(log=log, warn=False) as mon:
        base = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        mon.step(1)
        spike = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")  # freed before the step ends
        del spike
        mon.step(2)
        mon.step(3)
        del base
    table = read_log(log).select(phase="train")
    rows = {s: (a, p) for s, a, p in zip(table.ints("step"), table.ints("allocated_bytes"),
                                         table.ints("peak_allocated_bytes"), strict=True) if a is not None}
    allocated2, peak2 = rows[2]
    assert peak2 - allocated2 >= 256 * MIB  # the spike is in step 2's peak ...
    allocated3, peak3 = rows[3]
    assert peak3 == allocated3  # ... and not in step 3's: the counter was reset


@pytest.mark.gpu
def test_an_allocated_leak_on_the_gpu_is_found(tmp_path: Path) -> None:
    kept = []
    with MemoryMonitor(log=tmp_path / "mem.csv", analyze_every=10_000, warn=False) as mon:
        for step in range(1, 161):
            if step >= 40:
                kept.append(torch.empty(MIB, dtype=torch.uint8, device="cuda"))
            mon.step(step)
        result = mon.analysis()
    assert result["leak"]["signal"] == "allocated_bytes"
    assert result["leak"]["slope_bytes_per_step"] == pytest.approx(MIB, rel=0.05)
    assert abs(result["leak"]["start_step"] - 40) <= 5


def test_warnings_are_throttled_per_kind_repeated_when_worse_and_saved(tmp_path: Path) -> None:
    from vramscope.analysis.alerts import Alerts, warnings_path

    now = [0.0]
    stream = io.StringIO()
    path = warnings_path(tmp_path / "mem.csv")
    alerts = Alerts(path=path, stream=stream, repeat_s=600, clock=lambda: now[0])
    assert alerts.warn("oom", "out of memory in ~1000 steps", step=10, urgency=1000)
    now[0] = 60
    assert not alerts.warn("oom", "out of memory in ~900 steps", step=20, urgency=900)  # not much worse
    assert alerts.warn("leak", "leak: 1 MiB/step", step=20)  # another kind is not throttled by it
    assert alerts.warn("oom", "out of memory in ~400 steps", step=30, urgency=400)  # halved: shown
    now[0] = 700
    assert alerts.warn("leak", "leak: 1 MiB/step", step=40)  # repeated after repeat_s
    alerts.clear("oom")
    assert alerts.warn("oom", "out of memory in ~390 steps", step=41, urgency=390)  # came back: shown at once
    assert alerts.suppressed == 1
    lines = stream.getvalue().splitlines()
    assert lines[0] == "vramscope: step 10: out of memory in ~1000 steps" and len(lines) == 5
    saved = read_warnings(path)
    expected = [("oom", 10), ("leak", 20), ("oom", 30), ("leak", 40), ("oom", 41)]
    assert [(r.kind, r.step) for r in saved] == expected and saved == alerts.history
    assert path == str(tmp_path / "mem.warnings.jsonl")


class TakesAnything(torch.nn.Module):
    """A model whose forward accepts inputs the batch hook cannot measure (a nested tensor has no sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: object) -> object:
        return self.w * 2


def test_a_batch_the_hook_cannot_read_never_reaches_the_users_forward(caplog: pytest.LogCaptureFixture) -> None:
    model = TakesAnything()
    ragged = torch.nested.nested_tensor([torch.zeros(3, dtype=torch.long), torch.zeros(5, dtype=torch.long)])
    with MemoryMonitor(warn=False) as mon:
        mon.watch_model(model)
        with caplog.at_level("WARNING", logger="vramscope"):
            for step in (1, 2):
                assert float(model(ragged)) == 2.0  # type: ignore[arg-type]  # the forward ran, twice
                mon.step(step)
    warned = [r for r in caplog.records if "batch hook failed" in r.getMessage()]
    assert len(warned) == 1  # once, not per step


def test_the_w_and_b_mlflow_recipe_logs_every_logged_step_once(tmp_path: Path) -> None:
    """docs/training.md's recipe, with a stand-in tracker that records what `wandb.log` / `mlflow.log_metrics` get."""
    logged: list[tuple[int, dict[str, float]]] = []

    def tracker_log(metrics: dict[str, float], step: int) -> None:  # wandb.log(..., step=) / mlflow.log_metrics
        logged.append((step, dict(metrics)))

    model, opt = tiny_model()
    with MemoryMonitor(log=tmp_path / "memory_log.csv", warn=False) as mon:
        mon.watch_model(model)
        for step in range(1, 31):
            train_step(model, opt, 2, 8)
            mon.step(step)
            if step % 10 == 0:
                tracker_log({"loss": 1.0, **mon.figures()}, step=step)
        with mon.phase("eval"):
            train_step(model, opt, 4, 16)
        tracker_log({f"eval_{k}": v for k, v in mon.figures().items()}, step=30)
    assert [s for s, _ in logged] == [10, 20, 30, 30]
    for _, metrics in logged[:3]:
        assert metrics["mem/peak_rss_gib"] > 0 and metrics["mem/host_rss_gib"] > 0  # on a CPU: host memory
        assert all(isinstance(v, float) for v in metrics.values())
    assert logged[3][1] and all(k.startswith("eval_mem/") for k in logged[3][1])
