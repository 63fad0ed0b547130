"""Moved to :mod:`vramscope.tune.command` (issue 15); this shim keeps the old import path."""

from vramscope.tune.command import (
    DEFAULT_TRIAL_STEPS,
    DEFAULT_TRIAL_TIMEOUT_S,
    CommandTrial,
    CommandTuneResult,
    TrialFailed,
    child_environment,
    run_trial_child,
    setting_for,
    tune_command,
)

__all__ = ["DEFAULT_TRIAL_STEPS", "DEFAULT_TRIAL_TIMEOUT_S", "CommandTrial", "CommandTuneResult", "TrialFailed",
           "child_environment", "run_trial_child", "setting_for", "tune_command"]
