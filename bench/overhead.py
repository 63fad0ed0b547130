"""What watching memory costs a real QLoRA fine-tune: step time with each monitor, side by side.

One model (Llama-2-7B architecture, random weights, the QLoRA reference recipe from
``vramscope.tune.qlora``: NF4, LoRA on every linear layer, gradient checkpointing, paged AdamW)
is built once and trained on random tokens (batch 4 x 1024 tokens by default). The monitors ("arms"):

- ``none``: the baseline.
- ``hf_callback``: ``vramscope.integrations.hf.MemoryMonitorCallback(every_n_steps=1)``, driven through
  transformers' own ``CallbackHandler`` with real ``TrainingArguments``/``TrainerState``, events in the
  order ``Trainer`` fires them.
- ``loop_monitor``: ``vramscope.MemoryMonitor(every_n_steps=1)`` with ``mon.step(i)``.
- ``run_10hz``: what ``vramscope run --interval 0.1`` runs for its child: a background ``Sampler`` with
  NVML + host backends, the CSV sink and the peak tracker, here in the training process itself (so it
  also competes for the GIL, which a separate ``vramscope run`` process does not: an upper bound).
- ``hf_memory_tracker``: transformers' ``TrainerMemoryTracker`` (``skip_memory_metrics=False``), started
  and stopped around the steps as ``Trainer.train`` does.
- ``nvidia_smi_every_step``: ``nvidia-smi --query-gpu=memory.used --format=csv`` in a subprocess after
  every step, as many training scripts do.

Arms run in interleaved blocks (a Williams design: each arm follows every other equally often). Each
block runs every arm for one untimed settling step (an arm's start may empty the allocator cache) and
then ``--steps-per-block`` timed steps; warm-up steps before the first block are excluded. Every step is
timed between two ``cuda.synchronize()``; the step's loss is read with ``float()`` before the monitor
runs, so the GPU is idle while the monitor works and its whole cost shows in the step time (in a real
Trainer the host runs ahead and part of it is hidden: these numbers are an upper bound).

The cost is also timed directly, free of the step time's noise (a block's median step moves by about
+-1 % on its own, more than the goal): ``perf_counter`` around each of an arm's hooks inside the step
(``before_step``, ``pre_optimizer``, ``post_optimizer``, ``after_step``: the callback's events, the loop's
``mon.step``, nvidia-smi's subprocess) gives every step's ``hook_seconds``, and per arm the median, p95 and
max of it and ``hook_pct_of_step`` (the median hook time over the baseline's median step). It leaves out
what an arm costs outside its hooks: the callback's forward pre-hook (a read of the batch's shape, inside
the model's forward) and, for ``run_10hz``, everything: its sampler is a background thread, so its hook
time is ~0 and the step-time ratio remains its measure (its thread takes the GIL from the training's).

Writes ``overhead.json``: every step (with its ``hook_seconds`` and ``hook_cpu_seconds``, the thread's CPU
time in the hooks: far below the wall time, the thread waited), per-arm median and spread,
``step_time_overhead_pct`` per arm against the baseline of the same run (the ratio of mean step times: a run's
wall time is the sum of its steps) with its 95 % CI (steps resampled within blocks; and whole blocks resampled,
``..._by_block``), the medians' ratio beside it, and
``hook_seconds`` / ``hook_cpu_seconds`` / ``hook_pct_of_step`` per arm.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

ARMS = ("none", "hf_callback", "loop_monitor", "run_10hz", "hf_memory_tracker", "nvidia_smi_every_step")
GOAL_PCT = 0.5  # the goal for vramscope's own arms; recorded, never asserted
VRAMSCOPE_ARMS = ("hf_callback", "loop_monitor", "run_10hz")


class Unavailable(Exception):
    """An arm that cannot run here (a missing tool or module); recorded with its reason, not fatal."""


class Arm:
    """One way of monitoring. ``start``/``stop`` are untimed; ``before_step``/``after_step`` are timed."""

    name = "none"

    def start(self, block: int) -> None:
        pass

    def before_step(self, step: int) -> None:
        pass

    def pre_optimizer(self) -> None:
        pass

    def post_optimizer(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def stop(self) -> dict[str, Any]:
        """Ends the block's monitoring; returns what it saw (rows logged, samples taken, ...)."""
        return {}


class HfCallbackArm(Arm):
    name = "hf_callback"

    def __init__(self, trainer: Any, logs: Path, batch: int, seq: int) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments
        from transformers.trainer_callback import CallbackHandler

        try:
            from vramscope.integrations.hf import MemoryMonitorCallback
        except ImportError as exc:
            raise Unavailable(f"vramscope.integrations.hf is not importable: {exc}") from exc
        self._callback_cls = MemoryMonitorCallback
        self._handler_cls = CallbackHandler
        self._state_cls = TrainerState
        self._control_cls = TrainerControl
        self._trainer = trainer
        self._logs = logs
        self._batch = batch
        self._tokens = batch * seq
        use_cpu = not common.cuda_available()
        # Real arguments, so the callback sees what a Trainer would give it; no reporting, no files.
        self.args = TrainingArguments(
            output_dir=str(logs / "hf-output"),
            report_to=[],
            disable_tqdm=True,
            per_device_train_batch_size=batch,
            gradient_checkpointing=True,
            bf16=not use_cpu,
            use_cpu=use_cpu,
        )
        self._handler: Any = None
        self._callback: Any = None
        self._log_path: Path | None = None

    def start(self, block: int) -> None:
        self._log_path = self._logs / f"hf_callback-{block}.csv"
        self._callback = self._callback_cls(log=str(self._log_path), every_n_steps=1)
        model, optimizer = self._trainer.model, self._trainer.optimizer
        self._handler = self._handler_cls([self._callback], model, None, optimizer, None)
        self.state = self._state_cls(max_steps=1_000_000, train_batch_size=self._batch)
        self.control = self._control_cls()
        self._handler.on_train_begin(self.args, self.state, self.control)
        self._handler.on_epoch_begin(self.args, self.state, self.control)

    def before_step(self, step: int) -> None:
        self._handler.on_step_begin(self.args, self.state, self.control)

    def pre_optimizer(self) -> None:
        self._handler.on_pre_optimizer_step(self.args, self.state, self.control)

    def post_optimizer(self) -> None:
        self._handler.on_optimizer_step(self.args, self.state, self.control)

    def after_step(self, step: int) -> None:
        # Trainer's order: the step counter moves, then on_step_end.
        self.state.global_step += 1
        self.state.num_input_tokens_seen += self._tokens
        self._handler.on_step_end(self.args, self.state, self.control)

    def stop(self) -> dict[str, Any]:
        self._handler.on_epoch_end(self.args, self.state, self.control)
        self._handler.on_train_end(self.args, self.state, self.control)
        # on_train_end keeps the monitor open (evaluation may follow); close it now so that its forward
        # hook on the shared model does not run during the other arms' steps.
        self._callback.close()
        return {"log_rows": _csv_rows(self._log_path)}


class LoopMonitorArm(Arm):
    name = "loop_monitor"

    def __init__(self, logs: Path) -> None:
        try:
            from vramscope import MemoryMonitor
        except ImportError as exc:
            raise Unavailable(f"vramscope.MemoryMonitor is not importable: {exc}") from exc
        self._cls = MemoryMonitor
        self._logs = logs
        self._monitor: Any = None
        self._log_path: Path | None = None

    def start(self, block: int) -> None:
        self._log_path = self._logs / f"loop_monitor-{block}.csv"
        self._monitor = self._cls(log=str(self._log_path), every_n_steps=1)
        self._monitor.__enter__()

    def after_step(self, step: int) -> None:
        self._monitor.step(step)

    def stop(self) -> dict[str, Any]:
        self._monitor.__exit__(None, None, None)
        return {"log_rows": _csv_rows(self._log_path)}


class RunSamplerArm(Arm):
    """The sampler ``vramscope run`` starts for its child: NVML + host, CSV log, peak tracker."""

    name = "run_10hz"

    def __init__(self, logs: Path, interval: float) -> None:
        self._logs = logs
        self._interval = interval
        self._sampler: Any = None
        self._started = 0.0

    def start(self, block: int) -> None:
        from vramscope.backends.host import HostBackend
        from vramscope.backends.nvml import NvmlBackend
        from vramscope.logs.sinks import CsvSink
        from vramscope.sampling.peaks import PeakTracker
        from vramscope.sampling.sampler import Collector, Sampler

        self._log_path = self._logs / f"run_10hz-{block}.csv"
        collector = Collector(nvml=NvmlBackend(), host=HostBackend())
        self._nvml = collector.nvml
        self._sampler = Sampler(collector, [CsvSink(self._log_path), PeakTracker()], interval=self._interval)
        self._sampler.sample_now()  # run_monitored takes one before starting the thread
        self._started = time.perf_counter()
        self._sampler.start()

    def stop(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self._started
        self._sampler.close()
        taken = self._sampler.samples_taken
        gpus = self._nvml.device_count() if self._nvml is not None else 0
        if self._nvml is not None:
            self._nvml.close()
        return {
            "samples": taken,
            "seconds": seconds,
            "rate_hz": taken / seconds if seconds > 0 else None,
            "nvml_gpus": gpus,
            "log_rows": _csv_rows(self._log_path),
        }


class HfMemoryTrackerArm(Arm):
    name = "hf_memory_tracker"

    def __init__(self) -> None:
        from transformers.trainer_utils import TrainerMemoryTracker

        self._tracker = TrainerMemoryTracker(skip_memory_metrics=False)
        if self._tracker.skip_memory_metrics:
            raise Unavailable("TrainerMemoryTracker skips itself here (psutil is missing)")
        # Trainer.__init__ tracks an "init" stage first; its figures go into the first train metrics.
        # Called from a method named __init__: the tracker derives its stage from its caller's name.
        self._tracker.start()
        self._tracker.stop_and_update_metrics()

    def start(self, block: int) -> None:
        train(self._tracker, start=True)

    def stop(self) -> dict[str, Any]:
        return {"metrics": train(self._tracker, start=False)}


def train(tracker: Any, start: bool) -> dict[str, Any]:
    """Starts or stops ``tracker`` as ``Trainer.train`` does. Named ``train`` on purpose: the tracker
    derives its stage from the name of the function that calls it and refuses any other name."""
    if start:
        tracker.start()
        return {}
    metrics: dict[str, Any] = {}
    tracker.stop_and_update_metrics(metrics)
    return metrics


class NvidiaSmiArm(Arm):
    name = "nvidia_smi_every_step"

    def __init__(self, uuid: str | None) -> None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            raise Unavailable("nvidia-smi is not on PATH")
        self._argv = [exe, "--query-gpu=memory.used", "--format=csv", *common.nvidia_smi_query_args(uuid)]
        self._last: str | None = None
        self._failures = 0

    def after_step(self, step: int) -> None:
        done = subprocess.run(self._argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            self._failures += 1
        self._last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None

    def stop(self) -> dict[str, Any]:
        return {"last_output": self._last, "failures": self._failures}


def _csv_rows(path: Path | None) -> int | None:
    if path is None or not path.is_file():
        return None
    with path.open(encoding="utf-8") as handle:
        return max(0, sum(1 for _ in handle) - 1)


class HookClock:
    """Time spent inside an arm's hooks during one step: wall (``perf_counter``) and this thread's CPU
    (``thread_time``) around each call. The wall time is the cost; where it is far above the CPU time the
    thread waited (for the GIL, for I/O, or for a core on a busy host)."""

    def __init__(self, arm: Arm) -> None:
        self.arm = arm
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def call(self, hook: Any, *args: Any) -> None:
        cpu = time.thread_time()
        started = time.perf_counter()
        try:
            hook(*args)
        finally:
            self.seconds += time.perf_counter() - started
            self.cpu_seconds += time.thread_time() - cpu


def train_step(trainer: Any, clock: HookClock, batch: int, seq: int) -> float:
    """One step of the shared trainer with the optimizer step split out, so that a callback receives
    on_pre_optimizer_step / on_optimizer_step as under Trainer. Same work as qlora.Trainer.step."""
    ids = trainer.batch(batch, seq)
    out = trainer.model(input_ids=ids, labels=ids)
    out.loss.backward()
    clock.call(clock.arm.pre_optimizer)
    trainer.optimizer.step()
    clock.call(clock.arm.post_optimizer)
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(out.loss.detach())


def timed_step(trainer: Any, arm: Arm, step: int, batch: int, seq: int) -> tuple[float, float, HookClock]:
    """(step seconds, loss, the time inside the arm's hooks) of one step."""
    clock = HookClock(arm)
    common.synchronize()
    started = time.perf_counter()
    clock.call(arm.before_step, step)
    loss = train_step(trainer, clock, batch, seq)
    clock.call(arm.after_step, step)
    common.synchronize()
    return time.perf_counter() - started, loss, clock


def hook_fields(clock: HookClock) -> dict[str, float]:
    """A step's hook times, as its entry in ``steps`` carries them."""
    return {"hook_seconds": clock.seconds, "hook_cpu_seconds": clock.cpu_seconds}


def make_arms(
    names: list[str], trainer: Any, logs: Path, args: argparse.Namespace
) -> tuple[dict[str, Arm], dict[str, str]]:
    arms: dict[str, Arm] = {}
    unavailable: dict[str, str] = {}
    uuid = common.device_uuid() if common.cuda_available() else None
    factories = {
        "none": Arm,
        "hf_callback": lambda: HfCallbackArm(trainer, logs, args.batch, args.seq),
        "loop_monitor": lambda: LoopMonitorArm(logs),
        "run_10hz": lambda: RunSamplerArm(logs, args.interval),
        "hf_memory_tracker": HfMemoryTrackerArm,
        "nvidia_smi_every_step": lambda: NvidiaSmiArm(uuid),
    }
    for name in names:
        try:
            arms[name] = factories[name]()
        except Unavailable as exc:
            unavailable[name] = str(exc)
            common.log(f"arm {name}: unavailable ({exc})")
        except Exception as exc:  # an API that changed under us: measure the others, say why not this one
            unavailable[name] = f"could not be set up: {type(exc).__name__}: {exc}"
            common.log(f"arm {name}: {unavailable[name]}")
    return arms, unavailable


def cuda_peaks(reset: bool) -> dict[str, int]:
    """torch's peak counters (empty without CUDA); ``reset`` starts them afresh instead of reading."""
    if not common.cuda_available():
        return {}
    import torch

    if reset:
        torch.cuda.reset_peak_memory_stats()
        return {}
    return {
        "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def analysis_cost(histories: list[int], repeats: int, step_s: float | None) -> dict[str, Any]:
    """What MemoryMonitor's periodic leak test and forecast cost, on histories of the given lengths.

    The analysis runs in the training thread every ``analyze_every`` logged rows (and at most every
    ``analyze_min_interval_s``), so the short interleaved blocks above never reach it; it is timed here
    on a filled history instead and amortised over the steps between two analyses.
    """
    try:
        from vramscope import MemoryMonitor
    except ImportError as exc:
        return {"available": False, "reason": f"vramscope.MemoryMonitor is not importable: {exc}"}
    defaults = MemoryMonitor().settings  # the monitor's options live in its MonitorSettings
    every = int(getattr(defaults, "analyze_every", 0) or 0)
    min_interval = float(getattr(defaults, "analyze_min_interval_s", 0.0) or 0.0)
    if not hasattr(MemoryMonitor, "update_analysis") or every < 1:
        return {"available": False, "reason": "MemoryMonitor has no update_analysis/analyze_every"}
    # No log file, no printed warnings, and the periodic analysis off: it runs only when timed here.
    monitor = MemoryMonitor(log=None, every_n_steps=1, warn=False, analyze_every=10**9)
    by_history = []
    with monitor:
        step = 0
        for target in sorted(histories):
            while monitor.rows_logged < target:
                monitor.step(step)
                step += 1
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                monitor.update_analysis()
                seconds.append(time.perf_counter() - started)
            by_history.append({"rows": monitor.rows_logged, "seconds": seconds, "median_s": statistics.median(seconds)})
    result: dict[str, Any] = {
        "available": True,
        "analyze_every": every,
        "analyze_min_interval_s": min_interval,
        "by_history": by_history,
    }
    if step_s and by_history:
        worst = by_history[-1]["median_s"]
        steps_between = max(every, min_interval / step_s)
        result["amortized_pct_of_step"] = worst / steps_between / step_s * 100
        result["steps_between_analyses"] = steps_between
    return result


def analyse(steps: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """Each arm against the baseline. The headline is the ratio of mean step times: a run's wall time is the sum
    of its steps, so the mean is what a monitor costs the user (the step times are bimodal, two clock states about
    1.3 % apart, and a median jumps between the modes: its interval is twice as wide for the same steps). The
    medians' ratio is kept beside it, as earlier runs reported."""
    timed = [s for s in steps if s["kind"] == "timed"]
    by_arm = {a: [s["seconds"] for s in timed if s["arm"] == a] for a in arms}
    summaries = {a: common.summarize(v) for a, v in by_arm.items()}
    base = summaries["none"]["mean"]
    base_median = summaries["none"]["median"]
    blocks = sorted({s["block"] for s in timed})
    result: dict[str, Any] = {
        "step_seconds": summaries,
        "estimator": "ratio of mean step times; CI: bootstrap of the steps within each block",
        "step_time_overhead_pct": {},
        "step_time_overhead_ci95_pct": {},
        "step_time_overhead_ci95_by_block_pct": {},
        "median_step_time_overhead_pct": {},
        "median_step_time_overhead_ci95_pct": {},
        "per_block_overhead_pct": {},
    }
    for arm in arms:
        mean = summaries[arm]["mean"]
        if arm == "none" or mean is None or not base:
            continue
        result["step_time_overhead_pct"][arm] = (mean / base - 1) * 100
        mine = {b: [s["seconds"] for s in timed if s["arm"] == arm and s["block"] == b] for b in blocks}
        theirs = {b: [s["seconds"] for s in timed if s["arm"] == "none" and s["block"] == b] for b in blocks}
        # Each block's arm against the baseline of the same block: drift between blocks cancels out.
        result["per_block_overhead_pct"][arm] = [
            (statistics.fmean(mine[b]) / statistics.fmean(theirs[b]) - 1) * 100
            for b in blocks
            if mine[b] and theirs[b]
        ]
        result["step_time_overhead_ci95_pct"][arm] = common.ratio_ci_pct(mine, theirs, statistic=statistics.fmean)
        result["step_time_overhead_ci95_by_block_pct"][arm] = common.ratio_ci_pct(
            mine, theirs, statistic=statistics.fmean, by_block=True)
        if summaries[arm]["median"] is not None and base_median:
            result["median_step_time_overhead_pct"][arm] = (summaries[arm]["median"] / base_median - 1) * 100
            result["median_step_time_overhead_ci95_pct"][arm] = common.ratio_ci_pct(mine, theirs)
    # The baseline against itself, block to block: the smallest difference this run could resolve.
    base_blocks = [
        statistics.median([s["seconds"] for s in timed if s["arm"] == "none" and s["block"] == b])
        for b in blocks
        if any(s["arm"] == "none" and s["block"] == b for s in timed)
    ]
    if len(base_blocks) > 1 and base:
        spread = [abs(x / statistics.median(base_blocks) - 1) * 100 for x in base_blocks]
        result["baseline_block_spread_pct"] = statistics.median(spread)
    result.update(hook_cost(timed, arms, base_median))
    return result


def hook_cost(timed: list[dict[str, Any]], arms: list[str], base_step_s: float | None) -> dict[str, Any]:
    """The arms' own time inside their hooks, per timed step: ``hook_seconds`` (median, p95, max, ...) per arm
    (the baseline's is the floor: four empty calls and the clock) and ``hook_pct_of_step``, the median hook
    time as a share of the baseline's median step. ~0 for ``run_10hz``: its work is on a thread."""
    seconds: dict[str, Any] = {}
    cpu: dict[str, Any] = {}
    pct: dict[str, float] = {}
    for arm in arms:
        mine = [s for s in timed if s["arm"] == arm and s.get("hook_seconds") is not None]
        if not mine:
            continue
        values = sorted(s["hook_seconds"] for s in mine)
        seconds[arm] = {**common.summarize(values), "p95": _quantile(values, 0.95)}
        cpu_values = sorted(s["hook_cpu_seconds"] for s in mine)
        cpu[arm] = {**common.summarize(cpu_values), "p95": _quantile(cpu_values, 0.95)}
        if arm != "none" and base_step_s:
            pct[arm] = statistics.median(values) / base_step_s * 100
    return {"hook_seconds": seconds, "hook_cpu_seconds": cpu, "hook_pct_of_step": pct}


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated between the two nearest (numpy's default)."""
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def hook_line(analysis: dict[str, Any], arm: str) -> str:
    """The arm's time inside its hooks, for the final log line."""
    hooks = analysis["hook_seconds"].get(arm)
    if hooks is None:
        return "hooks not timed"
    pct = analysis["hook_pct_of_step"].get(arm)
    pct_text = f" = {pct:.3f} % of a step" if pct is not None else ""
    thread = " (its sampler is a thread: the step time is its measure)" if arm == "run_10hz" else ""
    cpu = analysis["hook_cpu_seconds"][arm]["median"]
    return (
        f"hooks median {hooks['median'] * 1e6:.0f} us (CPU {cpu * 1e6:.0f} us), p95 {hooks['p95'] * 1e6:.0f} us, "
        f"max {hooks['max'] * 1e6:.0f} us{pct_text}{thread}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", default="Llama-2-7B", help="planner registry name (default Llama-2-7B)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default 4; 2 with --tiny)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 1024; 32 with --tiny)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps before the first block (default 4)")
    parser.add_argument(
        "--steps-per-block", type=int, default=None, help="timed steps per arm and block (default 3; 1 with --tiny)"
    )
    parser.add_argument("--settle", type=int, default=1, help="untimed steps after each arm starts (default 1)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds for the interleaved blocks; the block count follows from the warm-up's step time (default 90)",
    )
    parser.add_argument("--min-blocks", type=int, default=None, help="at least this many blocks (default 3)")
    parser.add_argument("--max-blocks", type=int, default=24)
    parser.add_argument("--interval", type=float, default=0.1, help="run_10hz's sampling interval (default 0.1 s)")
    parser.add_argument(
        "--checkpoint-root",
        type=Path,
        default=None,
        help="where the random checkpoint is written and reused (default /dev/shm/vramscope-bench)",
    )
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.batch = args.batch or (2 if tiny else 4)
    args.seq = args.seq or (32 if tiny else 1024)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 4)
    args.steps_per_block = args.steps_per_block or (1 if tiny else 3)
    args.budget_s = args.budget_s if args.budget_s is not None else (0.0 if tiny else 90.0)
    args.min_blocks = args.min_blocks or (2 if tiny else 3)
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown or "none" not in names:
        print(
            f"overhead.py: --arms must include 'none' and name only {', '.join(ARMS)}; got {args.arms}", file=sys.stderr
        )
        return 2
    if not tiny and not common.cuda_available():
        print("overhead.py: no CUDA device; run with --tiny on a CPU", file=sys.stderr)
        return 2

    started = time.perf_counter()
    config = common.model_config(args.model, tiny)
    common.log(f"building {args.model}{' (tiny)' if tiny else ''} QLoRA trainer")
    trainer, model_info = common.build_qlora_trainer(config, tiny, args.checkpoint_root)
    common.log(
        f"model ready: checkpoint {model_info['checkpoint_write_s']:.1f} s "
        f"({'reused' if model_info['checkpoint_reused'] else 'written'}), load {model_info['load_s']:.1f} s"
    )

    logs = Path(tempfile.mkdtemp(prefix="vramscope-overhead-"))
    arms, unavailable = make_arms(names, trainer, logs, args)
    active = [a for a in names if a in arms]

    steps: list[dict[str, Any]] = []
    baseline = arms["none"]
    # Peaks of the training alone; later, monitors (and transformers' tracker) reset the counter.
    warm_memory = cuda_peaks(reset=True)
    for _ in range(args.warmup):
        seconds, loss, hooks = timed_step(trainer, baseline, -1, args.batch, args.seq)
        steps.append(
            {"block": None, "arm": "none", "kind": "warmup", "seconds": seconds, "loss": loss, **hook_fields(hooks)}
        )
    warm_memory = cuda_peaks(reset=False)
    warm = [s["seconds"] for s in steps[-2:]] or [0.0]
    per_block_steps = len(active) * (args.settle + args.steps_per_block)
    # Every arm adds its own cost; nvidia-smi's subprocess can add tens of ms, hence the 15 % margin.
    estimate = statistics.median(warm) * per_block_steps * 1.15
    blocks = args.min_blocks if estimate <= 0 else int(args.budget_s // estimate)
    blocks = max(args.min_blocks, min(args.max_blocks, blocks))
    common.log(f"warm-up step {statistics.median(warm):.3f} s; {blocks} blocks of {per_block_steps} steps")

    arm_reports: dict[str, list[dict[str, Any]]] = {a: [] for a in active}
    failed: dict[str, str] = {}
    step_index = 0
    orders = common.block_orders(active, blocks)
    for block, order in enumerate(orders):
        for position, name in enumerate(order):
            if name in failed:
                continue
            arm = arms[name]
            try:
                arm.start(block)
                for k in range(args.settle + args.steps_per_block):
                    seconds, loss, hooks = timed_step(trainer, arm, step_index, args.batch, args.seq)
                    steps.append(
                        {
                            "block": block,
                            "arm": name,
                            "position": position,
                            "step": step_index,
                            "kind": "settle" if k < args.settle else "timed",
                            "seconds": seconds,
                            "loss": loss,
                            **hook_fields(hooks),
                        }
                    )
                    step_index += 1
                report = arm.stop()
            except Exception as exc:
                # Device time is scarce: one broken monitor must not cost the other arms' measurements.
                failed[name] = f"failed in block {block}: {type(exc).__name__}: {exc}"
                common.log(f"arm {name} {failed[name]}; leaving it out")
                with contextlib.suppress(Exception):
                    arm.stop()
                continue
            # A monitor that left a forward hook on the shared model would tax every later arm's steps.
            report["forward_pre_hooks_left"] = len(getattr(trainer.model, "_forward_pre_hooks", {}))
            arm_reports[name].append({"block": block, **report})
        done = [s for s in steps if s["block"] == block and s["kind"] == "timed"]
        common.log(
            f"block {block + 1}/{blocks}: "
            + ", ".join(
                f"{a} {statistics.median([s['seconds'] for s in done if s['arm'] == a]):.3f}"
                for a in active
                if a not in failed
            )
        )
    for name in failed:
        # A partly measured arm is no measurement: its steps stay in the file, marked, out of the analysis.
        for s in steps:
            if s["arm"] == name:
                s["kind"] = "failed_arm"
        unavailable[name] = failed[name]
    active = [a for a in active if a not in failed]

    analysis = analyse(steps, active)
    base_step = analysis["step_seconds"]["none"]["median"]
    common.log("timing MemoryMonitor's periodic analysis")
    histories = [64, 256] if tiny else [256, 1024, 8192]
    try:
        analysis["monitor_analysis_cost"] = analysis_cost(histories, 3 if tiny else 5, base_step)
    except Exception as exc:  # measured after the blocks: never lose them to it
        analysis["monitor_analysis_cost"] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    payload = {
        "description": "step time of a QLoRA fine-tune under each memory monitor, interleaved blocks",
        "model": {"name": args.model, **model_info},
        "batch": args.batch,
        "seq_len": args.seq,
        "arms": active,
        "unavailable": unavailable,
        "protocol": {
            "warmup_steps": args.warmup,
            "settle_steps": args.settle,
            "timed_steps_per_block": args.steps_per_block,
            "blocks": blocks,
            "orders": orders,
            "run_interval_s": args.interval,
            "timing": "perf_counter between cuda.synchronize() calls; loss read before the monitor runs",
            "hook_timing": "perf_counter (hook_seconds) and thread_time (hook_cpu_seconds) around each of the "
            "arm's calls inside the step (before_step, pre_optimizer, post_optimizer, after_step), summed per step",
        },
        "goal_pct": GOAL_PCT,
        **analysis,
        "within_goal": {
            a: (ci is not None and ci[1] < GOAL_PCT)
            for a, ci in analysis["step_time_overhead_ci95_pct"].items()
            if a in VRAMSCOPE_ARMS
        },
        "arm_reports": arm_reports,
        "warmup_cuda_memory": warm_memory,
        "steps": steps,
        "wall_s": time.perf_counter() - started,
    }
    path = common.write_result(common.out_dir(args), "overhead", payload, tiny)
    shutil.rmtree(logs, ignore_errors=True)
    for arm, pct in analysis["step_time_overhead_pct"].items():
        ci = analysis["step_time_overhead_ci95_pct"].get(arm)
        ci_text = f" (95% CI {ci[0]:+.2f} .. {ci[1]:+.2f})" if ci else ""
        common.log(f"{arm}: {pct:+.2f} %{ci_text}; {hook_line(analysis, arm)}")
    common.log(f"wrote {path} in {payload['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
