"""What a monitor reads memory with, set up for a training process: this process's host memory, the
allocator when CUDA is there, a background sampling thread, and the OOM recorder when asked for."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from vramscope.backends.host import HostBackend
from vramscope.output.names import OOM_SUFFIX
from vramscope.training.ranks import beside, rank_path

log = logging.getLogger("vramscope.integrations.loop")  # the logger name users filter on, kept from before the split


class ThisProcess(HostBackend):
    """Host memory of this process alone, for the per-step rows.

    Listing the whole process tree walks every process on the machine (psutil reads /proc for each),
    which is too slow for every training step; the background sampler, when asked for, still reads
    the whole tree (dataloader workers included).
    """

    def tree_pids(self) -> frozenset[int]:
        return frozenset({self.root_pid})

    def tree_rss_bytes(self, pids: frozenset[int] | None = None) -> int | None:
        # The one process is this one, for the monitor's whole life: its handle is kept, where a handle made
        # per row (the tree's way: a pid may be reused) reads /proc/<pid>/stat again for its identity.
        if pids is not None and pids != {self.root_pid}:
            return super().tree_rss_bytes(pids)
        root = self._root_process()
        if root is None:
            return None
        try:
            return int(root.memory_info().rss)
        except Exception:  # psutil's errors, as the tree's reading takes them: unknown
            return None


def allocator_backend(reset_peak: bool) -> Any | None:
    """The torch allocator backend when this process can use CUDA, else None (host memory only)."""
    from vramscope.backends.torch_allocator import TorchAllocatorBackend, torch_cuda_available

    if not torch_cuda_available():
        return None
    return TorchAllocatorBackend(reset_peak=reset_peak)


class BackgroundSampler:
    """Calls ``tick()`` every ``interval`` seconds on a daemon thread until stopped or ``tick`` returns False.

    A failed tick is a warning, never an error: a sampling thread must not die loudly in the user's training.
    """

    def __init__(self, tick: Callable[[], bool], interval: float) -> None:
        self._tick = tick
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vramscope-monitor-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, 3 * self._interval))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not self._tick():
                    return
            except Exception as exc:
                log.warning("vramscope: background sampling failed: %s", exc)


def start_oom_recorder(
    oom_snapshot: bool | str | os.PathLike[str],
    log_path: str | None,
    rank: int,
    context: Callable[[], Mapping[str, Any]],
) -> Any | None:
    """The started :class:`~vramscope.oom.OomRecorder` for ``oom_snapshot``, or None without CUDA (a warning).

    It writes into the folder given (per rank), else beside the log as ``<log stem>.oom/``.
    """
    try:
        from vramscope.oom import OomRecorder
    except ImportError as exc:
        raise ImportError(
            f"oom_snapshot=True needs vramscope.oom, which cannot be imported here ({exc}); "
            "update vramscope or leave oom_snapshot off"
        ) from exc
    if isinstance(oom_snapshot, (str, os.PathLike)):
        out_dir = rank_path(os.fspath(oom_snapshot), rank)
    else:
        out_dir = beside(log_path or rank_path("vramscope.csv", rank), OOM_SUFFIX)
    options: dict[str, Any] = {}
    entries = os.environ.get("VRAMSCOPE_OOM_MAX_ENTRIES", "")  # set by `vramscope run --oom-snapshot`
    if entries.isdigit() and int(entries) > 0:
        options["max_entries"] = int(entries)
    recorder = OomRecorder(out_dir, context=context, **options)
    try:
        recorder.start()
    except RuntimeError as exc:  # no CUDA here: nothing can run out of GPU memory
        log.warning("vramscope: OOM snapshots are off: %s", exc)
        return None
    return recorder
