"""The one error a command reading raises: a person can fix it, so the CLI prints it in one line and exits 2."""

from __future__ import annotations

from vramscope.planner.errors import PlanInputError

HOW_INSTEAD = "plan it with --model NAME (or --config PATH), --batch-size B and --seq-len S instead"


class CommandReadError(PlanInputError):
    """The command cannot be read (unknown launcher, a config file that does not parse, no model, a bad value)."""
