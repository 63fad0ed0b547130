"""What the benchmark scripts share: the machine's description, result files, interleaving, statistics,
and the QLoRA model they train.

Every result file carries the environment it was measured in (device, driver, library versions, date)
and every repetition, so that a number in docs/benchmarks.md can always be traced to its raw data.
Nothing here asserts a time: the scripts measure and record, the reader judges.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
TINY_RESULTS_DIR = RESULTS_DIR / "tiny"  # a CPU smoke run must never overwrite the H200's numbers

# Distributions whose versions decide the numbers; recorded in every result file.
PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "nvidia-ml-py",
    "psutil",
    "gpustat",
    "nvitop",
)

# The model the tiny (CPU) mode trains: a Llama with the real architecture's code paths, shrunk so a
# step takes milliseconds. Only shapes change; the recipe (LoRA on every linear, checkpointing) stays.
TINY_OVERRIDES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


# -- the command line every script shares ----------------------------------------------------------
def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke mode: a tiny model, a few steps; proves the script runs, measures nothing real",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"folder for the JSON result (default {RESULTS_DIR.relative_to(REPO)}, "
        f"or {TINY_RESULTS_DIR.relative_to(REPO)} with --tiny)",
    )
    return parser


def out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return Path(args.out)
    return TINY_RESULTS_DIR if args.tiny else RESULTS_DIR


def log(message: str) -> None:
    """Progress on stderr, with a timestamp, so the lead can see where device time goes."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- environment ---------------------------------------------------------------------------------
def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        import vramscope

        versions["vramscope"] = vramscope.__version__
    except ImportError:
        versions["vramscope"] = None
    return versions


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    if out.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, timeout=10
    ).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def nvml_info() -> dict[str, Any]:
    """Driver, NVML and CUDA driver versions and the GPUs, straight from NVML; a reason when there is none."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"available": False, "reason": f"NVML init failed: {exc}"}
    try:
        info: dict[str, Any] = {"available": True}
        info["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        info["nvml_version"] = _text(pynvml.nvmlSystemGetNVMLVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        info["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        gpus = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "memory_total_bytes": int(memory.total),
                }
            )
        info["gpus"] = gpus
        return info
    except Exception as exc:
        return {"available": False, "reason": f"NVML query failed: {exc}"}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def torch_info() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"available": False, "reason": "torch is not installed"}
    import torch

    info: dict[str, Any] = {
        "cuda_available": bool(torch.cuda.is_available()),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "num_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device_name"] = props.name
        info["device_capability"] = f"{props.major}.{props.minor}"
        info["device_total_bytes"] = int(props.total_memory)
        info["device_uuid"] = device_uuid()
    return info


def environment() -> dict[str, Any]:
    """Where and with what a result was measured."""
    import psutil

    torch_part = torch_info()
    nvml_part = nvml_info()
    if torch_part.get("cuda_available"):
        device = {
            "kind": "cuda",
            "name": torch_part.get("device_name"),
            "total_bytes": torch_part.get("device_total_bytes"),
            "driver_version": nvml_part.get("driver_version"),
        }
    else:
        device = {"kind": "cpu", "name": cpu_model()}
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": {
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "memory_total_bytes": int(psutil.virtual_memory().total),
            "platform": platform.platform(),
        },
        "python": sys.version.split()[0],
        "versions": package_versions(),
        "vramscope_commit": git_commit(),
        "torch": torch_part,
        "nvml": nvml_part,
        "nvidia_smi": shutil.which("nvidia-smi"),
        "env": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF") if k in os.environ},
    }


def write_result(directory: Path, name: str, payload: dict[str, Any], tiny: bool) -> Path:
    """Write ``<directory>/<name>.json`` with the environment; written to a temporary file first so that a
    killed run never leaves half a file where make_benchmarks_md.py would read it."""
    directory.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": name, "mode": "tiny" if tiny else "full", "environment": environment(), **payload}
    path = directory / f"{name}.json"
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".json", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1, default=_jsonable)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- interleaving and statistics --------------------------------------------------------------------
def williams_orders(n: int) -> list[list[int]]:
    """Orders of ``n`` arms (a Williams design) in which every arm follows every other arm equally often.

    Running blocks in these orders spreads drift (clocks, temperature, allocator state) and carry-over
    from the previous arm evenly over the arms, which a fixed A-B-C order would not.
    """
    if n <= 0:
        return []
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + shift) % n for x in first] for shift in range(n)]
    if n % 2:  # odd n needs the mirrored rows too for every ordered pair to appear
        rows += [list(reversed(row)) for row in rows]
    return rows


def block_orders(arms: Sequence[str], blocks: int) -> list[list[str]]:
    orders = williams_orders(len(arms))
    return [[arms[i] for i in orders[b % len(orders)]] for b in range(blocks)]


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median and spread of repetitions (robust ones first: one preempted step must not move the result)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        return {
            "n": 0,
            "median": None,
            "mean": None,
            "min": None,
            "max": None,
            "p25": None,
            "p75": None,
            "iqr": None,
            "mad": None,
            "stdev": None,
        }
    median = statistics.median(xs)
    p25, p75 = (statistics.quantiles(xs, n=4, method="inclusive")[i] for i in (0, 2)) if len(xs) > 1 else (xs[0], xs[0])
    return {
        "n": len(xs),
        "median": median,
        "mean": statistics.fmean(xs),
        "min": xs[0],
        "max": xs[-1],
        "p25": p25,
        "p75": p75,
        "iqr": p75 - p25,
        "mad": statistics.median(abs(x - median) for x in xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
    }


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic``; None with fewer than two values."""
    xs = [float(v) for v in values]
    if len(xs) < 2:
        return None
    rng = random.Random(seed)  # fixed seed: rerunning the report gives the same interval
    stats = sorted(statistic([rng.choice(xs) for _ in xs]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    lo = stats[max(0, math.floor(tail * resamples))]
    hi = stats[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return lo, hi


def ratio_ci_pct(
    arm: dict[Any, Sequence[float]],
    base: dict[Any, Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    statistic: Callable[[Sequence[float]], float] = statistics.median,
    by_block: bool = False,
) -> tuple[float, float] | None:
    """Bootstrap interval of ``(statistic(arm) / statistic(base) - 1) * 100``.

    By default steps are resampled within each block, which keeps the design's balance (every resample has each
    block's share of both arms), so drift between blocks does not widen or shift the interval. ``by_block``
    resamples whole blocks instead (both arms' steps of a drawn block together): steps that are alike within a
    block (a clock state lasting several steps) then count as one, and the interval cannot be narrower than the
    blocks' own spread allows.
    """
    blocks = [b for b in arm if arm[b] and base.get(b)]
    if not blocks or (not by_block and all(len(arm[b]) < 2 and len(base[b]) < 2 for b in blocks)):
        return None  # one step per block and arm: nothing to resample
    if by_block and len(blocks) < 3:
        return None
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        if by_block:
            drawn = [rng.choice(blocks) for _ in blocks]
            mine = [x for b in drawn for x in arm[b]]
            theirs = [x for b in drawn for x in base[b]]
        else:
            mine = [rng.choice(arm[b]) for b in blocks for _ in arm[b]]
            theirs = [rng.choice(base[b]) for b in blocks for _ in base[b]]
        stats.append((statistic(mine) / statistic(theirs) - 1) * 100)
    stats.sort()
    tail = (1 - confidence) / 2
    return stats[max(0, math.floor(tail * resamples))], stats[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]


# -- devices ------------------------------------------------------------------------------------------
def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def synchronize() -> None:
    """Wait for the GPU, so that a step's time includes its kernels, not just their launch."""
    if cuda_available():
        import torch

        torch.cuda.synchronize()


def device_uuid(index: int = 0) -> str | None:
    """torch device ``index`` as NVML and nvidia-smi name it ("GPU-..."), or None."""
    import torch

    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return None
    if not raw:
        return None
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"


def nvidia_smi_query_args(uuid: str | None) -> list[str]:
    """``-i GPU-...`` when the training GPU is known, so that other GPUs of the host are not read."""
    return ["-i", uuid] if uuid else []


# -- the model ---------------------------------------------------------------------------------------
def model_config(name: str, tiny: bool, **overrides: Any) -> dict[str, Any]:
    """config.json fields of a registry model (the planner's data), shrunk in tiny mode."""
    from vramscope.planner import get_config

    config = get_config(name)
    config.update(overrides)
    if tiny:
        config.update(TINY_OVERRIDES)
    return config


def approx_checkpoint_bytes(config: dict[str, Any]) -> int:
    """Rough bf16 size of a decoder-only checkpoint from its config.json fields (to pick where it fits)."""
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * int(config.get("intermediate_size") or 0)
    embeddings = int(config.get("vocab_size") or 0) * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return 2 * (int(config.get("num_hidden_layers") or 0) * (attention + mlp) + embeddings)


def default_checkpoint_root(needed_bytes: int = 0) -> Path:
    """/dev/shm when it is writable and has room (containers often give it only 64 MiB), else the temp dir.

    RAM-backed storage makes writing and reading a 14 GB checkpoint take seconds instead of a minute.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        try:
            free = shutil.disk_usage(shm).free
        except OSError:
            free = 0
        if free >= needed_bytes * 1.2 + 2**30:
            return shm / "vramscope-bench"
    return Path(tempfile.gettempdir()) / "vramscope-bench"


def ensure_checkpoint(config: dict[str, Any], root: Path | None = None) -> tuple[Path, float, bool]:
    """A random-weight checkpoint of ``config``, written once and reused while its config is the same.

    Returns (folder, seconds spent writing, reused). On a GPU the random weights are created there
    (torch's default device set to CUDA around the shared writer), which is much faster than a CPU
    initialisation of 7B parameters; the values do not matter for memory or step time.
    """
    from vramscope.tune.qlora import write_random_checkpoint

    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{config.get('model_type', 'model')}-{digest}"
    marker_name = ".complete"  # written last: a checkpoint cut short by a kill is not reused
    if root is None:
        # A checkpoint written by an earlier run is reused wherever it is; a new one goes where it fits.
        candidates = [p / name for p in (default_checkpoint_root(), default_checkpoint_root(2**62))]
        found = next((c for c in candidates if (c / marker_name).is_file()), None)
        if found is not None:
            return found, 0.0, True
        root = default_checkpoint_root(approx_checkpoint_bytes(config))
    folder = root / name
    marker = folder / marker_name
    if marker.is_file():
        return folder, 0.0, True
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if cuda_available():
        import torch

        try:
            with torch.device("cuda"):
                write_random_checkpoint(config, folder)
        except Exception as exc:  # an architecture that cannot be built under a device context
            log(f"random init on the GPU failed ({type(exc).__name__}: {exc}); initialising on the CPU")
            shutil.rmtree(folder, ignore_errors=True)
            write_random_checkpoint(config, folder)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    else:
        write_random_checkpoint(config, folder)
    marker.write_text(json.dumps(config, sort_keys=True))
    return folder, time.perf_counter() - started, False


def build_qlora_trainer(
    config: dict[str, Any], tiny: bool, checkpoint_root: Path | None = None
) -> tuple[Any, dict[str, Any]]:
    """The shared QLoRA trainer (src/vramscope/tune/qlora.py, reference recipe) over a random checkpoint.

    Returns the trainer and what building it cost, for the result file.
    """
    from vramscope.tune.qlora import QLoraSpec, build_trainer

    if tiny:
        import torch

        # A tiny model gains nothing from threads, and on a shared CPU they contend: one step took
        # ~0.8 s with 2 threads and ~0.05 s with 1 on a loaded 2-core machine.
        torch.set_num_threads(1)
    spec = QLoraSpec()
    folder, write_s, reused = ensure_checkpoint(config, checkpoint_root)
    started = time.perf_counter()
    trainer = build_trainer(folder, spec, device="cpu" if tiny else None)
    load_s = time.perf_counter() - started
    params = sum(p.numel() for p in trainer.model.parameters())
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    info = {
        "config": config,
        "spec": spec.to_dict(),
        "checkpoint": str(folder),
        "checkpoint_write_s": write_s,
        "checkpoint_reused": reused,
        "load_s": load_s,
        "parameters_stored": params,  # 4-bit weights count as packed elements
        "trainable_parameters": trainable,
        "quantized": bool(cuda_available() and not tiny and spec.bits in (4, 8)),
    }
    return trainer, info


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """Times the block in seconds, GPU work included (synchronised on both sides)."""
    result: dict[str, float] = {}
    synchronize()
    started = time.perf_counter()
    try:
        yield result
    finally:
        synchronize()
        result["s"] = time.perf_counter() - started
