"""One tuning trial inside the user's own training command (``vramscope tune -- <command>``).

The tuner starts the command as a child process with :data:`ENV_TRIAL` set to a JSON
:class:`TrialRequest`; the start-up hook (``_sitecustomize``) then calls :func:`install` when
``transformers.trainer`` loads. From there every HF ``Trainer`` (TRL's ``SFTTrainer`` and axolotl's
trainer are subclasses):

* trains at the requested per-device batch for ``max_steps`` optimizer steps, one micro-batch per step
  (gradient accumulation 1: the peak of a micro-batch is the same, the trial is shorter), with
  evaluation, checkpoints, logging, reporting, ``auto_find_batch_size`` and resuming switched off;
* sees every batch at exactly ``batch_size`` rows of ``seq_len`` tokens: the collated batch is tiled (or
  cut) to that shape, so the trial measures the longest batch the run can meet, whatever the dataset
  holds (padding-free batches, one row of packed tokens, become ``batch_size x seq_len`` tokens);
* records, per step, the peak allocated and reserved CUDA memory, the GPU's used memory, the process's
  resident host memory and the shape the model received, into the request's record file
  (``<record>.rank<k>.json`` for rank k > 0; its format is :class:`~vramscope.tune.trial_record.TrialRecord`),
  and after the last step exits
  the process (``os._exit``): nothing after ``train()`` (saving, pushing) runs;
* with ``eval_batch_size``, after the last step runs the user's evaluation on a slice of its eval set at that
  batch (:mod:`vramscope.tune.trial_eval`) and records its peaks as the record's ``eval``;
* on an out-of-memory error writes ``status: "oom"`` (``phase``: ``train`` or ``eval``) and exits with
  :data:`OOM_EXIT_CODE`, so that the OOM ends this child only.

A command that never starts a Trainer leaves no record; the tuner says so. Nothing here runs unless the
variable is set.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import replace
from typing import Any

from vramscope.tune.trial_record import TrialRecord, TrialRequest, TrialStep, record_path

ENV_TRIAL = "VRAMSCOPE_TRIAL"
OOM_EXIT_CODE = 3  # the trial child ran out of GPU memory (its record says which kind)


def _rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


class _Record:
    """The child's record file, rewritten whole (through a temporary name) at each change.

    ``now`` is the record as it stands; a change not yet saved is written with the next :meth:`save`."""

    def __init__(self, request: TrialRequest) -> None:
        self.path = record_path(request.record, _rank())
        self.now = TrialRecord(status="started", request=request, rank=_rank(), pid=os.getpid())

    def save(self, record: TrialRecord | None = None) -> None:
        if record is not None:
            self.now = record
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.now.to_json(), f)
        os.replace(tmp, self.path)


def _nvml() -> Any:
    """NVML, to read this process's GPU memory (as nvidia-smi lists it); None where it cannot be read."""
    try:
        from vramscope.backends.nvml import NvmlBackend

        backend = NvmlBackend()
        return backend if backend.is_available() else None
    except Exception:
        return None


def _process_gpu_bytes(nvml: Any) -> int | None:
    """This process's memory on every GPU NVML lists it on, or None (no NVML, or a PID namespace hides it)."""
    if nvml is None:
        return None
    try:
        pid = os.getpid()
        held = [p.gpu_bytes for g in nvml.read() for p in g.processes if p.pid == pid and p.gpu_bytes is not None]
    except Exception:
        return None
    return sum(held) if held else None


def _rss_bytes() -> int | None:
    """This process's resident host memory now (Linux's /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def shape_batch(batch: Any, rows: int, seq: int | None) -> Any:
    """The collated batch tiled (or cut) to ``rows x seq`` tokens; other entries are left as they are.

    Every 2-D tensor of the same shape as ``input_ids`` (labels, attention and completion masks,
    position ids) is reshaped alike. A padding-free batch (one row, position ids, no attention mask)
    becomes one row of ``rows x seq`` tokens. Token values do not change memory; shapes do.
    """
    import torch

    if not isinstance(batch, dict) or not torch.is_tensor(batch.get("input_ids")):
        return batch
    ids = batch["input_ids"]
    if ids.dim() != 2:
        return batch
    padding_free = ids.shape[0] == 1 and "position_ids" in batch and "attention_mask" not in batch and rows > 1
    want_rows = 1 if padding_free else rows
    want_len = (rows * seq if padding_free else seq) if seq is not None else None
    if padding_free and want_len is None:
        want_len = int(ids.shape[1]) * rows
    shape = tuple(ids.shape)
    out = dict(batch)
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() == 2 and tuple(value.shape) == shape:
            out[key] = _tile(value, want_rows, want_len)
    return out


def _tile(t: Any, rows: int, length: int | None) -> Any:
    r, n = int(t.shape[0]), int(t.shape[1])
    if rows != r:
        t = t.repeat(math.ceil(rows / r), 1)[:rows]
    if length is not None and length != n:
        t = t.repeat(1, math.ceil(length / max(n, 1)))[:, :length]
    return t.contiguous()


class _Shaped:
    """A data collator whose batches come out at the trial's shape."""

    def __init__(self, inner: Any, rows: int, seq: int | None) -> None:
        self.inner, self.rows, self.seq = inner, rows, seq

    def __call__(self, features: Any) -> Any:
        return shape_batch(self.inner(features), self.rows, self.seq)

    def __getattr__(self, name: str) -> Any:  # tokenizer, pad_to_multiple_of, ... of the user's collator
        if name in ("inner", "rows", "seq"):  # not set yet (unpickling in a dataloader worker)
            raise AttributeError(name)
        return getattr(self.inner, name)


def override_arguments(args: Any, request: TrialRequest) -> None:
    """Set a ``TrainingArguments`` (already post-initialised) to run the trial and nothing else."""
    try:
        from transformers.trainer_utils import IntervalStrategy, SaveStrategy

        no_interval: Any = IntervalStrategy.NO
        no_save: Any = SaveStrategy.NO
    except ImportError:  # older transformers: plain strings compare equal to their enums
        no_interval = no_save = "no"
    changes: dict[str, Any] = {
        "per_device_train_batch_size": request.batch_size,
        "gradient_accumulation_steps": 1,
        "max_steps": request.max_steps,
        "eval_strategy": no_interval,
        "save_strategy": no_save,
        "logging_strategy": no_interval,
        "do_eval": False,
        "load_best_model_at_end": False,
        "push_to_hub": False,
        "report_to": [],
        "auto_find_batch_size": False,
        "resume_from_checkpoint": None,
    }
    for name, value in changes.items():
        if hasattr(args, name):
            setattr(args, name, value)


def _callback_class() -> type:
    from transformers import TrainerCallback

    class TrialCallback(TrainerCallback):  # type: ignore[misc]
        """Per-step peaks into the record; ends the process after the last step."""

        def __init__(self, request: TrialRequest, record: _Record) -> None:
            self.request, self.record = request, record
            self.trainer: Any = None  # the Trainer this callback runs in, to evaluate from the last step
            self.eval_pass: Any = None
            self.shapes: list[list[int]] = []
            self._cuda = False
            self._nvml: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            import torch

            now = replace(self.record.now, status="training", cuda=torch.cuda.is_available())
            if model is not None:
                model.register_forward_pre_hook(self._seen, with_kwargs=True)
                total, held = parameter_counts(model.parameters())
                now = replace(now, model_class=type(model).__name__, parameters=total, parameters_held=held)
            if torch.cuda.is_available():
                self._cuda = True
                device = torch.cuda.current_device()
                free, total = torch.cuda.mem_get_info(device)
                if self.request.memory_limit_bytes is not None:
                    torch.cuda.set_per_process_memory_fraction(min(1.0, self.request.memory_limit_bytes / total),
                                                               device)
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()  # the reserve then holds the live tensors only: its rise is the step's
                capacity = int(free) + int(torch.cuda.memory_reserved(device))
                if self.request.memory_limit_bytes is not None:
                    capacity = min(capacity, self.request.memory_limit_bytes)
                now = replace(now, device=device, device_name=torch.cuda.get_device_name(device),
                              total_bytes=int(total), capacity_bytes=capacity,
                              base_allocated_bytes=int(torch.cuda.memory_allocated(device)),
                              base_reserved_bytes=int(torch.cuda.memory_reserved(device)))
                torch.cuda.reset_peak_memory_stats(device)
                self._nvml = _nvml()
            self.record.save(now)

        def _seen(self, module: Any, args: Any, kwargs: Any) -> None:
            ids = kwargs.get("input_ids") if isinstance(kwargs, dict) else None
            if ids is None and args:
                ids = args[0]
            if ids is None:
                ids = kwargs.get("inputs_embeds") if isinstance(kwargs, dict) else None
            shape = getattr(ids, "shape", None)
            if shape is not None and module.training:
                self.shapes.append([int(d) for d in shape[:2]])

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = TrialStep(step=int(state.global_step), inputs=tuple(tuple(shape) for shape in self.shapes))
            self.shapes = []
            if self._cuda:
                import torch

                free, total = torch.cuda.mem_get_info()
                step = replace(step, peak_allocated_bytes=int(torch.cuda.max_memory_allocated()),
                               peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                               allocated_bytes=int(torch.cuda.memory_allocated()),
                               reserved_bytes=int(torch.cuda.memory_reserved()),
                               # the whole GPU's use: this process with its CUDA context (a rehearsal's process memory)
                               device_used_bytes=int(total) - int(free),
                               process_gpu_bytes=_process_gpu_bytes(self._nvml))  # NVML's figure (nvidia-smi's)
                torch.cuda.reset_peak_memory_stats()
            step = replace(step, rss_bytes=_rss_bytes())  # host memory: what CPU offload keeps there
            self.record.now = replace(self.record.now, steps=(*self.record.now.steps, step))
            if state.global_step >= self.request.max_steps:
                if self.request.eval_batch_size is not None and self.trainer is not None:
                    self._evaluate()
                self.record.save(replace(self.record.now, status="done"))
                _exit(0)
            self.record.save()

        def _evaluate(self) -> None:
            """The evaluation pass where the run's first evaluation runs: after a step, its states in place."""
            from vramscope.tune.trial_eval import EvalPass

            assert self.request.eval_batch_size is not None
            self.eval_pass = EvalPass(self.request.eval_batch_size, self._cuda)
            self.record.save(replace(self.record.now, status="evaluating", phase="eval"))
            try:
                evaluation = self.eval_pass.run(self.trainer)
            except BaseException:  # out of memory (re-raised by the pass): keep what it ran at, for the answer
                self.record.now = replace(self.record.now, eval=replace(
                    self.eval_pass.settings, status="oom", step_peaks=tuple(self.eval_pass.step_peaks)))
                raise
            self.record.now = replace(self.record.now, eval=evaluation, phase=None)

        def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.eval_pass is not None:
                self.eval_pass.step_done()

    return TrialCallback


def install(trainer_module: Any, environ: dict[str, str] | None = None) -> None:
    """Make ``trainer_module.Trainer`` run the trial that :data:`ENV_TRIAL` describes (called by the hook)."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_TRIAL)
    trainer_cls = getattr(trainer_module, "Trainer", None)
    if not text or trainer_cls is None or getattr(trainer_cls, "_vramscope_trial", False):
        return
    request = TrialRequest.from_env(text)
    record = _Record(request)
    callback_cls = _callback_class()
    original_init = trainer_cls.__init__
    original_train = trainer_cls.train

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = kwargs.get("args", args[1] if len(args) > 1 else None)
        if given is not None:
            override_arguments(given, request)  # before __init__ builds the accelerator and reads the batch
        original_init(self, *args, **kwargs)
        if getattr(self, "_vramscope_trial_seen", False):
            return
        self._vramscope_trial_seen = True
        override_arguments(self.args, request)  # the default arguments a Trainer made for itself
        self._train_batch_size = self.args.train_batch_size
        self.data_collator = _Shaped(self.data_collator, request.batch_size, request.seq_len)
        callback = callback_cls(request, record)
        callback.trainer = self
        self.callback_handler.callbacks.insert(0, callback)

    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("resume_from_checkpoint", None)
        args = args[1:] if args else args  # the first positional is resume_from_checkpoint
        try:
            return original_train(self, *args, **kwargs)
        except BaseException as exc:
            from vramscope.oom.classify import oom_kind

            kind = oom_kind(exc)
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            if kind is not None:
                record.save(replace(record.now, status="oom", error=f"{kind}: {first}",
                                    phase=record.now.phase or "train"))
                _exit(OOM_EXIT_CODE)
            record.save(replace(record.now, status="error", error=f"{type(exc).__name__}: {first}"))
            raise

    __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
    train.__wrapped__ = original_train  # type: ignore[attr-defined]
    trainer_cls.__init__ = __init__
    trainer_cls.train = train
    trainer_cls._vramscope_trial = True


def parameter_counts(params: Any) -> tuple[int, int]:
    """(the model's parameters, of which this rank holds) over ``model.parameters()`` of a wrapped model.

    FSDP2's DTensor parameters count their whole size and hold their local shard; FSDP1's flat parameters are the
    local shard already, and keep the unsharded size they were cut from (``_unpadded_unsharded_size``)."""
    total = held = 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        unsharded = getattr(p, "_unpadded_unsharded_size", None)
        total += _numel(unsharded) if unsharded is not None else int(p.numel())
        held += int(local.numel())
    return total, held


def _numel(size: Any) -> int:
    count = 1
    for n in size:
        count *= int(n)
    return count
