"""Kept so that old imports still work: the ``vramscope run`` injection is :mod:`vramscope.training.inject`."""

from __future__ import annotations

from vramscope.training.inject import (
    ENV_EVERY,
    ENV_INJECT,
    ENV_OOM_SNAPSHOT,
    ENV_PACKAGE_PARENT,
    ENV_STEP_LOG,
    SITE_DIR,
    attach,
    attach_lightning,
    child_env,
    steps_log_path,
)

__all__ = ["ENV_EVERY", "ENV_INJECT", "ENV_OOM_SNAPSHOT", "ENV_PACKAGE_PARENT", "ENV_STEP_LOG", "SITE_DIR", "attach",
           "attach_lightning", "child_env", "steps_log_path"]
