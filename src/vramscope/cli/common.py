"""Shared CLI pieces: error types and argument parsers with messages that say what to do."""

from __future__ import annotations

import argparse
import sys

from vramscope.sampler import MAX_INTERVAL_S, MIN_INTERVAL_S
from vramscope.sinks.base import Sink


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
    if value > MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"interval must be at most {MAX_INTERVAL_S:g} s (a day), got {text!r}")
    return value


def log_megabytes(text: str) -> int:
    """argparse type for ``--max-log-mb``: MiB per log file, returned in bytes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-log-mb takes a size in MiB such as 100, got {text!r}") from None
    # A part must hold at least a header and a sample; more than a TiB per file is not a limit.
    if not 0.001 <= value <= 1024 * 1024:
        raise argparse.ArgumentTypeError(f"--max-log-mb must be between 0.001 and 1048576 MiB, got {text!r}")
    return int(value * 1024 * 1024)


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


def open_exporters_from_args(args: argparse.Namespace, announce: bool = True) -> list[Sink]:
    """The Prometheus endpoint and Pushgateway pusher that ``--prometheus`` and ``--push`` ask for.

    Opened before any work starts, so that a port already in use is a usage error (exit 2), not a lost run.
    """
    if args.prometheus is None and args.push is None and args.push_interval is None:
        return []
    from vramscope.sinks.prometheus import PrometheusSinkError, open_exporters

    try:
        sinks = open_exporters(args.prometheus, args.push, args.push_interval)
    except PrometheusSinkError as exc:
        raise UsageError(str(exc)) from None
    if announce:
        for sink in sinks:
            print(f"vramscope: {sink.where}", file=sys.stderr)
    return [*sinks]

