"""Step-aligned memory for a plain training loop: :class:`MemoryMonitor`.

::

    with vramscope.MemoryMonitor(log="memory_log.csv", every_n_steps=10) as mon:
        for step, batch in enumerate(loader):
            loss = model(**batch).loss
            loss.backward(); opt.step(); opt.zero_grad()
            mon.step(step)
            if step % 500 == 0:
                with mon.phase("eval"):
                    evaluate(model)

Each logged step is one row per GPU in the foundation's CSV schema with ``step``, ``phase``, ``tokens``
and ``rank`` filled: the allocator's exact peak since the previous logged row (the peak counter is
reset at every logged row), what stays allocated and reserved after the step, the device's and this
process's memory from NVML, and host RSS. Without CUDA only host memory is known, and the analysis
runs on the RSS.

The hot path is small on purpose: ``step()`` on a step that is not logged is a modulo and two
assignments; a logged step is one ``torch.cuda.memory_stats`` (a host-side read, no device sync),
one NVML query of this process's GPUs and one CSV row. The leak test and the OOM forecast run every
``analyze_every`` logged rows, no more often than every ``analyze_min_interval_s`` seconds, and at
least 200 times their own cost apart (``analyze_max_share``: at most 0.5% of the wall time, however
fast the steps).

Several processes (``torchrun``, ``accelerate``): every rank logs to its own file, rank 0 to ``log`` and
rank *k* to ``<stem>.rank<k><suffix>`` (``memory_log.rank1.csv``; ``rank_logs=False`` turns these off),
and every row carries its ``rank``. When torch.distributed is initialised with more than one rank,
rank 0's log also carries every other rank: at each logged step (``step % every_n_steps == 0``) the
ranks exchange one row each, a fixed-size int64 tensor of ``len(GATHER_FIELDS)`` numbers
(:mod:`vramscope.training.gather`), through one all-gather (``gather=False`` turns it off). It is a
collective, so every rank must run a monitor with the same ``every_n_steps`` and ``gather`` and call
``step()`` with the same step numbers; phases, flushes and background samples never gather, so evaluation on
some ranks only is safe.
See docs/distributed.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from vramscope.analysis.alerts import Alerts, warnings_path
from vramscope.analysis.devices import START, TRAIN
from vramscope.analysis.results import AnalysisResult
from vramscope.analysis.summary import analyze_columns
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.logs.sinks import log_sink
from vramscope.output.names import ANALYSIS_SUFFIX, BREAKDOWN_SUFFIX, STRATEGY_SUFFIX
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.training.breakdown import BreakdownTracker
from vramscope.training.claims import claim_log
from vramscope.training.gather import RankGather
from vramscope.training.hooks import batch_tokens
from vramscope.training.live import LiveRows
from vramscope.training.opened import OpenParts
from vramscope.training.outputs import export_analysis, raise_warnings, trainer_figures
from vramscope.training.pacing import AnalysisPacer
from vramscope.training.ranks import current_rank, rank_path, write_json_beside
from vramscope.training.readers import BackgroundSampler, ThisProcess, allocator_backend, start_oom_recorder
from vramscope.training.settings import MonitorParts, MonitorSettings
from vramscope.training.strategy import detect_strategy
from vramscope.training.window import StepWindow
from vramscope.types import MemoryBreakdown, RunStrategy, Sample, Sink

log = logging.getLogger("vramscope.integrations.loop")  # the logger name users filter on, kept from before the split


class MemoryMonitor:
    """Logs memory at training steps, tells phases apart, and warns about leaks and OOM risks.

    Args:
        log: CSV (or ``.jsonl``) log path; None keeps rows in memory only (for ``analysis()``).
        settings: the options as one :class:`~vramscope.training.settings.MonitorSettings`; the keyword
            arguments are put over it.
        parts: the sinks, NVML module and warning stream as one :class:`~vramscope.training.settings.MonitorParts`.
        **options: any field of :class:`~vramscope.training.settings.MonitorSettings` (``every_n_steps``,
            ``interval``, ``gpus``, ``oom_snapshot``, ``prometheus``, ``export``, ``warn``, ``analyze_every``,
            ``analyze_min_interval_s``, ``analyze_max_share``, ``capacity_bytes``, ``max_batch_tokens``,
            ``total_steps``, ``leak_config``, ``history``, ``gather``, ``rank_logs``, ``overwrite``; its
            docstring says what each does), and of :class:`~vramscope.training.settings.MonitorParts`
            (``sinks``: more sinks that receive every sample; ``nvml``: the NVML module, tests pass a fake
            one; ``warn_stream``: where warnings are printed).

    Raises:
        TypeError: an option that is none of these (the message lists them).
        ValueError: a value out of its range.
    """

    def __init__(
        self,
        log: str | os.PathLike[str] | None = None,
        *,
        settings: MonitorSettings | None = None,
        parts: MonitorParts | None = None,
        **options: Any,
    ) -> None:
        taken = MonitorParts.take(options)
        self._parts = parts if parts is not None else taken
        if log is not None:
            options["log"] = log
        self._apply(MonitorSettings.build(settings, **options))
        self.rank = 0
        self.log_path: str | None = None
        self.rank_rows: dict[int, Sample] = {}  # rank 0: the latest gathered sample of each rank
        self.strategy: RunStrategy | None = None  # how the run is spread, once note_strategy ran
        self.last_result: AnalysisResult | None = None  # the latest live analysis
        self._open: OpenParts | None = None  # what start() opened (and close() closes)
        self._phases: list[str] = []
        self._window = StepWindow()  # the steps since the last logged row
        self._hooks: list[Any] = []
        self._breakdown = BreakdownTracker()
        self._hook_failed = False
        self._started = False
        self._closed = False
        self._narrowed = False

    def _apply(self, settings: MonitorSettings) -> None:
        """Take ``settings`` and build what follows from them (only before :meth:`start`: they hold no rows yet)."""
        self._settings = settings
        # step() reads this on every step: a plain attribute, one lookup, rather than settings.every_n_steps.
        self._every_n_steps = settings.every_n_steps
        self._gathering = settings.gather  # turned off for the run if a collective fails
        self._live = LiveRows(settings.history)  # the rows the live analysis reads, and the trainer's figures
        self._pacer = AnalysisPacer(settings.analyze_every, settings.analyze_min_interval_s,
                                    settings.analyze_max_share)

    @property
    def settings(self) -> MonitorSettings:
        """The options this monitor runs with (frozen; :meth:`configure` changes them before :meth:`start`)."""
        return self._settings

    def configure(self, **options: Any) -> None:
        """Change options before :meth:`start`, as a trainer's callback does once it knows the run
        (``total_steps``, ``max_batch_tokens``, one more exporter).

        Raises:
            RuntimeError: the monitor has started (its rows were taken with the old options).
        """
        if self._started:
            raise RuntimeError("the monitor has started: its options can no longer change")
        self._apply(MonitorSettings.build(self._settings, **options))

    @property
    def alerts(self) -> Alerts | None:
        """The throttled warnings (saved beside the log); None before :meth:`start`."""
        return None if self._open is None else self._open.alerts

    @property
    def prometheus_sink(self) -> Any:
        """The ``/metrics`` exporter among the open ones; None when there is none."""
        return None if self._open is None else self._open.prometheus

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> MemoryMonitor:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> MemoryMonitor:
        """Open the log, start the optional parts, and record the memory before training."""
        if self._started:
            return self
        settings, parts = self._settings, self._parts
        self.rank = current_rank()
        sinks: list[Sink] = []
        if settings.log is not None and (self.rank == 0 or settings.rank_logs):
            self.log_path = claim_log(rank_path(settings.log, self.rank), self)
            # A bad path fails here, before training starts.
            sinks.append(log_sink(self.log_path, overwrite=settings.overwrite))
        exporters: tuple[Any, ...] = ()
        if any(value is not None for value in settings.export.values()):
            from vramscope.exporters.registry import open_exporters  # only when asked

            # A port in use is a fact of the machine, not a mistake in the code: inside a Trainer
            # (on_train_begin) raising would stop the run, so it trains without that exporter (one warning).
            exporters = tuple(open_exporters(settings.export, skip_unbindable=True))
            sinks.extend(exporters)
        sinks.extend(parts.sinks)
        alerts = Alerts(
            path=warnings_path(self.log_path) if self.log_path else None,
            stream=parts.warn_stream if settings.warn else None,
        )
        collector = Collector(
            nvml=NvmlBackend(nvml=parts.nvml, gpus=settings.gpus),
            allocator=allocator_backend(reset_peak=True),
            host=ThisProcess(),
        )
        opened = self._open = OpenParts(collector, Sampler(collector, sinks, interval=settings.interval or 1.0),
                                        alerts, exporters)
        self._started = True
        if settings.oom_snapshot:
            opened.oom = start_oom_recorder(settings.oom_snapshot, self.log_path, self.rank, self.oom_context)
        self._log_row(step=None, phase=START)
        if settings.interval is not None:
            # A second collector for the thread: its allocator reads must not reset the peak
            # counter, or the step rows would lose the exact peak since the previous step.
            background = Collector(
                nvml=NvmlBackend(nvml=parts.nvml, gpus=settings.gpus),
                allocator=allocator_backend(reset_peak=False),
                host=HostBackend(),
            )
            opened.background = BackgroundSampler(functools.partial(self._sample_between_steps, background),
                                                  settings.interval)
            opened.background.start()
        return self

    def _sample_between_steps(self, collector: Collector) -> bool:
        """One background row (no step) through the monitor's sinks; False once the monitor is gone."""
        opened = self._open
        if opened is None:
            return False
        sample = collector.collect(phase=self.current_phase, extra={"rank": self.rank})
        opened.sampler.emit(sample)
        self._live.record(sample, background=True)
        return True

    def close(self) -> None:
        """Log the last steps, analyse, save the analysis beside the log and close everything."""
        opened = self._open
        if not self._started or self._closed or opened is None:
            return
        if opened.background is not None:
            opened.background.stop()
        self.flush()
        self._closed = True
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self.save_breakdown()
        self.save_analysis()
        opened.close()

    def note_strategy(self, model: Any = None, args: Any = None) -> RunStrategy | None:
        """Record which way the run is spread over its GPUs (FSDP / ZeRO / DDP, from the model's wrapping, the
        Trainer's arguments or the process group) in ``<log stem>.strategy.json`` beside the log, for
        ``vramscope report`` to name and to hold against a per-rank plan. Call it once the model is wrapped;
        the HF callback does at train begin. Never raises.
        """
        try:
            info = detect_strategy(model, args)
            self.strategy = info
            if self.log_path is not None:
                write_json_beside(self.log_path, STRATEGY_SUFFIX, info.to_json())
            return info
        except Exception as exc:
            log.warning("vramscope: could not record the run's strategy: %s", exc)
            return None

    def save_analysis(self) -> str | None:
        """Analyse now and write it to ``<log stem>.analysis.json``; returns the path (None without a log).

        Never raises: the analysis must not hide the training's own outcome.
        """
        try:
            result = self.update_analysis()
            if self.log_path is None:
                return None
            # The JSON edge of the live analysis: the one place the typed result becomes a dict.
            return write_json_beside(self.log_path, ANALYSIS_SUFFIX, result.to_json())
        except Exception as exc:
            log.warning("vramscope: the analysis failed: %s", exc)
            return None

    def watch_optimizer(self, optimizer: Any) -> None:
        """Count ``optimizer``'s states in :meth:`breakdown` (trainers pass theirs; a loop calls this once)."""
        self._breakdown.watch_optimizer(optimizer)

    def watch_memory(self, model: Any, optimizer: Any = None) -> None:
        """Count ``model`` (and ``optimizer``) in :meth:`breakdown` without a forward hook (for trainers that
        report batches themselves, like Lightning)."""
        self._breakdown.watch_model(model)
        self._breakdown.watch_optimizer(optimizer)

    def breakdown(self) -> MemoryBreakdown | None:
        """What holds memory now (weights by dtype, LoRA, gradients, optimizer states, activations at the run's
        peak, allocator cache, CUDA context); None before :meth:`watch_model`. Print it for a table."""
        return self._breakdown.current()

    def save_breakdown(self) -> str | None:
        """Write :meth:`breakdown` to ``<log stem>.breakdown.json`` (``vramscope report`` shows it).

        Never raises: a breakdown that cannot be written must not stop the training.
        """
        try:
            if self._breakdown.lost_sight:
                return None
            found = self._breakdown.current()
            if self.log_path is None or found is None:
                return None
            return write_json_beside(self.log_path, BREAKDOWN_SUFFIX, found.to_dict())
        except Exception as exc:
            log.warning("vramscope: the memory breakdown was not saved: %s", exc)
            return None

    # -- what the training loop calls ------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran; a closed monitor logs nothing more."""
        return self._closed

    @property
    def started(self) -> bool:
        """True between :meth:`start` and :meth:`close`."""
        return self._started and not self._closed

    def flush(self) -> Sample | None:
        """Log a row now for the steps since the last logged one (with ``every_n_steps`` > 1)."""
        if not self.started or not self._window.pending:
            return None
        return self._log_row(step=self._window.last_step, phase=self.current_phase)

    @property
    def current_phase(self) -> str:
        return self._phases[-1] if self._phases else TRAIN  # the name the analysis groups the steps' rows by

    def step(self, step: int, tokens: int | None = None) -> Sample | None:
        """Mark the end of training step ``step``; logs a row when ``step % every_n_steps == 0``.

        Args:
            step: the step just finished.
            tokens: tokens in its batch; by default what the forward hook of :meth:`watch_model` saw.

        Returns:
            The logged sample, or None when this step is not logged.
        """
        self._window.step_done(step, tokens)
        if step % self._every_n_steps:
            return None
        sample = self._log_row(step=step, phase=self.current_phase)
        if sample is not None and self._gathering:
            self._gather_ranks(sample)
        return sample

    def _gather_ranks(self, sample: Sample) -> None:
        """Send this rank's row to rank 0, which logs the others' rows after its own."""
        opened = self._open
        if opened is None:
            return
        if opened.gatherer is None:
            # Set up at the first logged step rather than in start(): a process group initialised
            # after the monitor started is still found, and every rank decides at the same step.
            opened.gatherer = RankGather.create()
            if opened.gatherer is None:
                return
        if opened.gatherer.world == 1:
            return
        try:
            others = opened.gatherer.exchange(sample, self.rank)
        except Exception as exc:
            # A failed collective means a broken process group: training fails on its own; the
            # monitor only stops gathering instead of raising a second error from inside step().
            log.warning("vramscope: gathering the ranks' memory failed, rank 0's log keeps its own rows: %s", exc)
            self._gathering = False
            return
        for other in others:
            self.rank_rows[int(str(other.extra["rank"]))] = other
            opened.sampler.emit(other)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a phase (``"eval"``, ``"save"``): its own row, with its own peak, when it ends.

        The steps before it are logged first, so that their peak is not counted as the phase's.
        """
        if self._started and self._window.pending:
            self._log_row(step=self._window.last_step, phase=self.current_phase)
        elif self._started:
            self._reset_peak()
        self._phases.append(name)
        try:
            yield
        finally:
            self._phases.pop()
            if self._started:
                self._log_row(step=self._window.last_step, phase=name)

    def enter_phase(self, name: str) -> None:
        """:meth:`phase` for callbacks that see a beginning and an end in separate calls."""
        if self._started and self._window.pending:
            self._log_row(step=self._window.last_step, phase=self.current_phase)
        elif self._started:
            self._reset_peak()
        self._phases.append(name)

    def exit_phase(self, name: str) -> None:
        """End a phase begun with :meth:`enter_phase`; logs its row. Ending a phase not begun is a no-op."""
        if name in self._phases:
            self._phases.remove(name)
            if self._started:
                self._log_row(step=self._window.last_step, phase=name)

    def watch_model(self, model: Any, phase_from_mode: bool = False) -> None:
        """Count each forward call's tokens (and keep its shape for OOM reports) with a pre-hook.

        Args:
            model: a ``torch.nn.Module`` (the outermost one: inner modules run again under gradient
                checkpointing).
            phase_from_mode: a forward in eval mode (``model.training`` False) during the training
                phase enters the ``"eval"`` phase right there, before that forward allocates anything;
                the caller ends it with :meth:`exit_phase`. For trainers that announce the end of
                an evaluation but not its beginning (HF's ``Trainer``).
        """

        def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # Runs inside the user's forward: whatever goes wrong here must not reach it.
            try:
                if phase_from_mode and not getattr(module, "training", True) and not self._phases:
                    self.enter_phase("eval")
                self.observe_batch(*batch_tokens(args, kwargs))
            except Exception as exc:
                if not self._hook_failed:
                    self._hook_failed = True
                    log.warning("vramscope: the batch hook failed (%s: %s); steps are logged without tokens",
                                type(exc).__name__, exc)

        self._breakdown.watch_model(model)
        register = getattr(model, "register_forward_pre_hook", None)
        if register is None:
            return
        self._hooks.append(register(pre_hook, with_kwargs=True))

    def observe_batch(self, tokens: int | None, shape: tuple[int, ...] | None = None) -> None:
        """Note a batch about to run: its tokens (for the row's ``tokens``) and shape (for OOM reports)."""
        if tokens is None:
            return
        self._window.batch(tokens, shape)

    @property
    def last_batch_shape(self) -> tuple[int, ...] | None:
        """The shape of the last batch seen (forward hook or :meth:`observe_batch`); None before any."""
        return self._window.batch_shape

    def oom_context(self) -> dict[str, Any]:
        """What was running when memory ran out (called by the OOM recorder)."""
        window = self._window
        running = None if window.last_step is None else window.last_step + 1
        return {
            "step": running,
            "last_completed_step": window.last_step,
            "phase": self.current_phase,
            "tokens": window.batch_tokens,
            "batch_shape": list(window.batch_shape) if window.batch_shape is not None else None,
            "rank": self.rank,
            "breakdown": self._breakdown_dict(),
        }

    def _breakdown_dict(self) -> dict[str, Any] | None:
        try:
            found = self._breakdown.current()
        except Exception:  # an OOM report without the breakdown beats no report
            return None
        return None if found is None else found.to_dict()

    # -- rows --------------------------------------------------------------------------------------
    def _reset_peak(self) -> None:
        allocator = self._open.collector.allocator if self._open is not None else None
        if allocator is not None:
            with contextlib.suppress(Exception):
                allocator.reset_peaks()

    def _log_row(self, step: int | None, phase: str) -> Sample | None:
        opened = self._open
        if opened is None or self._closed:
            return None
        sample = opened.collector.collect(step=step, phase=phase, tokens=self._window.tokens,
                                          extra={"rank": self.rank})
        self._window.logged()
        opened.sampler.emit(sample)
        self._live.record(sample)
        self._breakdown.observe(sample)
        if step is not None and not self._breakdown.saved_with_states and self._breakdown.has_optimizer_states:
            # Once, as soon as the optimizer holds its states: a run that dies later still leaves it.
            self._breakdown.saved_with_states = True
            self.save_breakdown()
        if not self._narrowed and sample.allocator:
            self._narrowed = True
            self._narrow_nvml(opened.collector, sample)
        if step is not None and self._pacer.due():
            try:
                self.update_analysis()
            except Exception as exc:  # never let the analysis break training
                log.warning("vramscope: analysis failed: %s", exc)
            self._pacer.ran()
        return sample

    @property
    def latest(self) -> Sample | None:
        """The latest logged step (or phase) sample; None before :meth:`start`."""
        return self._live.latest

    @property
    def rows_logged(self) -> int:
        """Step and phase samples logged so far (the start row included; background samples not)."""
        return self._live.logged

    def rows_held(self) -> int:
        """Rows kept in memory for the analysis (bounded by ``settings.history``)."""
        return len(self._live)

    def _narrow_nvml(self, collector: Collector, sample: Sample) -> None:
        # Read only the GPUs this process uses, once it uses one: one NVML query per GPU per step
        # adds up on an 8-GPU machine where each rank uses one.
        if self._settings.gpus is not None or not sample.allocator:
            return
        uuids = {r.uuid for r in sample.allocator if r.uuid}
        mine = [g.index for g in sample.gpus if g.uuid in uuids]
        if mine and len(mine) < len(sample.gpus):
            old = collector.nvml
            collector.nvml = NvmlBackend(nvml=self._parts.nvml, gpus=mine)
            if old is not None:
                old.close()

    # -- analysis ---------------------------------------------------------------------------------
    def analysis_result(self) -> AnalysisResult:
        """The analysis of the rows logged so far, typed (:func:`vramscope.analysis.summary.analyze_columns`)."""
        settings = self._settings
        columns, has_gpu, system_total = self._live.columns()
        capacity = settings.capacity_bytes if settings.capacity_bytes is not None else (
            None if has_gpu else system_total)
        return analyze_columns(columns, capacity_bytes=capacity, max_batch_tokens=settings.max_batch_tokens,
                               config=settings.leak_config)

    def analysis(self) -> dict[str, Any]:
        """The same dict as :func:`vramscope.analysis.summary.analyze` over the rows logged so far (the JSON of
        :meth:`analysis_result`)."""
        return self.analysis_result().to_json()

    @property
    def last_analysis(self) -> dict[str, Any] | None:
        """The JSON of :attr:`last_result` (the latest live analysis); None before the first one."""
        return None if self.last_result is None else self.last_result.to_json()

    def update_analysis(self) -> AnalysisResult:
        """Analyse now: update :attr:`last_result`, the exporters' leak and forecast series, and the warnings."""
        result = self.analysis_result()
        self.last_result = result
        opened = self._open
        if opened is not None:
            for exporter in opened.exporters:
                export_analysis(exporter, result)
            raise_warnings(opened.alerts, result, self._window.last_step, self._settings.total_steps)
        return result

    # -- figures for trainers' loggers --------------------------------------------------------------
    def figures(self, reset: bool = True) -> dict[str, float]:
        """Numbers for a trainer's logs: ``mem/peak_allocated_gib`` (since the last call) and others.

        Only known values are returned (missing means absent, not 0).
        """
        sample, peak = self._live.figures(reset)
        return trainer_figures(sample, peak, self.last_result)


__all__ = ["MemoryMonitor"]
