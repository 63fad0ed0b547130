"""A distributed run's report against its plan: the strategy the monitor saw, each rank's peak beside the
per-rank plan (``vramscope plan --gpus N --strategy S --json``).

The monitor writes the strategy beside its log (``<log stem>.strategy.json``, by
:meth:`vramscope.integrations.loop.MemoryMonitor.note_strategy`); this module only reads files and compares
numbers already in the report's summary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vramscope.inputfile import FileTooLargeError, NotRegularFileError, read_regular_file

SIDE_FILE_LIMIT = 16 << 20  # a plan or a strategy file is a few kB; 16 MiB is not one
STRATEGY_NAMES = {"ddp": "DDP", "fsdp": "FSDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
                  "zero": "ZeRO", "split": "split", "single": "one process"}


class PlanFileError(ValueError):
    """A --plan file that is not a plan: the message says what to pass."""


def strategy_beside(log_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The strategy the monitor recorded beside ``log_path`` (``mem.csv`` -> ``mem.strategy.json``), if any.
    The same name rule as the monitor's (the log's name without its last suffix)."""
    path = Path(os.fspath(log_path))
    candidate = path.with_name(path.stem + ".strategy.json") if path.suffix else Path(f"{path}.strategy.json")
    try:
        # Bounded like every input: a FIFO or device of that name is passed over, never read or waited on.
        data = json.loads(read_regular_file(candidate, "a strategy file", limit=SIDE_FILE_LIMIT).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("strategy"), str) else None


def read_plan(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A plan saved by ``vramscope plan ... --json`` (with or without ``--gpus``), as a per-GPU plan.

    Returns ``{"strategy", "world_size", "per_gpu": [{"peak_allocated_bytes", "process_bytes", ...}]}``.

    Raises:
        PlanFileError: unreadable, not JSON, or not a plan.
    """
    hint = "save one with: vramscope plan ... --gpus N --strategy S --json > plan.json"
    try:
        data = json.loads(read_regular_file(path, "a plan from 'vramscope plan ... --json'",
                                            limit=SIDE_FILE_LIMIT).decode("utf-8"))
    except (NotRegularFileError, FileTooLargeError) as exc:  # /dev/zero, a FIFO, a huge file
        raise PlanFileError(f"--plan: {exc}") from None
    except FileNotFoundError:
        raise PlanFileError(f"--plan {path}: no such file; {hint}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlanFileError(f"--plan {path} cannot be read as JSON ({type(exc).__name__}); {hint}") from None
    if not isinstance(data, dict):
        raise PlanFileError(f"--plan {path} is not a plan; {hint}")
    multi = (data.get("gpus") or {}).get("plan") if isinstance(data.get("gpus"), dict) else None
    if isinstance(multi, dict) and isinstance(multi.get("per_gpu"), list) and multi["per_gpu"]:
        return {"strategy": multi.get("strategy"), "world_size": multi.get("world_size"), "per_gpu": multi["per_gpu"]}
    if isinstance(data.get("peak_allocated_bytes"), int) and isinstance(data.get("process_bytes"), int):
        return {"strategy": "single", "world_size": 1,
                "per_gpu": [{"peak_allocated_bytes": data["peak_allocated_bytes"],
                             "process_bytes": data["process_bytes"]}]}
    raise PlanFileError(f"--plan {path} holds no per-GPU figures; {hint}")


def _error(measured: Any, planned: Any) -> float | None:
    if isinstance(measured, int) and isinstance(planned, int) and measured > 0:
        return round((planned - measured) / measured, 4)
    return None


def check(summary: dict[str, Any], plan: dict[str, Any] | None, strategy: dict[str, Any] | None) -> dict[str, Any]:
    """``{"strategy": {...} | None, "plan_strategy", "plan_world_size", "ranks": [...], "note"}``: each rank's
    (or, for a split, each GPU's) measured peak allocated and device memory beside the plan's."""
    out: dict[str, Any] = {"strategy": strategy}
    if plan is None:
        return out
    out.update(plan_strategy=plan.get("strategy"), plan_world_size=plan.get("world_size"))
    per_gpu = plan["per_gpu"]
    measured: list[tuple[str, int, dict[str, Any]]] = []
    if summary.get("ranks"):
        measured = [("rank", int(r["rank"]), {"allocated": r.get("peak_allocated_bytes"),
                                             "device": r.get("peak_device_used_bytes")}) for r in summary["ranks"]]
    else:
        for key, dev in (summary.get("devices") or {}).items():
            if key == "host":
                continue
            peaks = dev.get("peaks") or {}
            device = (peaks.get("process_bytes") or peaks.get("device_used_bytes") or {}).get("bytes")
            measured.append(("gpu", int(dev.get("gpu", 0) or 0),
                             {"allocated": (peaks.get("peak_allocated_bytes") or {}).get("bytes"), "device": device}))
    rows = []
    for i, (kind, index, m) in enumerate(measured):
        p = per_gpu[min(i, len(per_gpu) - 1)] if plan.get("strategy") == "split" else per_gpu[0]
        rows.append({kind: index, "measured_peak_allocated_bytes": m["allocated"],
                     "planned_peak_allocated_bytes": p.get("peak_allocated_bytes"),
                     "allocated_error": _error(m["allocated"], p.get("peak_allocated_bytes")),
                     "measured_device_bytes": m["device"], "planned_process_bytes": p.get("process_bytes"),
                     "device_error": _error(m["device"], p.get("process_bytes"))})
    out["ranks"] = rows
    seen = (strategy or {}).get("strategy")
    planned = plan.get("strategy")
    notes = []
    if seen and planned and seen != planned and not (seen == "single" and planned == "single"):
        notes.append(f"the plan is for {STRATEGY_NAMES.get(planned, planned)}, the run was "
                     f"{STRATEGY_NAMES.get(seen, seen)}")
    world = (strategy or {}).get("world_size")
    if isinstance(world, int) and isinstance(plan.get("world_size"), int) and world != plan["world_size"] \
            and planned != "split":
        notes.append(f"the plan is for {plan['world_size']} GPUs, the run had {world} ranks")
    out["note"] = "; ".join(notes) or None
    return out


__all__ = ["PlanFileError", "check", "read_plan", "strategy_beside"]
