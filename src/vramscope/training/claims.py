"""Which logs this process has written: a second monitor on the same log starts a new file, said in one line.

A notebook cell run again builds a new Trainer and a new callback on the same log while the first one may still
hold it (training interrupted: ``on_train_end`` never came), and ``train()`` called twice starts a second run on
a log whose first run is complete. Neither may disable the new monitor ("being written by another process": the
lock is per open file, so this process's own earlier writer holds it too) or overwrite the first run's rows:
the earlier writer is closed, and the new run writes the next free name beside it (``mem.csv`` -> ``mem-2.csv``).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Protocol

from vramscope.logs.files import free_log_name

log = logging.getLogger("vramscope.integrations.loop")


class Closable(Protocol):
    @property
    def closed(self) -> bool: ...

    def close(self) -> None: ...


_WRITTEN: dict[str, weakref.ref[Closable] | None] = {}  # real path -> its writer (None once it is gone)
_LOCK = threading.Lock()


def claim_log(path: str, writer: Closable) -> str:
    """The path ``writer`` should write: ``path``, or the next free name when this process wrote ``path`` before.

    An earlier writer of ``path`` in this process that is still open is closed first (its rows stay whole).
    """
    with _LOCK:
        key = os.path.realpath(path)
        if key in _WRITTEN:
            earlier_ref = _WRITTEN[key]
            earlier = earlier_ref() if earlier_ref is not None else None
            was_open = earlier is not None and not earlier.closed
            if was_open and earlier is not None:
                earlier.close()
            chosen = free_log_name(path)
            why = "was still being written by an earlier monitor in this process (closed now)" if was_open \
                else "holds an earlier run of this process"
            log.warning("vramscope: %s %s; this run's memory goes to %s", path, why, chosen)
            path, key = chosen, os.path.realpath(chosen)
        _WRITTEN[key] = weakref.ref(writer)
        return path
