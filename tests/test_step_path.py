"""What a logged step reads about this process's host memory: the monitor's own process, read through one kept
handle, and still every row's fresh value (the handle is not a cached number)."""

from __future__ import annotations

import os
from pathlib import Path

from vramscope.backends.host import HostBackend
from vramscope.training.readers import ThisProcess

PAGE = os.sysconf("SC_PAGE_SIZE")


def statm_rss() -> int:
    """This process's resident set, as the kernel says it (/proc/self/statm, in pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


def test_this_process_reads_its_own_rss_fresh_at_every_row() -> None:
    host = ThisProcess()
    pids = host.tree_pids()
    assert pids == {os.getpid()}
    before = host.read(pids).rss_bytes
    assert before is not None and abs(before - statm_rss()) < 16 * 2**20
    held = bytearray(256 * 2**20)  # touched (zero-filled): resident
    after = host.read(pids).rss_bytes
    assert after is not None and after - before > 200 * 2**20  # the same handle, a new reading
    tree = HostBackend().tree_rss_bytes(pids)  # a handle made for the reading, the tree's way: the same figure
    assert tree is not None and abs(tree - after) < 16 * 2**20
    del held
