"""Host memory through psutil (the only module that imports ``psutil``).

Reads the resident memory of a whole process tree (a launcher and its workers, dataloader forks)
and of the machine, and names processes for display.
"""

from __future__ import annotations

import os
import time

import psutil

from vramscope.types import HostReading


class HostBackend:
    """RSS of the process tree rooted at ``root_pid`` (default: this process) and system memory."""

    def __init__(self, root_pid: int | None = None, include_root: bool = True, tree_refresh_s: float = 1.0) -> None:
        self.root_pid = root_pid if root_pid is not None else os.getpid()
        self._include_root = include_root
        self._root: psutil.Process | None = None
        self._names: dict[int, tuple[str, str]] = {}
        # Listing descendants reads /proc for every process on the machine (~8 ms on a quiet box), so the
        # list is refreshed at most this often; a new worker shows up within that time.
        self._tree_refresh_s = tree_refresh_s
        self._tree: frozenset[int] = frozenset()
        self._tree_time = -float("inf")

    def _root_process(self) -> psutil.Process | None:
        if self._root is None:
            try:
                self._root = psutil.Process(self.root_pid)
            except psutil.Error:
                return None
        return self._root

    def tree_pids(self) -> frozenset[int]:
        """The root and every live descendant; empty once the root has gone."""
        root = self._root_process()
        if root is None:
            return frozenset()
        now = time.monotonic()
        if now - self._tree_time < self._tree_refresh_s:
            return self._tree
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            return frozenset()
        pids = {c.pid for c in children}
        if self._include_root:
            pids.add(root.pid)
        self._tree, self._tree_time = frozenset(pids), now
        return self._tree

    def tree_rss_bytes(self, pids: frozenset[int] | None = None) -> int | None:
        total = 0
        seen = False
        for pid in pids if pids is not None else self.tree_pids():
            try:
                total += psutil.Process(pid).memory_info().rss
                seen = True
            except psutil.Error:  # exited between listing and reading
                continue
        return total if seen else None

    def read(self, pids: frozenset[int] | None = None) -> HostReading:
        vm = psutil.virtual_memory()
        return HostReading(
            rss_bytes=self.tree_rss_bytes(pids),
            system_used_bytes=int(vm.total - vm.available),
            system_total_bytes=int(vm.total),
        )

    def describe(self, pid: int) -> tuple[str, str]:
        """(name, command line) of a process, cached by pid; ('?', '') when it cannot be read."""
        cached = self._names.get(pid)
        if cached is not None:
            return cached
        try:
            proc = psutil.Process(pid)
            info = (proc.name(), " ".join(proc.cmdline()))
        except psutil.Error:
            # Another container's process, or gone: not cached, it may become readable.
            return ("?", "")
        if len(self._names) > 4096:  # pids are reused; keep the cache bounded
            self._names.clear()
        self._names[pid] = info
        return info
