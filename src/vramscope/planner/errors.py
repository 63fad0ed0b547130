"""Errors the planner raises for input a person can fix; the CLI turns them into one line and exit 2."""

from __future__ import annotations


class PlanInputError(ValueError):
    """Bad planner input (unknown model, malformed config, non-positive size): the message says what to do."""


class UnknownModelError(PlanInputError):
    """A model name that is not in the registry; the message lists the closest names."""
