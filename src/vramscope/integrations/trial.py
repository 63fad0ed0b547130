"""Kept so that old imports still work: a ``vramscope tune -- CMD`` trial child is :mod:`vramscope.training.trial`."""

from __future__ import annotations

from vramscope.training.trial import (
    ENV_TRIAL,
    OOM_EXIT_CODE,
    TrialRequest,
    install,
    override_arguments,
    record_path,
    shape_batch,
)

__all__ = ["ENV_TRIAL", "OOM_EXIT_CODE", "TrialRequest", "install", "override_arguments", "record_path",
           "shape_batch"]
