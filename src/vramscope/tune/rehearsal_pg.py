"""Inside a rehearsal child (``vramscope tune --gpus N -- CMD``): this process is rank 0 of N on one GPU.

The start-up hook calls :func:`install` before the user's code runs (it is named in :data:`ENV_START_HOOKS`;
:func:`rehearsal_environment` sets both variables). From
then on ``torch.distributed.init_process_group`` (called by accelerate, the HF Trainer, torchrun scripts, or the
user) makes torch's fake process group (``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``):
the rank and world size the launcher's environment says, every collective a no-op that returns at once. An
all-gather still allocates its output and a reduce-scatter its input, so FSDP's shards, gathered units and
reduce buffers, DDP's buckets and the optimizer's 1/N states are what a real rank's allocator holds; only the
values are wrong (nothing is exchanged), which changes no memory.

What the fake group cannot show: NCCL's own buffers (its communicators allocate outside torch's allocator,
the rehearsal adds the planner's figure for them), and ranks that do different work from rank 0.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

ENV_REHEARSAL = "VRAMSCOPE_REHEARSAL"  # the world size to rehearse, e.g. "4"
ENV_START_HOOKS = "VRAMSCOPE_START_HOOKS"  # what the start-up hook calls before the program runs
START_HOOK = "vramscope.tune.rehearsal_pg:install"
FAKE_BACKEND = "fake"


class RehearsalSetupError(RuntimeError):
    """The fake process group cannot be installed here (a torch without it); the message says what to do."""


def world_size_of(environ: Mapping[str, str]) -> int | None:
    """The rehearsed world size, or None when this process is not a rehearsal."""
    text = environ.get(ENV_REHEARSAL, "").strip()
    return int(text) if text.isdigit() and int(text) >= 1 else None


def rehearsal_environment(world_size: int) -> dict[str, str]:
    """The variables that make a child started through the start-up hook rank 0 of ``world_size`` on the fake
    group (the launcher's own variables come from :mod:`vramscope.tune.launch_env`)."""
    return {ENV_REHEARSAL: str(world_size), ENV_START_HOOKS: START_HOOK}


def _rank(environ: Mapping[str, str]) -> int:
    text = environ.get("RANK", "0").strip()
    return int(text) if text.isdigit() else 0


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Make every later ``init_process_group`` a fake group of the rehearsed size; True if installed.

    Raises:
        RehearsalSetupError: this torch has no fake process group (torch older than 2.2).
    """
    env = os.environ if environ is None else environ
    world = world_size_of(env)
    if world is None:
        return False
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_vramscope_rehearsal", False):
        return True
    try:
        # Importing it registers the "fake" backend with torch.distributed.
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:
        raise RehearsalSetupError(f"this torch has no fake process group ({exc}); a rehearsal needs torch >= 2.2"
                                  ) from None
    original = dist.init_process_group
    rank = _rank(env)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        # Whatever the caller asked for (nccl, env://, a TCP store at MASTER_ADDR), rank `rank` of `world` on
        # the fake backend: nothing listens at MASTER_PORT and no other rank will ever join.
        asked = kwargs.get("backend") or (args[0] if args else None) or "the default backend"
        for name in ("init_method", "store", "backend", "rank", "world_size", "device_id"):
            kwargs.pop(name, None)
        # Said once in the child's output (the trial's log), so that a rehearsal is never taken for a real run.
        print(f"vramscope: rehearsal: rank {rank} of {world} on torch's fake process group (asked for {asked})",
              file=sys.stderr, flush=True)
        timeout = kwargs.pop("timeout", None)
        extra = {} if timeout is None else {"timeout": timeout}
        return original(backend=FAKE_BACKEND, store=FakeStore(), rank=rank, world_size=world,
                        **{k: v for k, v in kwargs.items() if k in ("group_name", "pg_options")}, **extra)

    init_process_group._vramscope_rehearsal = True  # type: ignore[attr-defined]
    # Modules that imported the function by name (torch.distributed, distributed_c10d, device_mesh, which
    # init_device_mesh uses) hold their own reference: replace each one already loaded.
    import torch.distributed.device_mesh  # noqa: F401  (loaded now, so that its reference is replaced too)

    for name, module in list(sys.modules.items()):
        if name.startswith("torch") and getattr(module, "init_process_group", None) is original:
            module.init_process_group = init_process_group  # type: ignore[attr-defined]
    _complete_ddp_buckets()
    return True


def _bucket_as_reduced(state: Any, bucket: Any) -> Any:
    """DDP's communication hook on the fake group: the bucket as if all-reduced in place (its own buffer)."""
    import torch

    future: Any = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


# DDP checks a hook's annotations against dist.GradBucket and torch.futures.Future; these are strings here
# (postponed annotations), so the hook shows it none.
_bucket_as_reduced.__annotations__ = {}


def _complete_ddp_buckets() -> None:
    """DDP reads each bucket's all-reduce result from the work's future, which the fake group leaves empty
    (torch's reducer then fails: "expected the hook result is either a Tensor or a TensorList found None").
    Give every DDP a hook that returns the bucket itself: NCCL's all-reduce works in place on that same buffer,
    so the memory is the same."""
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__
    if getattr(original, "_vramscope_rehearsal", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.register_comm_hook(None, _bucket_as_reduced)

    __init__._vramscope_rehearsal = True  # type: ignore[attr-defined]
    DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign]


__all__ = ["ENV_REHEARSAL", "ENV_START_HOOKS", "FAKE_BACKEND", "START_HOOK", "RehearsalSetupError", "install",
           "rehearsal_environment", "world_size_of"]
