"""Shared CLI pieces: error types and argument parsers with messages that say what to do."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from vramscope.sampling.sampler import MAX_INTERVAL_S, MIN_INTERVAL_S
from vramscope.types import Sink
from vramscope.units import MIB


class UsageError(Exception):
    """Bad flags or arguments: exit 2."""


class CommandError(Exception):
    """The command could not do its work (a file that cannot be read, say): exit 1 by default."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# Numbers on the command line are ASCII and short. Python's int() and float() also read other scripts'
# digits ("٤" is 4), but a size (parse_bytes), a log cell (logfile) and every tool that reads our output
# do not; refusing them everywhere keeps one rule, and a look-alike digit in a script is then an error
# rather than a silent number. A length cap keeps int() of 4,000 digits (and float() of 400, which is
# inf) from ever reaching arithmetic: every flag has a bound far below these lengths anyway.
MAX_NUMBER_CHARS = 32
# Counts (a batch, a sequence, a rank, a number of readings): a trillion is beyond any real run, and keeps
# the planner's arithmetic exact in floats and its divisor search under a second (planner/api.py).
MAX_COUNT = 10**12
# The ``schema_version`` of ``tune --json``, as report, watch and run carry theirs (``plan --json``'s is the plan
# document's, vramscope.planner.document): bumped when a field changes meaning or goes away.
TUNE_SCHEMA_VERSION = 1


def shown(text: str, limit: int = 40) -> str:
    """``repr`` of a user's text for an error line, cut short so a 4,000-character argument stays one line."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def plain_number(text: str, what: str) -> str:
    """The text stripped, when it is a short ASCII number; else ArgumentTypeError saying why."""
    stripped = text.strip()
    if not stripped.isascii():
        raise argparse.ArgumentTypeError(f"{what} must be written with ASCII digits 0-9, got {shown(text)}")
    if len(stripped) > MAX_NUMBER_CHARS:
        raise argparse.ArgumentTypeError(f"{what} must be at most {MAX_NUMBER_CHARS} characters, got {shown(text)}")
    return stripped


def interval(text: str) -> float:
    """argparse type for a sampling interval in seconds."""
    try:
        value = float(plain_number(text, "interval"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"interval must be a number of seconds, got {shown(text)}") from None
    if not value >= MIN_INTERVAL_S or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"interval must be at least {MIN_INTERVAL_S} s, got {shown(text)}")
    if value > MAX_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"interval must be at most {MAX_INTERVAL_S:g} s (a day), got {shown(text)}")
    return value


def log_megabytes(text: str) -> int:
    """argparse type for ``--max-log-mb``: MiB per log file, returned in bytes."""
    try:
        value = float(plain_number(text, "--max-log-mb"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-log-mb takes a size in MiB such as 100, got {shown(text)}") from None
    # A part must hold at least a header and a sample; more than a TiB per file is not a limit.
    if not 0.001 <= value <= 1024 * 1024:  # MiB: up to a TiB
        raise argparse.ArgumentTypeError(f"--max-log-mb must be between 0.001 and 1048576 MiB, got {shown(text)}")
    return int(value * MIB)


def gpu_list(text: str) -> list[int]:
    """argparse type for ``--devices 0,1``: GPUs by their NVML index."""
    try:
        gpus = [int(plain_number(part, "a GPU index")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices takes GPU indices like 0,1; got {shown(text)}") from None
    if not gpus or any(not 0 <= g < 1024 for g in gpus):
        raise argparse.ArgumentTypeError(f"--devices takes GPU indices like 0,1; got {shown(text)}")
    return gpus


def one_device(text: str) -> int:
    """argparse type for ``--devices I`` where a command runs on one GPU (``tune``): ``0``, not ``0,1``."""
    devices = gpu_list(text)
    if len(devices) != 1:
        raise argparse.ArgumentTypeError(f"this command runs on one GPU; give one index, e.g. --devices "
                                         f"{devices[0]}, got {shown(text)}")
    return devices[0]


def positive_int(text: str) -> int:
    """argparse type for a count: a whole number from 1 to :data:`MAX_COUNT`."""
    try:
        value = int(plain_number(text, "a number"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text)}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {shown(text)}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"expected a number up to {MAX_COUNT:,}, got {shown(text)}")
    return value


def index(text: str) -> int:
    """argparse type for a device index: 0 to 1023."""
    try:
        value = int(plain_number(text, "an index"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device index like 0, got {shown(text)}") from None
    if not 0 <= value < 1024:
        raise argparse.ArgumentTypeError(f"expected a device index from 0 to 1023, got {shown(text)}")
    return value


def add_exporter_flags(parser: argparse.ArgumentParser) -> None:
    """Every exporter's flags, from the one table (``vramscope.exporters.registry.EXPORTERS``)."""
    from vramscope.exporters.registry import flags

    for flag in flags():
        options: dict[str, object] = {"dest": flag.dest, "metavar": flag.metavar, "help": flag.help}
        if flag.parse is not None:
            options["type"] = _argument_type(flag.parse)
        if flag.repeat:
            options["action"] = "append"
        parser.add_argument(flag.name, **options)  # type: ignore[arg-type]


def _argument_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An exporter's option parser as an argparse type: its ValueError's line becomes the usage error."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def exporter_options(args: argparse.Namespace) -> dict[str, Any]:
    """The exporters' options as the parsed flags give them, by each flag's ``dest`` (exporters/registry)."""
    from vramscope.exporters.registry import flags

    return {flag.dest: getattr(args, flag.dest, None) for flag in flags()}


def open_exporters_from_args(args: argparse.Namespace, announce: bool = True, run: bool = False) -> list[Sink]:
    """The exporters the flags of :func:`add_exporter_flags` ask for (``--prometheus``, ``--push``, ...).

    Opened before any work starts, so that a port already in use is a usage error (exit 2), not a lost run.

    Args:
        run: this is ``vramscope run``: its series carry a ``run`` label (the log's stem, else
            host-pid-start), which is also part of its Pushgateway group, so two runs never share one.
    """
    from vramscope.exporters.registry import asked_for

    options = exporter_options(args)
    if not asked_for(options):
        return []
    from vramscope.exporters import PrometheusSinkError
    from vramscope.exporters.registry import ExportContext, open_exporters, run_name

    context = ExportContext()
    if run:
        # `--push-label run=NAME` names the run for every exporter, so the scraped series say the same.
        name = dict(options.get("push_labels") or []).get("run") or run_name(getattr(args, "log", None))
        context = ExportContext(labels={"run": name}, run=name)
    try:
        sinks = open_exporters(options, context)
    except PrometheusSinkError as exc:
        raise UsageError(str(exc)) from None
    if announce:
        for sink in sinks:
            print(f"vramscope: {sink.where}", file=sys.stderr)
    return [*sinks]



# One vocabulary across the subcommands (issue 25): a flag that was renamed keeps its old spelling for one
# release. The old spelling is hidden from --help and shell completion, stores into the new flag's ``dest``,
# and says once, in one line on stderr, what it is called now.
_NOTED = "_vramscope_renamed_noted"
_RENAMED: dict[type[argparse.Action], type[argparse.Action]] = {}


def renamed_note(old: str, new: str) -> str:
    """The one line an old spelling prints."""
    return f"vramscope: {old} is now {new}; the old spelling works until the next release"


def _renamed(cls: type[argparse.Action]) -> type[argparse.Action]:
    """A subclass of ``cls`` that prints :func:`renamed_note` (once per command line) before acting."""
    if cls not in _RENAMED:
        def __call__(self: argparse.Action, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: Any, option_string: str | None = None) -> None:
            note_renamed(namespace, option_string or self.option_strings[0], getattr(self, "renamed_to", "?"))
            cls.__call__(self, parser, namespace, values, option_string)

        _RENAMED[cls] = type(f"Renamed{cls.__name__}", (cls,), {"__call__": __call__})
    return _RENAMED[cls]


def note_renamed(namespace: argparse.Namespace, old: str, new: str) -> None:
    """Print the note for ``old`` unless this command line already did (``--csv a --csv b``: one line)."""
    noted: set[str] = set(getattr(namespace, _NOTED, ()))
    if old in noted:
        return
    noted.add(old)
    setattr(namespace, _NOTED, noted)
    print(renamed_note(old, new), file=sys.stderr)


def add_renamed(parser: argparse.ArgumentParser | argparse._ActionsContainer, new: str, old: Sequence[str],
                **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(new, **kwargs)`` plus each spelling in ``old`` as a hidden alias of it.

    Returns the new flag's action. An alias takes the same values (type, choices, nargs) into the same
    ``dest``; using it prints one line that names the new spelling.
    """
    action = parser.add_argument(new, **kwargs)
    hidden = {**kwargs, "dest": action.dest, "help": argparse.SUPPRESS}
    hidden.pop("required", None)
    for spelling in old:
        alias = parser.add_argument(spelling, **hidden)
        alias.__class__ = _renamed(type(alias))
        alias.renamed_to = new  # type: ignore[attr-defined]
    return action


def renamed_to(action: argparse.Action) -> str | None:
    """The new spelling of a hidden old flag (None for a current flag)."""
    name = getattr(action, "renamed_to", None)
    return name if isinstance(name, str) else None


def set_examples(parser: argparse.ArgumentParser, *examples: str) -> None:
    """End ``--help`` with these command lines (real ones: tests/test_cli_vocabulary.py parses each)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "examples:\n" + "\n".join(f"  {line}" for line in examples)
