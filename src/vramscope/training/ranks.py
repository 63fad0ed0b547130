"""Which rank this process is, and where each rank's files go (``mem.csv``, ``mem.rank3.csv``, ``mem.oom/``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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
    """``mem.csv`` for rank 0, ``mem.rank3.csv`` for rank 3."""
    if rank == 0:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def beside(path: str, suffix: str) -> str:
    """``runs/mem.csv`` + ``.analysis.json`` -> ``runs/mem.analysis.json``."""
    p = Path(path)
    return str(p.with_name(p.stem + suffix))
