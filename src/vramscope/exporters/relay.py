"""A training process's series, relayed to the exporters of the ``vramscope run`` that started it.

``vramscope run --prometheus/--push`` samples the command from outside; the step, allocator, leak and forecast
series exist only inside the command's Trainers. The parent opens a unix datagram socket (:class:`RelayReceiver`)
and names it to the command in :data:`ENV_RELAY`; each Trainer's monitor opens a :class:`RelaySink` on it (the
``relay`` row of :mod:`~vramscope.exporters.registry`), which sends each sample and each change of the live
analysis as one JSON datagram; the parent hands them to its own exporters' collectors, where they become the
same series, with the same names, as an in-process exporter gives, under each sender's ``rank``.

This module owns the datagram, both ends: ``{"v": 1, "rank": "0", "sample": {...}}`` or
``{"v": 1, "rank": "0", "analysis": [[gpu, slope, steps], ...]}`` (gpu null: the whole run), at most
:data:`MAX_DATAGRAM` bytes. The sender never waits: a full socket, or a parent that is gone, drops the datagram
(one warning); the training never slows down or fails for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import socket
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vramscope.types import AllocatorReading, GpuReading, HostReading, Sample

log = logging.getLogger("vramscope.exporters")  # one logger for every exporter

ENV_RELAY = "VRAMSCOPE_RELAY"  # the socket's path, set by `vramscope run` for the command's Trainers
VERSION = 1
MAX_DATAGRAM = 32 * 1024  # a sample of 8 GPUs is about 3 KiB; anything larger is not ours
MAX_RANKS = 1024  # ranks one parent keeps; more senders than that are dropped

Analysis = dict[int | None, tuple[float | None, float | None]]


# -- the datagram ----------------------------------------------------------------------------------------------


def encode_sample(rank: str, sample: Sample) -> bytes:
    """One datagram for ``sample``: what the parent cannot see from outside (the GPU list only as the join's keys)."""
    body: dict[str, Any] = {
        "time": sample.time,
        "elapsed_s": sample.elapsed_s,
        "step": sample.step,
        "phase": sample.phase,
        "tokens": sample.tokens,
        "gpus": [[g.index, g.uuid] for g in sample.gpus],
        "allocator": [
            [r.device, r.allocated_bytes, r.reserved_bytes, r.active_bytes, r.inactive_split_bytes,
             r.peak_allocated_bytes, r.peak_reserved_bytes, r.num_alloc_retries, r.num_ooms, r.uuid]
            for r in sample.allocator
        ],
        "host": [sample.host.rss_bytes, sample.host.system_used_bytes, sample.host.system_total_bytes],
    }
    return _dump({"v": VERSION, "rank": rank, "sample": body})


def encode_analysis(rank: str, analysis: Analysis) -> bytes:
    """One datagram for a rank's whole live analysis (each GPU's leak slope and steps to OOM)."""
    return _dump({"v": VERSION, "rank": rank, "analysis": [[gpu, s, o] for gpu, (s, o) in analysis.items()]})


def _dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class Relayed:
    """A datagram, read: a rank and either its sample or its analysis."""

    rank: str
    sample: Sample | None = None
    analysis: Analysis | None = None


def decode(data: bytes) -> Relayed | None:
    """The datagram's content, or None for anything that is not a well-formed datagram of this version."""
    if len(data) > MAX_DATAGRAM:
        return None
    try:
        message = json.loads(data)
        if not isinstance(message, dict) or message.get("v") != VERSION:
            return None
        rank = str(message["rank"])[:32]
        if "sample" in message:
            return Relayed(rank, sample=_sample(message["sample"], rank))
        if "analysis" in message:
            table: Analysis = {}
            for gpu, slope, steps in message["analysis"]:
                table[None if gpu is None else int(gpu)] = (_number(slope), _number(steps))
            return Relayed(rank, analysis=table)
    except (ValueError, TypeError, KeyError):
        return None
    return None


def _sample(body: dict[str, Any], rank: str) -> Sample:
    allocator = tuple(
        AllocatorReading(int(a[0]), int(a[1]), int(a[2]), active_bytes=_int(a[3]), inactive_split_bytes=_int(a[4]),
                         peak_allocated_bytes=_int(a[5]), peak_reserved_bytes=_int(a[6]),
                         num_alloc_retries=_int(a[7]), num_ooms=_int(a[8]), uuid=_text(a[9]))
        for a in body.get("allocator", [])
    )
    rss, used, total = (_int(v) for v in body.get("host", [None, None, None]))
    return Sample(
        time=float(body["time"]),
        elapsed_s=float(body.get("elapsed_s") or 0.0),
        gpus=tuple(GpuReading(int(index), uuid=_text(uuid)) for index, uuid in body.get("gpus", [])),
        allocator=allocator,
        host=HostReading(rss_bytes=rss, system_used_bytes=used, system_total_bytes=total),
        step=_int(body.get("step")),
        phase=_text(body.get("phase")),
        tokens=_int(body.get("tokens")),
        extra={"rank": rank},
    )


def _int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _number(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _text(value: object) -> str | None:
    return None if value is None else str(value)[:200]


# -- the sender, in the training process -----------------------------------------------------------------------


class RelaySink:
    """Sends this process's samples and live analysis to the parent's socket at ``path``, never waiting.

    The rank is the first sample's (the monitor's own); samples of other ranks that pass through this process's
    sinks (rank 0's gathered rows) are not sent: each rank sends its own.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._rank: str | None = None
        self._analysis: Analysis = {}
        self._dropped = 0
        self._warned = False
        self._lock = threading.Lock()  # the training thread and the monitor's background sampler both write

    @property
    def where(self) -> str:
        """One line for people: where the series go."""
        return f"relaying the training's series to the vramscope run that started it ({self.path})"

    @property
    def dropped(self) -> int:
        """Datagrams not delivered (the socket full, the parent gone)."""
        return self._dropped

    def write(self, sample: Sample) -> None:
        rank = str(sample.extra.get("rank", 0))
        if self._rank is None:
            self._rank = rank
        elif rank != self._rank:
            return
        self._send(encode_sample(rank, sample))

    def set_analysis(
        self, leak_slope_bytes_per_step: float | None, steps_to_oom: float | None, gpu: int | None = None
    ) -> None:
        if leak_slope_bytes_per_step is None and steps_to_oom is None:
            if self._analysis.pop(gpu, None) is None:
                return
        else:
            self._analysis[gpu] = (_finite(leak_slope_bytes_per_step), _finite(steps_to_oom))
        self._send(encode_analysis(self._rank or "0", self._analysis))

    def _send(self, data: bytes) -> None:
        if len(data) > MAX_DATAGRAM:
            self._drop("a sample too large to relay")
            return
        with self._lock:
            try:
                self._sock.sendto(data, self.path)
            except BlockingIOError:
                self._drop("the socket is full")
            except OSError as exc:  # the parent is gone (ECONNREFUSED, ENOENT), or the socket is closed
                self._drop(exc.strerror or type(exc).__name__)

    def _drop(self, why: str) -> None:
        self._dropped += 1
        if not self._warned:
            self._warned = True
            log.warning("vramscope: not every sample reaches the exporter of vramscope run (%s); "
                        "training goes on, the log is complete", why)

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._sock.close()


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


# -- the receiver, in vramscope run ----------------------------------------------------------------------------


class RelayReceiver:
    """The parent's socket: a private folder with one datagram socket, read on a daemon thread into ``targets``.

    Each target is an exporter with a ``collector`` (:class:`~vramscope.exporters.collector.SampleCollector`).
    It is a sink of the run's sampler too (``write`` does nothing), put before the exporters so that its
    :meth:`close` takes the datagrams still queued, the training's last step, before they make their last push.
    """

    def __init__(self, targets: Sequence[Any]) -> None:
        self._targets = list(targets)
        self._folder = tempfile.mkdtemp(prefix="vramscope-relay-")  # 0700: only this user can send to it
        self.path = os.path.join(self._folder, "relay.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.bind(self.path)
            self._sock.setblocking(False)
            # Room for a burst of steps while a scrape holds the collector's lock (the kernel caps it).
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        except OSError:
            self._sock.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.received = 0
        self._stop = threading.Event()
        self._ranks: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="vramscope-relay", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        """What the command's environment needs for its Trainers to relay here."""
        return {ENV_RELAY: self.path}

    @property
    def where(self) -> str:
        return "the command's HF and Lightning Trainers add their step, allocator, leak and forecast series"

    def write(self, sample: Sample) -> None:
        """A sink of the run's sampler only to be closed in order: the run's own samples go to the exporters."""

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._sock], [], [], 0.2)
            except (OSError, ValueError):  # closed under us
                return
            if ready:
                self.drain()

    def drain(self) -> int:
        """Hand every datagram waiting now to the targets; returns how many were taken."""
        taken = 0
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return taken
            except OSError:
                return taken
            taken += 1
            message = decode(data)
            if message is None:
                continue
            if message.rank not in self._ranks:
                if len(self._ranks) >= MAX_RANKS:
                    continue
                self._ranks.add(message.rank)
            self.received += 1
            for target in self._targets:
                collector = getattr(target, "collector", None)
                if collector is None:
                    continue
                with contextlib.suppress(Exception):  # an exporter's failure is never the run's
                    if message.sample is not None:
                        collector.update_rank(message.rank, message.sample)
                    elif message.analysis is not None:
                        collector.set_rank_analysis(message.rank, message.analysis)

    def close(self) -> None:
        """Take what is still queued, stop the thread, remove the socket and its folder (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.drain()
        with contextlib.suppress(OSError):
            self._sock.close()
        shutil.rmtree(self._folder, ignore_errors=True)
