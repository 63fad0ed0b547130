"""Zero-code integration: ``vramscope run`` attaches the memory callback to every HF or Lightning ``Trainer``.

``vramscope run --log mem.csv -- python qlora.py ...`` samples the command from outside (``mem.csv``,
by time) and, through :func:`child_env`, makes each Python process of the command load a small
start-up hook (``_sitecustomize/sitecustomize.py``) that adds :class:`MemoryMonitorCallback` to every
``transformers.Trainer`` it creates (and vramscope's Lightning callback to every Lightning ``Trainer``,
:func:`attach_lightning`). The callback writes the step-aligned log beside the run's log:
``mem.steps.csv`` (rank *k* > 0: ``mem.steps.rank<k>.csv``). No script is edited.

The child sees nothing of vramscope's but the hook's folder on ``PYTHONPATH`` (one file) and the
``VRAMSCOPE_*`` variables: vramscope's own folder (for an installed copy, its whole site-packages)
is never put on the child's ``sys.path``.

The hook is harmless elsewhere: a child that is not Python ignores the variables; a Python child
that never imports transformers pays one dictionary miss per import; an existing ``sitecustomize``
still runs (the hook imports it first); ``python -I`` / ``-E`` ignore ``PYTHONPATH`` and so the hook.
A Trainer that already has a :class:`MemoryMonitorCallback` is left as it is.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramscope.exporters.relay import ENV_RELAY
from vramscope.output.names import STEPS_TAG, TRAINER_TAG, sibling
from vramscope.run.relay import relay_into

SITE_DIR = str(Path(__file__).resolve().with_name("_sitecustomize"))
ENV_INJECT = "VRAMSCOPE_INJECT"
ENV_STEP_LOG = "VRAMSCOPE_STEP_LOG"
ENV_EVERY = "VRAMSCOPE_EVERY_N_STEPS"
ENV_PACKAGE_PARENT = "VRAMSCOPE_PACKAGE_PARENT"
ENV_OOM_SNAPSHOT = "VRAMSCOPE_OOM_SNAPSHOT"  # set by `vramscope run --oom-snapshot DIR` (vramscope.oom)
# "module:function,...": called by the start-up hook with the transformers.trainer module once it is loaded
# (`vramscope tune -- CMD` runs its trial through one); run/ names no caller of its own.
ENV_TRAINER_HOOKS = "VRAMSCOPE_TRAINER_HOOKS"
# The folder that holds this copy's `vramscope` package: the hook imports vramscope from it (and nothing
# else from it) when the child's interpreter has none.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

_trainers = itertools.count(1)


def steps_log_path(log_path: str | os.PathLike[str]) -> str:
    """``runs/mem.csv`` -> ``/abs/runs/mem.steps.csv`` (absolute: the child may change directory)."""
    path = Path(log_path).resolve()
    suffix = path.suffix if path.suffix in (".csv", ".jsonl", ".ndjson") else ".csv"  # a format the callback writes
    return sibling(path, tag=STEPS_TAG, suffix=suffix)


def child_env(log_path: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables that make HF Trainers in the command log step-aligned memory.

    Args:
        log_path: the run's ``--log``; the step log goes beside it. None: the callback still warns
            about leaks and OOM risk, and keeps its rows in memory only.
        environ: the environment the child would get otherwise (default ``os.environ``), so that an
            existing ``PYTHONPATH`` is kept after the hook's folder.

    Returns:
        Variables to add to the child's environment. The user's ``PYTHONPATH`` follows the hook's
        folder exactly as it was, character for character: an empty entry (``PYTHONPATH=:``, a
        leading or trailing ``:``) means the current directory to Python and must stay.
    """
    base = os.environ if environ is None else environ
    theirs = base.get("PYTHONPATH", "")
    if theirs == SITE_DIR or theirs.startswith(SITE_DIR + os.pathsep):  # vramscope run inside vramscope run
        python_path = theirs
    elif theirs:
        python_path = SITE_DIR + os.pathsep + theirs
    else:  # unset or empty (which Python ignores): adding a separator would add the current directory
        python_path = SITE_DIR
    env = {
        "PYTHONPATH": python_path,
        ENV_INJECT: "1",
        # Lets a child interpreter without vramscope installed import this copy of it.
        ENV_PACKAGE_PARENT: PACKAGE_PARENT,
    }
    if log_path is not None:
        env[ENV_STEP_LOG] = steps_log_path(log_path)
    return env


def attach(trainer: Any, environ: Mapping[str, str] | None = None) -> Any | None:
    """Add a :class:`MemoryMonitorCallback` to ``trainer`` as the start-up hook's env says; returns it.

    Nothing is added when the trainer already has one. The callback goes first in the list so that
    its figures are in the logs before the ``report_to`` integrations send them.
    """
    from vramscope.integrations.hf import MemoryMonitorCallback

    handler = getattr(trainer, "callback_handler", None)
    return _added_first(getattr(handler, "callbacks", None), MemoryMonitorCallback, environ)


def _added_first(callbacks: Any, callback_type: type, environ: Mapping[str, str] | None) -> Any | None:
    """A ``callback_type`` made from the hook's env, put first in a trainer's ``callbacks`` list; returns it.

    None when there is no list, or when the user's own ``callback_type`` is in it already: theirs stays."""
    env = os.environ if environ is None else environ
    if not isinstance(callbacks, list):
        return None
    theirs = [cb for cb in callbacks if isinstance(cb, callback_type)]
    if theirs:  # the user's own stays, and relays to `run --prometheus/--push` too (h25export)
        relay_into(theirs[0], env)
        return None
    callback = callback_type(**_callback_options(env))
    callbacks.insert(0, callback)
    return callback


def _callback_options(env: Mapping[str, str]) -> dict[str, Any]:
    """The callback's log, ``every_n_steps`` and OOM folder, as the start-up hook's variables say."""
    log_path = env.get(ENV_STEP_LOG) or None
    number = next(_trainers)
    if log_path is not None and number > 1:  # a second Trainer in the same program gets its own log
        log_path = sibling(log_path, tag=f"{TRAINER_TAG}{number}")
    try:
        every = max(1, int(env.get(ENV_EVERY, "1")))
    except ValueError:
        every = 1
    # `vramscope run --oom-snapshot DIR` asks for OOM post-mortems through this variable.
    oom_dir = env.get(ENV_OOM_SNAPSHOT) or None
    options: dict[str, Any] = {"log": log_path, "every_n_steps": every, "oom_snapshot": oom_dir or False}
    if env.get(ENV_RELAY):  # `run --prometheus/--push`: the step series go to the run's exporters (h25export)
        options["export"] = {"relay": env[ENV_RELAY]}
    return options


def attach_lightning(trainer: Any, environ: Mapping[str, str] | None = None) -> Any | None:
    """:func:`attach` for a Lightning ``Trainer`` (``lightning.pytorch`` or ``pytorch_lightning``).

    The same log, numbering and options as for an HF Trainer; nothing is added when the trainer
    already has vramscope's Lightning callback.
    """
    from vramscope.integrations.lightning import MemoryMonitorCallback

    return _added_first(getattr(trainer, "callbacks", None), MemoryMonitorCallback, environ)
