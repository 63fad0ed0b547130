"""What one memory reading costs, per source, on the same machine in the same run.

Sources, from one raw figure to a full multi-source reading:

- ``nvml_raw``: one ``nvmlDeviceGetMemoryInfo`` call (pynvml), the floor of any NVML-based tool.
- ``vramscope_nvml``: vramscope's ``NvmlBackend.read()``: memory (v2), utilization, UUID, name and the
  compute processes of every GPU.
- ``torch_memory_stats``: ``torch.cuda.memory_stats()``, the caching allocator's counters.
- ``vramscope_allocator``: vramscope's ``TorchAllocatorBackend.read()`` (memory_stats + peak reset).
- ``vramscope_host``: vramscope's ``HostBackend.read()`` (psutil: this process tree's RSS + system memory).
- ``nvidia_smi``: ``nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits`` as a subprocess.
- ``gpustat``: ``gpustat.new_query()`` (every GPU with its processes, as ``gpustat`` prints them).
- ``nvitop_memory``: nvitop's API, ``Device(0).memory_used()``.
- ``nvitop_snapshot``: nvitop's API, ``Device(0).as_snapshot()`` (every field nvitop shows for a device).
- ``vramscope_collector``: vramscope's full ``Collector.collect()`` (NVML + allocator + host), one Sample.

Each source is called once untimed (initialisation), then in interleaved rounds (every round calls
every source, in an order that changes from round to round) for ``--round-s`` seconds each; every call
is timed alone and recorded. A source that is missing here (no GPU, package not installed) is recorded
as unavailable with the reason. The GPU is idle while this runs, with a CUDA context and some memory
allocated so that torch and NVML have something to report.

Writes ``reading_cost.json``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import common


@dataclass
class Source:
    name: str
    what: str
    read: Callable[[], Any] | None = None
    reason: str | None = None  # why it is unavailable
    seconds: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def _probe(name: str, what: str, setup: Callable[[], Callable[[], Any]]) -> Source:
    """Set the source up and call it once (untimed); any failure makes it 'unavailable', with the reason."""
    try:
        read = setup()
        read()
    except Exception as exc:
        return Source(name, what, reason=f"{type(exc).__name__}: {exc}".strip())
    return Source(name, what, read)


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"{module} is not installed (pip install 'vramscope[bench]')")


def _need_cuda() -> None:
    if not common.cuda_available():
        raise RuntimeError("no CUDA device")


def nvml_raw() -> Callable[[], Any]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)


def vramscope_nvml() -> Callable[[], Any]:
    from vramscope.backends.nvml import NvmlBackend

    backend = NvmlBackend()
    if not backend.is_available():
        raise RuntimeError(backend.init_error or "NVML sees no GPU")
    return backend.read


def torch_memory_stats() -> Callable[[], Any]:
    _need_cuda()
    import torch

    return lambda: torch.cuda.memory_stats(0)


def vramscope_allocator() -> Callable[[], Any]:
    _need_cuda()
    from vramscope.backends.torch_allocator import TorchAllocatorBackend

    return TorchAllocatorBackend(devices=[0]).read


def vramscope_host() -> Callable[[], Any]:
    from vramscope.backends.host import HostBackend

    return HostBackend().read


def nvidia_smi() -> Callable[[], Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi is not on PATH")
    uuid = common.device_uuid() if common.cuda_available() else None
    argv = [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", *common.nvidia_smi_query_args(uuid)]

    def read() -> str:
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        return done.stdout

    return read


def gpustat_query() -> Callable[[], Any]:
    _need("gpustat")
    import gpustat

    query: Callable[[], Any] = gpustat.new_query
    return query


def nvitop_device() -> Any:
    _need("nvitop")
    from nvitop import Device

    if Device.count() < 1:
        raise RuntimeError("nvitop sees no GPU")
    return Device(0)


def nvitop_memory() -> Callable[[], Any]:
    device = nvitop_device()

    def read() -> Any:
        value = device.memory_used()
        if not isinstance(value, int):  # nvitop returns NA instead of raising
            raise RuntimeError(f"nvitop returned {value!r}")
        return value

    return read


def nvitop_snapshot() -> Callable[[], Any]:
    snapshot: Callable[[], Any] = nvitop_device().as_snapshot
    return snapshot


def vramscope_collector() -> Callable[[], Any]:
    from vramscope.backends.host import HostBackend
    from vramscope.backends.nvml import NvmlBackend
    from vramscope.sampling.sampler import Collector

    allocator = None
    if common.cuda_available():
        from vramscope.backends.torch_allocator import TorchAllocatorBackend

        allocator = TorchAllocatorBackend(devices=[0])
    return Collector(nvml=NvmlBackend(), allocator=allocator, host=HostBackend()).collect


SOURCES: tuple[tuple[str, str, Callable[[], Callable[[], Any]]], ...] = (
    ("nvml_raw", "one nvmlDeviceGetMemoryInfo call (pynvml)", nvml_raw),
    ("vramscope_nvml", "vramscope NvmlBackend.read(): memory, utilization, uuid, name, processes", vramscope_nvml),
    ("torch_memory_stats", "torch.cuda.memory_stats()", torch_memory_stats),
    ("vramscope_allocator", "vramscope TorchAllocatorBackend.read(): memory_stats + peak reset", vramscope_allocator),
    ("vramscope_host", "vramscope HostBackend.read(): process-tree RSS + system memory (psutil)", vramscope_host),
    ("nvidia_smi", "nvidia-smi --query-gpu=memory.used subprocess", nvidia_smi),
    ("gpustat", "gpustat.new_query(): every GPU with its processes", gpustat_query),
    ("nvitop_memory", "nvitop Device(0).memory_used()", nvitop_memory),
    ("nvitop_snapshot", "nvitop Device(0).as_snapshot(): every field nvitop shows", nvitop_snapshot),
    ("vramscope_collector", "vramscope Collector.collect(): NVML + allocator + host, one Sample", vramscope_collector),
)


def hold_some_memory(tiny: bool) -> Any:
    """A CUDA context and ~1 GiB allocated, so the allocator and NVML report a training-like process."""
    if tiny or not common.cuda_available():
        return None
    import torch

    return torch.empty(1 << 30, dtype=torch.uint8, device="cuda")


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 6; 2 with --tiny)")
    parser.add_argument(
        "--round-s", type=float, default=None, help="seconds per source and round (default 0.5; 0.05 with --tiny)"
    )
    parser.add_argument("--max-calls", type=int, default=400, help="most calls per source and round (default 400)")
    parser.add_argument("--min-calls", type=int, default=3, help="fewest calls per source and round (default 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.tiny else 6)
    round_s = args.round_s if args.round_s is not None else (0.05 if args.tiny else 0.5)
    if not args.tiny and not common.cuda_available():
        print("reading_cost.py: no CUDA device; run with --tiny on a CPU", file=sys.stderr)
        return 2

    started = time.perf_counter()
    held = hold_some_memory(args.tiny)
    sources = [_probe(name, what, setup) for name, what, setup in SOURCES]
    live = [s for s in sources if s.read is not None]
    for s in sources:
        if s.reason is not None:
            common.log(f"{s.name}: unavailable ({s.reason})")

    names = [s.name for s in live]
    by_name = {s.name: s for s in live}
    orders = common.block_orders(names, rounds)
    calls: list[dict[str, Any]] = []
    for round_index, order in enumerate(orders):
        for name in order:
            source = by_name[name]
            read = source.read
            assert read is not None
            round_started = time.perf_counter()
            count = 0
            while count < args.min_calls or (count < args.max_calls and time.perf_counter() - round_started < round_s):
                t0 = time.perf_counter_ns()
                read()
                source.seconds.append((time.perf_counter_ns() - t0) / 1e9)
                count += 1
            calls.append({"round": round_index, "source": name, "calls": count})
        common.log(f"round {round_index + 1}/{rounds} done")
    del held

    results = {}
    for s in sources:
        entry: dict[str, Any] = {"what": s.what, "available": s.read is not None}
        if s.read is None:
            entry["reason"] = s.reason
        else:
            entry["summary_s"] = common.summarize(s.seconds)
            entry["seconds"] = s.seconds
        results[s.name] = entry
    payload = {
        "description": "cost of one memory reading per source, interleaved rounds, every call timed",
        "protocol": {
            "rounds": rounds,
            "round_s": round_s,
            "min_calls": args.min_calls,
            "max_calls": args.max_calls,
            "orders": orders,
            "timer": "perf_counter_ns around each call; one untimed call first",
            "gpu_state": "idle, CUDA context + 1 GiB allocated" if not args.tiny else "no GPU",
        },
        "sources": results,
        "rounds": calls,
        "wall_s": time.perf_counter() - started,
    }
    path = common.write_result(common.out_dir(args), "reading_cost", payload, args.tiny)
    for name, entry in results.items():
        if entry["available"]:
            summary = entry["summary_s"]
            common.log(f"{name}: median {summary['median'] * 1e6:,.1f} us over {summary['n']} calls")
    common.log(f"wrote {path} in {payload['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
