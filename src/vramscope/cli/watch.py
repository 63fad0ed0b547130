"""``vramscope watch [--interval S] [--devices 0,1] [--log FILE] [--once] [--json]``"""

from __future__ import annotations

import argparse
import json
import sys
import time

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli.common import (
    UsageError,
    add_exporter_flags,
    add_renamed,
    exporter_options,
    gpu_list,
    interval,
    log_megabytes,
    open_exporters_from_args,
    positive_int,
    set_examples,
)
from vramscope.logs.files import LogPathError, existing_log_files, free_log_name
from vramscope.logs.sinks import CsvSink
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.tui.snapshot import snapshot_dict
from vramscope.tui.text import host_line, snapshot_lines
from vramscope.types import Sample, Sink


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval", type=interval, default=1.0, metavar="S", help="seconds between readings (default 1)"
    )
    add_renamed(parser, "--devices", ["--gpus"], dest="gpus", type=gpu_list, metavar="0,1",
                help="only these GPUs (NVML indices)")
    add_renamed(parser, "--log", ["--csv"], metavar="FILE", help="also log every reading to this CSV file")
    parser.add_argument("--fsync", action="store_true", help="force every --log row to disk (survives power loss)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a --log file that already exists; without it, that is refused")
    parser.add_argument("--max-log-mb", dest="max_log_bytes", type=log_megabytes, metavar="MIB",
                        help="start a new --log file (FILE.1, FILE.2, ...) before one passes this size")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N readings")
    parser.add_argument("--json", action="store_true",
                        help="print each reading as one JSON object on one line (with --once: one object)")
    add_exporter_flags(parser)  # every flag of every row of exporters/registry.EXPORTERS
    set_examples(parser,
                 "vramscope watch --once",
                 "vramscope watch --devices 0,1 --interval 2",
                 "vramscope watch --log gpu-mem.csv --max-log-mb 100")


def run(args: argparse.Namespace) -> int:
    from vramscope.exporters.registry import scraped_flags  # the exporters' code loads only where asked for

    scraped = scraped_flags(exporter_options(args)) if args.once else []
    if scraped:
        raise UsageError(f"--once exits at once, so nothing could scrape {' or '.join(scraped)}; drop --once or "
                         "use --push")
    if (args.max_log_bytes is not None or args.fsync) and not args.log:
        raise UsageError("--max-log-mb and --fsync apply to the --log file; add --log FILE")
    if args.log and not args.overwrite:
        _refuse_an_existing_log(args.log)
    # Sinks of the sampler: every reading the loop takes reaches the exporter, whose HTTP server answers
    # scrapes on its own threads while the dashboard or plain loop runs.
    sinks: list[Sink] = open_exporters_from_args(args)
    if args.log:
        try:
            sinks.append(CsvSink(args.log, fsync=args.fsync, max_bytes=args.max_log_bytes, overwrite=args.overwrite))
        except LogPathError as exc:
            for sink in sinks:  # free the exporter's port before reporting the bad path
                sink.close()
            raise UsageError(str(exc)) from None
    nvml = NvmlBackend(gpus=args.gpus)
    collector = Collector(nvml=nvml, host=HostBackend(), name_processes=True)
    sampler = Sampler(collector, sinks, interval=args.interval, history=64)
    try:
        first = sampler.sample_now()
        if not first.gpus:
            why = nvml.init_error or ("no GPU matches --devices" if args.gpus else "no GPU found")
            print(f"vramscope: no NVIDIA GPU to watch ({why}); host memory only", file=sys.stderr)
            print(_json_line(first, why) if args.json else host_line(first.host))
            return 0
        if args.once or args.count == 1:
            print(_json_line(first) if args.json else "\n".join(snapshot_lines(first)))
            return 0
        if sys.stdout.isatty() and not args.json:
            _live(sampler, args)
        else:
            _plain(sampler, first, args)
    except KeyboardInterrupt:
        pass
    finally:
        sampler.close()
        nvml.close()
    return 0


def _ticks(args: argparse.Namespace) -> int | None:
    return None if args.count is None else args.count - 1


def _plain(sampler: Sampler, first: Sample, args: argparse.Namespace) -> None:
    def show(sample: Sample) -> str:
        return _json_line(sample) if args.json else "\n".join(snapshot_lines(sample))

    print(show(first), flush=True)
    left = _ticks(args)
    while left is None or left > 0:
        time.sleep(args.interval)
        print(show(sampler.sample_now()), flush=True)
        left = None if left is None else left - 1


def _json_line(sample: Sample, nvml_error: str | None = None) -> str:
    # One line per reading (JSON Lines); ensure_ascii keeps other users' command lines inert in a terminal.
    return json.dumps(snapshot_dict(sample, nvml_error), allow_nan=False)


def _live(sampler: Sampler, args: argparse.Namespace) -> None:
    from vramscope.tui.dashboard import live

    live(sampler.sample_now, list(sampler.history), args.interval, _ticks(args))


def _refuse_an_existing_log(path: str) -> None:
    """A --log file from an earlier watch is someone's record: refused as `run --log` refuses, with a free name."""
    existing = existing_log_files(path)
    if existing:
        free = free_log_name(path, taken=lambda name: bool(existing_log_files(name)))
        raise UsageError(f"{existing[0]} already exists; give a new name, e.g. --log {free}, "
                         "or add --overwrite to replace it")
