"""``vramscope report LOG [LOG2 ...] [--html OUT] [--png OUT] [--json] [--gpu-memory SIZE]``

Reads each log (any format of :data:`vramscope.logs.formats.FORMATS`, which ``--help`` names), prints a summary
(or JSON), and writes the HTML page and the PNG. Output paths are checked before any work, and each file is written
to a temporary name beside it and renamed into place, so a failure never leaves half a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vramscope.cli.common import UsageError, add_renamed, positive_int, set_examples
from vramscope.cli.recipe import add_framework_argument
from vramscope.logs import formats  # light: its readers are imported when a log is read
from vramscope.logs.errors import LogFormatError
from vramscope.logs.files import log_parts
from vramscope.logs.mapping import ColumnsError, ColumnSpec, parse_columns
from vramscope.output.atomic import write_atomically
from vramscope.output.safetext import printable
from vramscope.planner import PlanInputError, load_config_file
from vramscope.planner.settings import STYLES
from vramscope.recipe import QLoraSpec
from vramscope.units import parse_bytes

# The report floor reads logs into numpy columns: it is imported when the command runs, so that building
# the parser (``vramscope --help``, every other command) does not load it.
if TYPE_CHECKING:
    from vramscope.advice.log import RunSettings
    from vramscope.report.model import LogReport


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help=f"memory logs ({formats.listed(imported=False)}); two or more are compared")
    parser.add_argument("--html", metavar="OUT", help="write a self-contained HTML page with the charts here")
    parser.add_argument("--png", metavar="OUT", help="write the charts as a PNG here (needs vramscope[plot])")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    add_renamed(parser, "--gpu-memory", ["--capacity"], dest="capacity", metavar="SIZE",
                help="the memory each GPU is held against (e.g. 24GiB, 80GB): the headroom and the OOM "
                     "forecast use it in place of the log's GPU total (needed for a log without one)")
    parser.add_argument(
        "--columns", type=_columns, metavar="FIELD=COL[:UNIT],...",
        help="read any CSV through this mapping, e.g. time=0,step=1,allocated=2:GiB,reserved=3:GiB. COL is a "
             "0-based index or a header name; fields: time, elapsed, step, gpu, phase, tokens, rank and the "
             "memory columns allocated, reserved, peak (peak allocated), used and total (the device's), process, "
             "rss (host); memory units B, KB, KiB, MB, MiB, GB, GiB (default B); a number as time is Unix "
             f"seconds (time=0:ms for milliseconds). Without it: {formats.listed(imported=True, last=' and ')} "
             "are read as they are")
    planner = parser.add_argument_group(
        "what ran (optional)", "with --model and --batch-size, the planner adds its ranked changes with predicted "
        "savings, judged against the measured peak")
    planner.add_argument("--model", metavar="NAME",
                         help="a model name or hub id (Llama-2-7B, meta-llama/Llama-2-7b-hf) or a config.json path")
    planner.add_argument("--batch-size", type=positive_int, metavar="N", help="the run's micro-batch")
    planner.add_argument("--seq-len", type=positive_int, metavar="N",
                         help="the run's maximum length (default: the log's longest batch / batch size)")
    planner.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                         help="the run had gradient checkpointing off")
    planner.add_argument("--optim", metavar="NAME", help="the run's optimizer (default paged_adamw_32bit)")
    planner.add_argument("--plan", metavar="PLAN.json",
                         help="a saved plan (vramscope plan ... --gpus N --strategy S --json): each rank's peak "
                              "beside the per-rank plan")
    add_framework_argument(planner)
    planner.add_argument("--settings-style", choices=STYLES, metavar="{" + ",".join(STYLES) + "}",
                         help="write the changes in these keys (default: the framework's; axolotl: its YAML)")
    set_examples(parser,
                 "vramscope report mem.csv",
                 "vramscope report mem.csv --html mem.html --gpu-memory 24GiB",
                 "vramscope report run1.csv run2.csv --json")


class Progress:
    """What a long report is doing, on one line of a terminal's stderr, cleared when done; silent elsewhere (a pipe,
    a file, CI), so that logs and scripts see only the report. A 1M-row log takes seconds to read. The line is
    overwritten with spaces, not a terminal escape: nothing vramscope prints holds one (tests/test_terminal_safety)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.on = bool(getattr(stream, "isatty", lambda: False)())
        self.width = 0

    def say(self, text: str) -> None:
        if self.on:
            self.done()
            line = f"vramscope: {text}..."
            self.stream.write("\r" + line)
            self.stream.flush()
            self.width = len(line)

    def done(self) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.width = 0


def _size_of(path: str) -> str:
    try:
        size = os.path.getsize(path)
    except OSError:
        return ""
    return f" ({size / 2**20:.0f} MiB)" if size >= 2**20 else ""


def _columns(text: str) -> list[ColumnSpec]:
    try:
        return parse_columns(text)
    except ColumnsError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--columns").lstrip(": ")) from None


def run(args: argparse.Namespace) -> int:
    from vramscope.report.html import render_html
    from vramscope.report.json_output import json_document
    from vramscope.report.load import report_file
    from vramscope.report.model import EmptyLogError
    from vramscope.report.plan_check import PlanFileError, read_plan

    outputs = [(flag, path) for flag, path in (("--html", args.html), ("--png", args.png)) if path]
    for flag, path in outputs:
        _check_output(flag, path, args.logs)
    if args.png:
        from vramscope.report.png import plot_available

        if not plot_available():
            raise UsageError("--png needs matplotlib; install it with: pip install 'vramscope[plot]'")

    settings = _run_settings(args)
    try:
        plan = read_plan(args.plan) if args.plan else None
    except PlanFileError as exc:
        raise UsageError(str(exc)) from None
    capacity = capacity_option(args.capacity)
    reports: list[LogReport] = []
    progress = Progress(sys.stderr)
    for path in args.logs:
        progress.say(f"reading and analysing {printable(path)}{_size_of(path)}")
        try:
            reports.append(report_file(path, settings=settings, capacity_bytes=capacity, columns=args.columns,
                                       plan=plan))
        except (LogFormatError, EmptyLogError, PlanInputError) as exc:
            progress.done()
            raise UsageError(str(exc)) from None
        progress.done()
        read_as = reports[-1].read_as
        if read_as and args.columns is None:
            # A guess should be seen: the units especially (GiB is assumed for a "gb" column).
            print(f"vramscope: read {printable(path)} as a hand-written log: --columns {printable(read_as)} (pass "
                  "--columns to read it otherwise)", file=sys.stderr)

    # Everything is rendered before anything is written: a failure leaves no output at all.
    files: list[tuple[str, bytes]] = []
    if args.html or args.png:
        progress.say("drawing " + " and ".join(flag.removeprefix("--") for flag, _ in outputs))
    if args.html:
        files.append((args.html, render_html(reports).encode("utf-8")))
    if args.png:
        from vramscope.report.png import render_png

        files.append((args.png, render_png(reports)))
    progress.done()
    for path, content in files:
        _write(path, content)
    written = [path for path, _ in files]

    if args.json:
        json.dump(json_document(reports), sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        from rich.console import Console

        from vramscope.report.terminal import print_report

        # Piped or redirected (no terminal, so rich would assume 80 columns): lines are never broken, so that
        # grep and a file see whole lines; tables keep their natural width.
        piped = not sys.stdout.isatty()
        print_report(reports, Console(highlight=False, soft_wrap=piped, width=1_000 if piped else None))
    for path in written:
        print(f"vramscope: wrote {printable(path)}", file=sys.stderr)
    return 0


def _run_settings(args: argparse.Namespace) -> RunSettings | None:
    """The planner's inputs, when the user gave them; both --model and --batch-size, or neither."""
    from vramscope.advice.log import RunSettings

    given = [flag for flag, value in (("--model", args.model), ("--batch-size", args.batch_size),
                                      ("--seq-len", args.seq_len), ("--optim", args.optim)) if value is not None]
    if not args.gradient_checkpointing:
        given.append("--no-gradient-checkpointing")
    if args.framework != QLoraSpec().framework:
        given.append("--framework")
    if args.settings_style is not None:
        given.append("--settings-style")
    if not given:
        return None
    if args.model is None or args.batch_size is None:
        raise UsageError(f"{given[0]} needs both --model and --batch-size (the planner prices changes for a model "
                         "and a batch), e.g. --model Llama-2-7B --batch-size 4")
    model: str | dict[str, Any] = args.model
    if args.model.endswith(".json"):
        try:
            model = load_config_file(args.model)
        except PlanInputError as exc:
            raise UsageError(str(exc)) from None
    spec = QLoraSpec(gradient_checkpointing=args.gradient_checkpointing, framework=args.framework)
    if args.optim:
        spec = spec.with_(optim=args.optim)
    return RunSettings(model=model, batch_size=args.batch_size, seq_len=args.seq_len, spec=spec,
                       style=args.settings_style)


# Smaller than any GPU's memory: a size this small is a unit left out or mistyped.
MIN_CAPACITY = 256 * 1024**2


def capacity_option(text: str | None) -> int | None:
    """``--gpu-memory SIZE`` in bytes; a size without a unit is refused (24 would be 24 bytes)."""
    if text is None:
        return None
    if text.strip().replace(".", "", 1).isdigit():
        raise UsageError(f"--gpu-memory {text}: give a unit, e.g. --gpu-memory {text.strip()}GiB or {text.strip()}GB")
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise UsageError(f"--gpu-memory: {exc}") from None
    if value < MIN_CAPACITY:
        raise UsageError(f"--gpu-memory {text} is smaller than any GPU's memory; write it like 24GiB or 80GB")
    return value


def _check_output(flag: str, path: str, logs: list[str]) -> None:
    """Refuse an output path that cannot be written, before reading a single log."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a folder; give a file name such as {target / 'report' }.{flag[2:]}")
    if not target.parent.exists():
        raise UsageError(f"{flag} {path}: folder {target.parent} does not exist; create it first")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{flag} {path} is not writable; choose another path")
    if target.exists() and not target.is_file():
        # The write renames a temporary file over the target: over /dev/full or /dev/stdout that would
        # replace the device itself (as root, for the whole machine), not write into it.
        raise UsageError(f"{flag} {path} is not a regular file; give a file path")
    for log in logs:
        # A rotated log is read from every part (r.csv, r.csv.1, ...): each is the log as much as r.csv is.
        for number, part in enumerate(log_parts(log)):
            try:
                same = Path(part).exists() and target.exists() and os.path.samefile(part, target)
            except OSError:  # "" exists as Path (it is ".") but cannot be stat'ed; reading it fails clearly later
                same = False
            if same and number == 0:
                raise UsageError(f"{flag} {path} is one of the logs; writing it would destroy the log")
            if same:
                raise UsageError(f"{flag} {path} is part {number} of the rotated log {log}; writing it would "
                                 "destroy that part of the log; choose another name")


def _write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (temporary file beside it, then rename)."""
    try:
        write_atomically(path, data)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}; choose a writable path") from None
