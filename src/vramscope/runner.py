"""Kept so that old imports still work: ``vramscope run``'s runner is :mod:`vramscope.training.runner`."""

from vramscope.training.runner import (
    CLEANUP_LIMIT_S,
    ENV_RUN_ID,
    ProgramNotFoundError,
    RunResult,
    exit_like,
    resolve_program,
    run_monitored,
)

__all__ = ["CLEANUP_LIMIT_S", "ENV_RUN_ID", "ProgramNotFoundError", "RunResult", "exit_like", "resolve_program",
           "run_monitored"]
