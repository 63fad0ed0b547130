"""The multi-GPU plan from what a launch says: a world size, a strategy and an offload.

``plan_launch`` takes them as values (``--gpus/--strategy/--offload``); ``parallelism_of`` reads them off a
parsed launch command (``accelerate launch --config_file fsdp.yaml``, ``torchrun --nproc_per_node 4``,
``deepspeed --num_gpus 2 train.py --deepspeed ds.json``) through its ``world_size``, ``strategy``,
``offload`` and ``launcher`` attributes, so any parser that produces those can feed the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramscope.planner.api import ModelRef, Plan, capacity_of, plan, resolve_model
from vramscope.planner.distributed import DistributedEstimate, Parallelism, estimate_distributed, parallelism
from vramscope.planner.document import PlanDocument, plan_document
from vramscope.planner.errors import PlanInputError
from vramscope.planner.memory import Hardware
from vramscope.planner.multigpu import FitTable, fit_table
from vramscope.recipe import QLoraSpec


@dataclass(frozen=True)
class LaunchPlan:
    """The single-GPU plan, the per-GPU plan under the launch's strategy and the table of every strategy."""

    single: Plan
    distributed: DistributedEstimate
    table: FitTable

    def document(self) -> PlanDocument:
        """The ``plan --json`` document of this launch (:mod:`vramscope.planner.document` owns its layout)."""
        return plan_document(self.single, distributed=self.distributed, table=self.table)

    def to_dict(self) -> dict[str, Any]:
        """What ``plan --gpus N --strategy S --json`` prints for the same launch: the largest GPU at the top level,
        the one-GPU plan under ``one_gpu``, every GPU under ``gpus.plan`` and every strategy under ``gpus.table``."""
        return self.document().to_json()


def parallelism_of(command: Any, layers: int | None = None, gpus: int | None = None) -> Parallelism:
    """The :class:`Parallelism` of a parsed launch (duck-typed: ``world_size``, ``strategy``, ``offload``,
    ``launcher``, optionally ``zero_stage`` and ``deepspeed``), e.g. ``plan -- <command>``'s ``Launch``.

    ``offload`` may be a name (``"params"``, ``"optimizer"``) or a flag: True is FSDP's ``offload_params`` for
    FSDP and DeepSpeed's ``offload_optimizer`` for ZeRO. ``gpus`` stands in when the command leaves the world
    size to the launcher (``torchrun --nproc_per_node gpu``: ``world_size`` None).

    Raises:
        PlanInputError: a strategy that cannot apply (ZeRO without DeepSpeed in the command, a split over
            more GPUs than layers, an offload the strategy does not have), or no GPU count at all.
    """
    world = getattr(command, "world_size", None) or gpus
    if world is None:
        raise PlanInputError("the command starts one process per visible GPU; say how many with --gpus N")
    strategy = getattr(command, "strategy", None)
    launcher = getattr(command, "launcher", None)
    deepspeed = getattr(command, "deepspeed", None)
    if deepspeed is None and launcher is not None:
        deepspeed = (launcher == "deepspeed" or getattr(command, "zero_stage", None) is not None
                     or bool(getattr(command, "deepspeed_config", None)))
    offload = getattr(command, "offload", None)
    if isinstance(offload, bool):
        offload = ("params" if strategy == "fsdp" else "optimizer") if offload else "none"
    return parallelism(int(world), strategy, offload, layers=layers, deepspeed=bool(deepspeed)
                       if deepspeed is not None else None)


def plan_launch(model: ModelRef, batch_size: int, seq_len: int, spec: QLoraSpec | None = None, *, world_size: int,
                strategy: str | None = None, offload: str | None = None, deepspeed: bool | None = None,
                gpu: str | None = None, gpu_memory: int | str | None = None, target_batch: int | None = None,
                hardware: Hardware | None = None) -> LaunchPlan:
    """Plan a run over ``world_size`` GPUs under ``strategy`` (None: DDP) with ``offload``.

    Raises:
        PlanInputError: bad sizes, an unknown model or GPU, a strategy that cannot apply.
    """
    spec = spec or QLoraSpec()
    _, shape = resolve_model(model)
    par = parallelism(world_size, strategy, offload, layers=shape.layers, deepspeed=deepspeed)
    cap, hw = capacity_of(gpu_memory, gpu)
    if hardware is not None:
        hw = hardware
    if target_batch is not None and cap is None:
        raise PlanInputError("--target-batch needs a GPU memory: add --gpu-memory 24GiB or --gpu NAME")
    single = plan(model, batch_size, seq_len, spec, gpu_memory=gpu_memory, gpu=gpu, hardware=hardware,
                  target_batch=target_batch)  # as plan --target-batch plans the one GPU too
    dist = estimate_distributed(shape, spec, batch_size, seq_len, par, hw)
    table = fit_table(shape, spec, batch_size, seq_len, world_size, cap, hw, target_batch=target_batch)
    return LaunchPlan(single, dist, table)


__all__ = ["LaunchPlan", "parallelism_of", "plan_launch"]
