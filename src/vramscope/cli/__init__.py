"""The ``vramscope`` command: parse, call the library, print, exit.

Each subcommand lives in its own module with ``register(subparsers)`` and ``run(args) -> int``.
Errors people can fix are :class:`UsageError` (exit 2) or :class:`CommandError` (exit 1): one line,
no traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import sys
from collections.abc import Sequence
from importlib import import_module

from vramscope import __version__
from vramscope.cli.common import CommandError, UsageError, renamed_to
from vramscope.output.safetext import printable

# Subcommand modules, in the order --help lists them. Imported lazily so that `vramscope watch`
# never pays for the planner or the report's imports.
SUBCOMMANDS: dict[str, str] = {
    "watch": "vramscope.cli.watch",
    "run": "vramscope.cli.run",
    "report": "vramscope.cli.report",
    "plan": "vramscope.cli.plan",
    "tune": "vramscope.cli.tune",
    "completion": "vramscope.cli.completion",
}
HELP = {
    "watch": "live memory of every GPU and its processes",
    "run": "run a command under the memory monitor and log it",
    "report": "summarise a memory log (terminal, JSON, HTML, PNG)",
    "plan": "predict a QLoRA/LoRA run's peak memory before it starts",
    "tune": "find the largest batch that fits in a few real steps",
    "completion": "print a shell completion script (bash, zsh or fish)",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'vramscope: error: ...' plus a hint, exit 2.

    A mistyped flag gets "did you mean" (argparse in Python 3.11 has no ``suggest_on_error``): the
    unknown flags, those argparse lists or those among the arguments given, against this parser's flags
    (the subcommand's, for the top-level parser's "unrecognized arguments").
    """

    subcommands: dict[str, argparse.ArgumentParser]
    given: list[str]

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self.given, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        hint = self._did_you_mean(message)
        raise UsageError(f"{message}{hint} (see '{self._help_prog(message)} --help')")

    def _subcommand(self) -> argparse.ArgumentParser | None:
        """The subcommand's parser, when this is the top-level parser and the arguments name one."""
        subcommands = getattr(self, "subcommands", {})
        given = getattr(self, "given", [])
        return next((subcommands[a] for a in given if a in subcommands), None)

    def _help_prog(self, message: str) -> str:
        sub = self._subcommand() if message.startswith("unrecognized arguments") else None
        return sub.prog if sub is not None else self.prog

    def _did_you_mean(self, message: str) -> str:
        if message.startswith("argument COMMAND: invalid choice:"):  # `vramscope plann`
            typed = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip().strip("'\"")
            near = difflib.get_close_matches(typed, list(getattr(self, "subcommands", {})), n=1, cutoff=0.6)
            return f"; did you mean '{near[0]}'?" if near else ""
        parser: argparse.ArgumentParser = self
        if message.startswith("unrecognized arguments:"):
            parser = self._subcommand() or self
            unknown = message.split(":", 1)[1].split()
        else:
            given = getattr(self, "given", [])
            unknown = given[: given.index("--")] if "--" in given else given
        known = list(parser._option_string_actions)  # argparse keeps its flags only here
        # An old spelling (cli/common.add_renamed) is suggested as its new one.
        names = {k[2:]: renamed_to(a) or k for k, a in parser._option_string_actions.items() if k.startswith("--")}
        hints = []
        for token in unknown:
            flag = token.split("=", 1)[0]
            if not flag.startswith("--") or flag in known or any(k.startswith(flag) for k in known):
                continue
            near = difflib.get_close_matches(flag[2:], list(names), n=1, cutoff=0.7)
            if near:
                hints.append((flag, names[near[0]]))
        if len(hints) == 1:
            return f"; did you mean {hints[0][1]}?"
        return "".join(f"; {flag}: did you mean {near}?" for flag, near in hints)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vramscope", description="Watch, explain and plan GPU memory of LLM fine-tuning.")
    parser.add_argument("--version", action="version", version=f"vramscope {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.subcommands = {}
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # not written yet in this build
                continue
            raise
        sub_parser = sub.add_parser(name, help=HELP.get(name), description=HELP.get(name))
        module.register(sub_parser)
        sub_parser.set_defaults(_run=module.run)
        parser.subcommands[name] = sub_parser
    return parser


def _refuse_double_dash_values(argv: Sequence[str]) -> None:
    """``--interval=--``: argparse drops a ``--`` value and hands the option an empty list instead of calling
    its type, so every typed flag would get a value of the wrong type. Refuse it before parsing."""
    for token in argv:
        if token == "--":
            return  # what follows is the user's command
        flag, sep, value = token.partition("=")
        if sep and value == "--" and flag.startswith("--"):
            raise UsageError(f"{flag} needs a value, and '--' is not one (write e.g. {flag}=1)")


def _subcommand(argv: Sequence[str]) -> str | None:
    """The command word of ``vramscope [--debug] COMMAND ...`` (the global options are flags without values)."""
    return next((token for token in argv if not token.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if _subcommand(args_list) == "report":
        # pyarrow's default allocator (mimalloc) reserves about 1 GiB of address space at its first use: a report
        # under a memory limit (ulimit -v, a batch system's cap) would fail on what it never touches. Set before
        # pyarrow is imported, never over the user's choice, and for `report` alone: the commands that start the
        # user's programs (run, tune) hand them this process's environment, which must stay the user's.
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    debug = "--debug" in args_list
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")
    try:
        _refuse_double_dash_values(args_list)
        parser = build_parser()
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args._run(args))
    except UsageError as exc:
        print(f"vramscope: error: {printable(str(exc))}", file=sys.stderr)  # file names from a glob, say
        return 2
    except CommandError as exc:
        print(f"vramscope: error: {printable(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `vramscope plan --json | head`: the reader left; say nothing more, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        if debug:
            raise
        print(f"vramscope: error: {type(exc).__name__}: {printable(str(exc))} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1
