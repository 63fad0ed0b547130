"""Shared CLI pieces: error types and argument parsers with messages that say what to do."""

from __future__ import annotations

import argparse

from vramscope.sampler import MIN_INTERVAL_S


class UsageError(Exception):
    """Bad flags or arguments: exit 2."""


class CommandError(Exception):
    """The command could not do its work (a file that cannot be read, say): exit 1 by default."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def interval(text: str) -> float:
    """argparse type for a sampling interval in seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"interval must be a number of seconds, got {text!r}") from None
    if not value >= MIN_INTERVAL_S or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"interval must be at least {MIN_INTERVAL_S} s, got {text!r}")
    return value


def gpu_list(text: str) -> list[int]:
    """argparse type for ``--gpus 0,1``."""
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus takes GPU indices like 0,1; got {text!r}") from None
    if not gpus or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(f"--gpus takes GPU indices like 0,1; got {text!r}")
    return gpus


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value
