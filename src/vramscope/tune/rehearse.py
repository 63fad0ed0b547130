"""``vramscope tune --gpus N -- <launcher command>``: rehearse a run of N GPUs on one, and find its micro-batch.

The launcher (accelerate launch, torchrun, trl sft) is not run: its worker command is, once per trial, as rank
0 of N with the variables the launcher would set (:mod:`vramscope.tune.launch_env`) and torch's fake process
group in place of NCCL (:mod:`vramscope.tune.rehearsal_pg`, installed by the start-up hook). FSDP then
shards the model N ways, all-gathers into real buffers, reduce-scatters from real buffers, and the allocator
holds what a real rank 0 holds. The trials and the search are those of ``tune -- CMD``
(:func:`vramscope.tune.command.tune_command`), each trial a fresh process.

What a rehearsal cannot see, said in every result (:data:`CANNOT_SEE`): NCCL's own device memory, which its
communicators allocate outside torch's allocator (the planner's figure, :meth:`Parallelism.nccl`, is added to
the process memory, and held back from ``--gpu-memory`` before the search); ranks that do different work from
rank 0 (saving, logging, evaluation on rank 0 only: a trial runs none of it); uneven data (every rank's batch
here is rank 0's shape). DeepSpeed (ZeRO-2/3) is planned, not rehearsed (:data:`DEEPSPEED_NOT_REHEARSED`).

Imports no torch: the children get the whole GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from vramscope.commands import ParsedCommand
from vramscope.planner.distributed import Parallelism, estimate_distributed
from vramscope.planner.errors import PlanInputError
from vramscope.planner.shapes import shape_from_config
from vramscope.tune.command import CommandTrial, CommandTuneResult, SearchSettings, tune_command
from vramscope.tune.launch_env import WorkerLaunch, worker_launch
from vramscope.tune.rehearsal_pg import rehearsal_environment
from vramscope.tune.trial_record import TrialRecord

HOW = "fake_pg"
CANNOT_SEE = (
    "NCCL's own buffers: its communicators allocate device memory outside torch's allocator, so the fake group "
    "shows none; the planner's figure for them is added to process memory",
    "ranks that do different work: rank 0 alone saving checkpoints, logging or evaluating (a trial runs none of "
    "it), and a last rank with a different share (a split model)",
    "uneven data: every rank is measured at rank 0's batch shape",
    "the values of gathered and reduced tensors (nothing is exchanged: the loss is not a real one); memory does "
    "not depend on them",
)
DEEPSPEED_NOT_REHEARSED = (
    "DeepSpeed is not rehearsed: deepspeed.initialize opens its own communication layer (deepspeed.comm) and "
    "ZeRO's partitioning runs its own collectives and CUDA streams, which torch's fake process group was never "
    "checked against (and deepspeed is not installed where this was built); planned only"
)


class RehearsalRefused(ValueError):
    """A command the rehearsal does not run (DeepSpeed, one GPU); the message says why, in one line."""


@dataclass(frozen=True)
class RankPeak:
    """What one rehearsed rank held (rank 0; the others are taken to be alike)."""

    rank: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    device_used_bytes: int | None  # this process's GPU memory at its worst step (NVML's; else the GPU's used)
    nccl_bytes: int  # modelled, outside the allocator
    host_rss_bytes: int | None  # the process's resident host memory at its worst step
    parameters: int | None = None  # the model's parameters as the Trainer saw it (FSDP2: their whole size)
    parameters_held: int | None = None  # of which this rank holds (FSDP2's local shards)

    @property
    def process_bytes(self) -> int | None:
        """What nvidia-smi would show for this rank on a real run: the device memory used plus NCCL's share."""
        return None if self.device_used_bytes is None else self.device_used_bytes + self.nccl_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "peak_allocated_bytes": self.peak_allocated_bytes,
                "peak_reserved_bytes": self.peak_reserved_bytes, "device_used_bytes": self.device_used_bytes,
                "nccl_bytes_modelled": self.nccl_bytes, "process_bytes": self.process_bytes,
                "host_rss_bytes": self.host_rss_bytes, "parameters": self.parameters,
                "parameters_held": self.parameters_held}


@dataclass(frozen=True)
class RehearsalResult:
    """The search's answer at N ranks, rank 0's peaks at that answer, and the plan for the same run."""

    launch: WorkerLaunch
    tune: CommandTuneResult
    ranks: tuple[RankPeak, ...]
    gpu_memory_bytes: int | None
    planned: Mapping[str, Any] | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = self.tune.to_dict()
        out["rehearsal"] = {
            "how": HOW, "world_size": self.launch.world_size, "launcher": self.launch.launcher,
            "strategy": self.launch.strategy, "offload": self.launch.offload, "fsdp_version": self.launch.fsdp_version,
            "worker": list(self.launch.argv), "launcher_env": dict(self.launch.env),
            "gpu_memory_bytes": self.gpu_memory_bytes, "ranks": [r.to_dict() for r in self.ranks],
            "planned": None if self.planned is None else dict(self.planned),
            "cannot_see": list(CANNOT_SEE), "notes": [*self.launch.notes, *self.notes],
        }
        return out


def nccl_share(launch: WorkerLaunch) -> int:
    """The planner's NCCL buffers per rank for this launch (outside the allocator)."""
    strategy = launch.strategy if launch.strategy in ("ddp", "fsdp", "zero2", "zero3") else "ddp"
    return Parallelism(world_size=launch.world_size, strategy=strategy).nccl()


def refuse(launch: WorkerLaunch) -> None:
    """Raise :class:`RehearsalRefused` for what the rehearsal does not run."""
    if launch.starts == "deepspeed" or launch.zero_stage is not None or launch.strategy in ("zero2", "zero3"):
        raise RehearsalRefused(DEEPSPEED_NOT_REHEARSED)
    if launch.world_size < 2:
        raise RehearsalRefused("--gpus 1 is a run of one GPU: use vramscope tune -- CMD without --gpus")


def _rank_peak(trial: CommandTrial | None, nccl: int) -> RankPeak:
    record = TrialRecord() if trial is None else trial.record
    steps = record.steps

    def worst(values: Iterable[int | None]) -> int | None:
        return max((v for v in values if v is not None), default=None)

    # NVML's figure for the process when it lists it; the GPU's used memory otherwise (the same when the
    # rehearsal has the GPU to itself).
    used = worst(s.process_gpu_bytes for s in steps)
    used = used if used is not None else worst(s.device_used_bytes for s in steps)
    return RankPeak(rank=0, peak_allocated_bytes=worst(s.peak_allocated_bytes for s in steps),
                    peak_reserved_bytes=worst(s.peak_reserved_bytes for s in steps), device_used_bytes=used,
                    nccl_bytes=nccl, host_rss_bytes=worst(s.rss_bytes for s in steps),
                    parameters=record.parameters, parameters_held=record.parameters_held)


def plan_for(parsed: ParsedCommand, launch: WorkerLaunch, batch: int, seq: int | None) -> dict[str, Any] | None:
    """The planner's per-GPU figures for the rehearsed run, when the command names a model it can read.

    ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``process_bytes`` and ``device_bytes`` are the training
    step's: a trial's peaks are its steps' (the trial child resets torch's peaks and empties the cache once the
    model is loaded, at ``on_train_begin``), so these are what the rank's measured peaks compare with.
    ``peak_device_bytes`` is the run's peak on the GPU, the larger of the step's ``device_bytes`` and the model's
    loading (``load_device_bytes``, at ``load_moment``); ``loading_sets_peak`` says which set it, as the
    planner's own documents do (:class:`~vramscope.planner.distributed.RankEstimate`).
    """
    if not parsed.model_config or seq is None:
        return None
    try:
        shape = shape_from_config(parsed.model_config)
        strategy = launch.strategy if launch.strategy in ("ddp", "fsdp", "zero2", "zero3") else "ddp"
        offload = "params" if launch.offload and strategy == "fsdp" else "none"
        dist = estimate_distributed(shape, parsed.spec, batch, seq,
                                    Parallelism(world_size=launch.world_size, strategy=strategy, offload=offload,
                                                fsdp_version=launch.fsdp_version or 1))  # the launch's, as plan's
    except (PlanInputError, ValueError, KeyError):
        return None
    w = dist.worst
    return {"strategy": strategy, "offload": offload, "batch_size": batch, "seq_len": seq,
            "peak_allocated_bytes": w.peak_allocated_bytes, "peak_reserved_bytes": w.peak_reserved_bytes,
            "process_bytes": w.process_bytes, "host_bytes": w.host_bytes,
            # the run's peak: what the GPU must hold, loading the model or stepping (the planner's fit is on it)
            "device_bytes": w.device_bytes, "load_device_bytes": w.load_device_bytes, "load_moment": w.load_moment,
            "peak_device_bytes": w.peak_device_bytes, "loading_sets_peak": w.loading_sets_peak}


def rehearse(
    parsed: ParsedCommand,
    world_size: int,
    settings: SearchSettings | None = None,
    *,
    gpu_memory_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    on_trial: Callable[[CommandTrial, int], None] | None = None,
) -> RehearsalResult:
    """Search the largest micro-batch per GPU for ``parsed`` run on ``world_size`` GPUs, on this one.

    ``settings`` are :func:`~vramscope.tune.command.tune_command`'s (:class:`~vramscope.tune.command.SearchSettings`),
    the search's of each trial run as rank 0.

    Raises:
        RehearsalRefused: DeepSpeed, or one GPU.
        CommandReadError: a launcher command that cannot be read.
        TrialFailed, NoSizeFitsError: as :func:`~vramscope.tune.command.tune_command`.
    """
    env_in = dict(os.environ if environ is None else environ)
    launch = worker_of(parsed, world_size, environ=env_in, cwd=cwd)
    refuse(launch)
    nccl = nccl_share(launch)
    notes: list[str] = []
    limit = None
    if gpu_memory_bytes is not None:
        limit = gpu_memory_bytes - nccl
        if limit <= 0:
            raise RehearsalRefused(f"--gpu-memory leaves nothing after NCCL's {nccl / 2**30:.2f} GiB per rank")
        notes.append(f"NCCL's modelled {nccl / 2**30:.2f} GiB per rank was held back from --gpu-memory: "
                     f"the trials' allocator was capped at {limit / 2**30:.2f} GiB")
    else:
        notes.append(f"no --gpu-memory: the trials used this GPU's memory, of which a real rank would also give "
                     f"NCCL about {nccl / 2**30:.2f} GiB")
    child_env = {**env_in, **launch.env, **rehearsal_environment(world_size)}
    worker = replace(parsed, argv=tuple(launch.argv))
    result = tune_command(worker, memory_limit_bytes=limit, environ=child_env, cwd=cwd, on_trial=on_trial,
                          settings=settings)
    at = _trial_at(result)
    ranks = (_rank_peak(at, nccl),)
    batch = result.batch_size
    planned = plan_for(parsed, launch, batch, result.seq_len)
    return RehearsalResult(launch=launch, tune=result, ranks=ranks, gpu_memory_bytes=gpu_memory_bytes,
                           planned=planned, notes=tuple(notes))


def _trial_at(result: CommandTuneResult) -> CommandTrial | None:
    """The trial child that ran at the answer (else the largest that fitted)."""
    fitted = [t for t in result.trials if t.trial.ok]
    exact = [t for t in fitted if t.trial.size == result.result.size]
    pool = exact or fitted
    return max(pool, key=lambda t: t.trial.size) if pool else None


def worker_of(parsed: ParsedCommand, world_size: int, environ: Mapping[str, str] | None = None,
              cwd: str | None = None) -> WorkerLaunch:
    """The rehearsal's worker and launcher variables for the parsed command, with the strategy the whole command
    says (the program's own ``--deepspeed ds.json`` or ``--fsdp`` flags as well as the launcher's)."""
    launch = worker_launch(parsed.argv, world_size, environ=environ, cwd=cwd)
    said = parsed.launch
    return replace(launch, strategy=said.strategy or launch.strategy, offload=said.offload or launch.offload,
                   zero_stage=said.zero_stage if said.zero_stage is not None else launch.zero_stage)


__all__ = ["CANNOT_SEE", "DEEPSPEED_NOT_REHEARSED", "HOW", "RankPeak", "RehearsalRefused", "RehearsalResult",
           "nccl_share", "plan_for", "refuse", "rehearse", "worker_of"]
