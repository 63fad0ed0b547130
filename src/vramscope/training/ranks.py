"""Which rank this process is, and where each rank's files go (``mem.csv``, ``mem.rank3.csv``, ``mem.oom/``,
``mem.analysis.json``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from vramscope.output.atomic import write_atomically
from vramscope.output.names import RANK_TAG, sibling


def current_rank() -> int:
    """This process's rank: torch.distributed's when initialised, else ``$RANK``, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank())
        except (AttributeError, RuntimeError):
            pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def rank_path(path: str, rank: int) -> str:
    """``mem.csv`` for rank 0, ``mem.rank3.csv`` for rank 3 (:func:`vramscope.output.names.sibling`)."""
    return path if rank == 0 else sibling(path, tag=f"{RANK_TAG}{rank}")


def beside(path: str, suffix: str) -> str:
    """``runs/mem.csv`` + ``.analysis.json`` -> ``runs/mem.analysis.json`` (:func:`vramscope.output.names.sibling`)."""
    return sibling(path, suffix=suffix)


def write_json_beside(log_path: str, suffix: str, data: Any) -> str:
    """Write ``data`` as JSON to ``<log stem><suffix>`` beside the log, whole or not at all; returns its path.

    Atomically: on a full disk the old file (or none) stays, never a 0-byte or half one.
    """
    path = beside(log_path, suffix)
    write_atomically(path, json.dumps(data, indent=1, default=str).encode("utf-8"))
    return path
