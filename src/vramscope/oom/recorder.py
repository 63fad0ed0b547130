"""Record torch's allocator history on a real GPU and write a post-mortem at the moment of an OOM.

Imports torch lazily: importing this module costs nothing on a machine without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from vramscope.analysis.oom import OomEvent
from vramscope.oom.classify import oom_kind
from vramscope.oom.env import DEFAULT_MAX_ENTRIES, ENV_MAX_ENTRIES, ENV_VAR
from vramscope.oom.postmortem import post_mortem, report_from_files
from vramscope.oom.render import write_report
from vramscope.output.atomic import write_atomically
from vramscope.output.names import EVENT_SUFFIX

log = logging.getLogger("vramscope.oom")  # the name users filter on, as before the split

_listeners: list[Callable[[int, int, int, int], None]] = []
_attached = False
_lock = threading.Lock()
_recording = 0  # recorders started and not stopped: history stays on until the last one stops


def add_oom_listener(listener: Callable[[int, int, int, int], None]) -> Callable[[], None]:
    """Call ``listener(device, requested, capacity, device_free)`` on every caching-allocator OOM.

    torch keeps observers for the life of the process and has no way to detach one, so vramscope
    attaches a single dispatcher once and this returns a function that removes ``listener`` from it.
    """
    global _attached
    import torch

    with _lock:
        if not _attached:
            # Private but stable since torch 2.0; the observer runs with the GIL, outside the allocator lock.
            attach: Any = getattr(torch._C, "_cuda_attach_out_of_memory_observer")  # noqa: B009
            attach(_dispatch)
            _attached = True
        _listeners.append(listener)

    def remove() -> None:
        with _lock, contextlib.suppress(ValueError):
            _listeners.remove(listener)

    return remove


def _dispatch(device: int, requested: int, capacity: int, device_free: int) -> None:
    # Runs inside the allocator's malloc, before torch raises the OOM: never let an error escape,
    # or it would replace the OutOfMemoryError the program is about to see.
    for listener in list(_listeners):
        try:
            listener(int(device), int(requested), int(capacity), int(device_free))
        except Exception:  # pragma: no cover - defensive
            log.exception("vramscope: OOM listener failed")


class OomRecorder:
    """Record allocator history and write a post-mortem when CUDA runs out of memory.

    ``start()`` turns on torch's allocator history with a ring buffer of ``max_entries`` alloc/free
    events (older ones are overwritten, so memory stays bounded) and attaches to torch's OOM
    observer. On an OOM it writes, into ``out_dir``: ``oom-<n>-snapshot.pickle`` (open it in
    https://pytorch.org/memory_viz), ``oom-<n>.md``, ``oom-<n>.html``, ``oom-<n>.json`` and
    ``oom-<n>.event.json``. At most ``max_reports`` post-mortems are written per recorder, so a loop
    that catches OOMs does not fill the disk.

    Args:
        out_dir: where the files go (created when needed).
        context: called at the moment of the OOM; returns ``{"step", "phase", "tokens", "batch_shape"}``.
        max_entries: the history ring buffer's size.
        max_reports: post-mortems to write at most.
        stacks: ``"python"`` (cheaper) or ``"all"`` (adds C++ frames, so backward allocations get stacks too).
        device: the CUDA device; None means the current one.
        model: for the planner's advice: a registry name or a config.json dict (or put ``"model"`` in
            the context).
        spec: the recipe for the planner (``QLoraSpec`` or its dict); default the QLoRA reference recipe.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        context: Callable[[], Mapping[str, Any]] | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_reports: int = 3,
        stacks: str = "python",
        device: int | None = None,
        model: Any = None,
        spec: Any = None,
    ) -> None:
        if max_entries <= 0:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        self.out_dir = Path(out_dir)
        self.context = context
        self.max_entries = int(max_entries)
        self.max_reports = int(max_reports)
        self.stacks = stacks
        self.device = device
        self.model = model
        self.spec = spec
        self.reports: list[Path] = []
        self._remove: Callable[[], None] | None = None
        self._count = 0
        self._pending: OomEvent | None = None

    @classmethod
    def from_env(
        cls, context: Callable[[], Mapping[str, Any]] | None = None, environ: Mapping[str, str] | None = None
    ) -> OomRecorder | None:
        """The recorder ``vramscope run --oom-snapshot DIR`` asked for, or None when it did not."""
        env = os.environ if environ is None else environ
        out = env.get(ENV_VAR)
        if not out:
            return None
        try:
            entries = int(env.get(ENV_MAX_ENTRIES, DEFAULT_MAX_ENTRIES))
        except ValueError:
            entries = DEFAULT_MAX_ENTRIES
        return cls(out, context=context, max_entries=entries)

    @property
    def active(self) -> bool:
        return self._remove is not None

    def start(self) -> None:
        """Begin recording (idempotent). Raises RuntimeError when torch sees no CUDA device."""
        if self._remove is not None:
            return
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("OOM snapshots need a CUDA GPU, and torch sees none")
        global _recording
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with _lock:
            # History is one per process; with several recorders the last one started sets its size.
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks=self.stacks, max_entries=self.max_entries
            )
            _recording += 1
        self._remove = add_oom_listener(self._on_oom)

    def stop(self) -> None:
        """Stop recording and detach (idempotent); files already written stay."""
        if self._remove is None:
            return
        import torch

        global _recording
        self._remove()
        self._remove = None
        with _lock:
            _recording -= 1
            if _recording == 0:  # another recorder still running keeps the history it needs
                torch.cuda.memory._record_memory_history(enabled=None)

    def __enter__(self) -> OomRecorder:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_oom(self, device: int, requested: int, capacity: int, device_free: int) -> None:
        if self.device is not None and device != self.device:
            return
        self.write(
            OomEvent(device=device, requested_bytes=requested, capacity_bytes=capacity, device_free_bytes=device_free)
        )

    def record_exception(self, exc: BaseException) -> Path | None:
        """Write a post-mortem for an OOM the allocator's observer does not see (cuBLAS, cuDNN, raw CUDA).

        For ``torch.OutOfMemoryError`` the observer already wrote one; this only adds the message.
        Call it from an ``except`` block, before the stack unwinds further.
        """
        kind = oom_kind(exc)
        if kind is None or self._remove is None:
            return None
        if kind == "cuda_allocator":
            return self._annotate_last(str(exc))
        import torch

        device = self.device if self.device is not None else torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(device)
        return self.write(
            OomEvent(device=device, kind=kind, capacity_bytes=total, device_free_bytes=free, message=str(exc))
        )

    def _annotate_last(self, message: str) -> Path | None:
        if not self.reports:
            return None
        event_file = self.reports[-1].with_suffix(EVENT_SUFFIX)
        try:
            event, snapshot = OomEvent.from_json(json.loads(event_file.read_text(encoding="utf-8")))
            if snapshot is None:
                raise ValueError(f"{event_file} names no snapshot")
            event = replace(event, message=message)
            write_atomically(event_file, json.dumps(event.to_json(snapshot), indent=2, default=str).encode("utf-8"))
            report = report_from_files(Path(snapshot), event_file, model=self.model, spec=self.spec)
            write_report(report, self.out_dir, self.reports[-1].stem)
        except (OSError, ValueError, KeyError) as exc:  # pragma: no cover - best effort
            log.warning("vramscope: could not add the OOM message to %s: %s", event_file, exc)
        return self.reports[-1]

    def write(self, event: OomEvent) -> Path | None:
        """Take the snapshot now and write the post-mortem; returns the Markdown report's path."""
        if self._count >= self.max_reports:
            return None
        self._count += 1
        try:
            import torch

            stats = {k: int(v) for k, v in torch.cuda.memory_stats(event.device).items() if isinstance(v, int)}
            ctx: dict[str, Any] = {}
            if self.context is not None:
                try:
                    ctx = dict(self.context())
                except Exception as exc:  # the monitor's state must not stop the post-mortem
                    ctx = {"context_error": repr(exc)}
            event = OomEvent(
                device=event.device,
                kind=event.kind,
                requested_bytes=event.requested_bytes,
                capacity_bytes=event.capacity_bytes,
                device_free_bytes=event.device_free_bytes,
                time=time.time(),
                message=event.message,
                context=ctx,
                stats=stats,
            )
            snapshot = torch.cuda.memory._snapshot()
            stem = f"oom-{self._count}"
            snap_path = self.out_dir / f"{stem}-snapshot.pickle"
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(snap_path, "wb") as f:
                pickle.dump(snapshot, f)
            (self.out_dir / f"{stem}{EVENT_SUFFIX}").write_text(
                json.dumps(event.to_json(str(snap_path)), indent=2, default=str), encoding="utf-8")
            found = post_mortem(snapshot, event, snapshot_file=str(snap_path), model=self.model, spec=self.spec)
            paths = write_report(found, self.out_dir, stem)
            self.reports.append(paths["md"])
            log.warning("vramscope: CUDA out of memory; post-mortem in %s", paths["md"])
            return paths["md"]
        except Exception:
            log.exception("vramscope: could not write the OOM post-mortem")
            return None
