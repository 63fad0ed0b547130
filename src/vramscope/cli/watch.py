"""``vramscope watch [--interval S] [--gpus 0,1] [--csv FILE] [--once]``"""

from __future__ import annotations

import argparse
import sys
import time

from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli.common import UsageError, gpu_list, interval, positive_int
from vramscope.sampler import Collector, Sampler
from vramscope.sinks import CsvSink
from vramscope.sinks.base import LogPathError, Sink
from vramscope.tui.text import host_line, snapshot_lines
from vramscope.types import Sample


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=interval, default=1.0, metavar="S", help="seconds between readings (default 1)")
    parser.add_argument("--gpus", type=gpu_list, metavar="0,1", help="only these GPUs (NVML indices)")
    parser.add_argument("--csv", metavar="FILE", help="also log every reading to this CSV file")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N readings")


def run(args: argparse.Namespace) -> int:
    sinks: list[Sink] = []
    if args.csv:
        try:
            sinks.append(CsvSink(args.csv))
        except LogPathError as exc:
            raise UsageError(str(exc)) from None
    nvml = NvmlBackend(gpus=args.gpus)
    collector = Collector(nvml=nvml, host=HostBackend(), name_processes=True)
    sampler = Sampler(collector, sinks, interval=args.interval, history=64)
    try:
        first = sampler.sample_now()
        if not first.gpus:
            why = nvml.init_error or ("no GPU matches --gpus" if args.gpus else "no GPU found")
            print(f"vramscope: no NVIDIA GPU to watch ({why}); host memory only", file=sys.stderr)
            print(host_line(first.host))
            return 0
        if args.once or args.count == 1:
            print("\n".join(snapshot_lines(first)))
            return 0
        if sys.stdout.isatty():
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
    print("\n".join(snapshot_lines(first)), flush=True)
    left = _ticks(args)
    while left is None or left > 0:
        time.sleep(args.interval)
        print("\n".join(snapshot_lines(sampler.sample_now())), flush=True)
        left = None if left is None else left - 1


def _live(sampler: Sampler, args: argparse.Namespace) -> None:
    from vramscope.tui.dashboard import live

    live(sampler.sample_now, list(sampler.history), args.interval, _ticks(args))
