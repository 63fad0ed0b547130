"""The multi-GPU planner against the rehearsed truth grid (issue 27), reproducibly: every case of
``bench/results/multigpu/rehearsal_grid.json`` planned again with the planner as it is now (the same
``plan()`` the grid's runner uses: ``planner/distributed.py`` over the single-GPU model, in the precision the
grid's loop runs), written to ``points.json`` beside it with the errors, and the Markdown table of
docs/distributed.md printed.

Host memory under offload is what the offload adds: the rise of the process's RSS over the steps (from just before
the wrap) less the same rise of the case's twin without offload (same shape, strategy and world size). Every
case's RSS grows by about 0.56 GiB over its steps, offload or not (CUDA's lazily loaded kernel modules,
cuBLAS, autograd's threads); the plan's host figure has none of that. Where the grid has direct counts
(``host_pinned_bytes``: the pinned host allocator's blocks; ``host_optimizer_cpu_bytes``: the CPU AdamW states),
their sum is written beside it as ``counted_host_bytes``.

    python bench/multigpu_compare.py                     # writes bench/results/multigpu/points.json, prints the table
    python bench/multigpu_compare.py --grid G.json --out P.json
    python bench/multigpu_compare.py --grid bench/results/multigpu/rehearsal_grid_autocast.json   # points_autocast.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rehearsal_grid as grid

RESULTS = Path(__file__).resolve().parent / "results" / "multigpu"
ISSUE_FIELDS = ("strategy", "world_size", "how", "rank", "arch", "batch", "seq", "offload",
                "measured_peak_allocated_bytes", "planned_peak_allocated_bytes", "measured_host_bytes",
                "planned_host_bytes")
ARCH_KEYS = {name: key for key, name in grid.ARCHS.items()}


def case_of(row: dict[str, Any]) -> grid.Case:
    arch = ARCH_KEYS.get(row["arch"], row["arch"])
    return grid.Case(arch=arch, strategy=row["strategy"], world_size=int(row["world_size"]), offload=row["offload"],
                     batch=int(row["batch"]), seq=int(row["seq"]),
                     build=row.get("build") or ("meta" if arch == "70b" else "checkpoint"),
                     precision=row.get("precision") or "fp32")


def _rss_growth(row: dict[str, Any]) -> int | None:
    peak, before = row.get("rss_peak_bytes"), row.get("rss_before_wrap_bytes")
    return peak - before if isinstance(peak, int) and isinstance(before, int) else None


def _twin(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    for other in rows:
        if (other.get("status") == "ok" and other["offload"] == "none" and other["arch"] == row["arch"]
                and other["strategy"] == row["strategy"] and other["world_size"] == row["world_size"]
                and other.get("precision", "fp32") == row.get("precision", "fp32")):
            return other
    return None


def _error(planned: int | None, measured: int | None) -> float | None:
    if not isinstance(planned, int) or not isinstance(measured, int) or measured <= 0:
        return None
    return round((planned - measured) / measured, 4)


def point(rows: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any]:
    """One object of points.json: the issue's fields, planned now, and what they were measured against."""
    case = case_of(row)
    planned = grid.plan(case, grid.config_of(case.arch))
    ok = row.get("status") == "ok"
    growth = _rss_growth(row) if ok else None
    offload = case.offload != "none"
    twin = _twin(rows, row) if offload and ok else None
    baseline = _rss_growth(twin) if twin is not None else None
    if not ok:
        measured_host = None
    elif offload:
        measured_host = growth - baseline if growth is not None and baseline is not None else None
    else:
        measured_host = growth  # the reading's baseline itself: the plan says 0
    out: dict[str, Any] = {
        "strategy": row["strategy"], "world_size": row["world_size"], "how": row.get("how", "fake_pg"),
        "rank": row.get("rank", 0), "arch": row["arch"], "batch": row["batch"], "seq": row["seq"],
        "offload": row["offload"],
        "measured_peak_allocated_bytes": row.get("measured_peak_allocated_bytes") if ok else None,
        "planned_peak_allocated_bytes": planned["planned_peak_allocated_bytes"],
        "measured_host_bytes": measured_host,
        "planned_host_bytes": planned["planned_host_bytes"],
        "status": row.get("status"), "build": case.build, "precision": case.precision,
        "planned_framework": planned["planned_framework"],
        "planned_peak_phase": planned["planned_peak_phase"],
        "allocated_error": _error(planned["planned_peak_allocated_bytes"],
                                  row.get("measured_peak_allocated_bytes") if ok else None),
        "host_error": _error(planned["planned_host_bytes"], measured_host) if offload else None,
        "host_rss_growth_bytes": growth, "host_baseline_bytes": baseline,
        # what the grid's runner planned when it measured (its plan of that day), for before/after
        "planned_at_measurement_bytes": row.get("planned_peak_allocated_bytes"),
        "planned_host_at_measurement_bytes": row.get("planned_host_bytes"),
    }
    pinned, states = row.get("host_pinned_bytes"), row.get("host_optimizer_cpu_bytes")
    if offload and isinstance(pinned, int) and isinstance(states, int):
        out["counted_host_bytes"] = pinned + states
        out["counted_host_error"] = _error(planned["planned_host_bytes"], pinned + states)
    return out


def _spread(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"points": 0}
    return {"points": len(errors), "median_abs": round(statistics.median(abs(e) for e in errors), 4),
            "worst_abs": round(max(abs(e) for e in errors), 4), "median": round(statistics.median(errors), 4),
            "low": round(min(errors), 4), "high": round(max(errors), 4)}


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst errors: allocated over every measured case, host over the offloaded ones; and, as it was
    measured, the grid's own plan against the allocated peak and against the bare RSS growth."""
    alloc = [p["allocated_error"] for p in points if p["allocated_error"] is not None]
    host = [p["host_error"] for p in points if p["host_error"] is not None]
    before = [e for p in points
              if (e := _error(p["planned_at_measurement_bytes"], p["measured_peak_allocated_bytes"])) is not None]
    before_host = [e for p in points if p["offload"] != "none"
                   and (e := _error(p["planned_host_at_measurement_bytes"], p["host_rss_growth_bytes"])) is not None]
    counted = [p["counted_host_error"] for p in points if p.get("counted_host_error") is not None]
    return {"allocated": _spread(alloc), "host_under_offload": _spread(host),
            # the pinned host blocks and the CPU optimizer states, counted inside the case: what offload puts on
            # the host, without the RSS reading's CUDA libraries and threads
            "host_under_offload_counted": _spread(counted),
            "as_measured": {"allocated": _spread(before), "host_under_offload": _spread(before_host)},
            "goal": {"allocated_median_abs": 0.03, "allocated_worst_abs": 0.08, "host_under_offload_abs": 0.10}}


def _gib(v: Any) -> str:
    return f"{v / 2**30:.2f} GiB" if isinstance(v, int) else "-"


def _pct(v: Any) -> str:
    return f"{v * 100:+.1f}%" if isinstance(v, float) else "-"


def table(points: list[dict[str, Any]]) -> str:
    """strategy x world size x offload, planned vs rehearsed (the table of docs/distributed.md)."""
    lines = ["| model | strategy | GPUs | offload | planned alloc | rehearsed alloc | error | planned host | "
             "rehearsed host (RSS) | host error | counted host | counted error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = list(grid.ARCHS.values())
    order = sorted(points, key=lambda p: (names.index(p["arch"]) if p["arch"] in names else len(names), p["arch"],
                                          p["strategy"] != "fsdp", p["offload"], p["world_size"]))
    for p in order:
        host = p["offload"] != "none"
        measured = _gib(p["measured_peak_allocated_bytes"]) if p["status"] == "ok" else f"({p['status']})"
        lines.append(f"| {p['arch']} | {p['strategy'].upper()} | {p['world_size']} | {p['offload']} | "
                     f"{_gib(p['planned_peak_allocated_bytes'])} | {measured} | {_pct(p['allocated_error'])} | "
                     f"{_gib(p['planned_host_bytes']) if host else '-'} | "
                     f"{_gib(p['measured_host_bytes']) if host else '-'} | {_pct(p['host_error'])} | "
                     f"{_gib(p.get('counted_host_bytes'))} | {_pct(p.get('counted_host_error'))} |")
    return "\n".join(lines)


def points_file(grid_file: Path) -> Path:
    """points.json beside rehearsal_grid.json; points_autocast.json beside rehearsal_grid_autocast.json."""
    name = grid_file.name
    return grid_file.with_name(name.replace("rehearsal_grid", "points") if name.startswith("rehearsal_grid")
                               else "points.json")


class GridError(Exception):
    """A grid file this script cannot read; the message says what to pass instead."""


def compare(grid_file: Path, out_file: Path) -> dict[str, Any]:
    try:
        rows = json.loads(grid_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GridError(f"{grid_file}: not a readable JSON file ({exc}); pass the rehearsal_grid.json "
                        "bench/rehearsal_grid.py wrote") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise GridError(f"{grid_file}: expected a list of case objects, as bench/rehearsal_grid.py writes")
    points = [point(rows, r) for r in rows]
    result = {"source": grid_file.name, "summary": summary(points), "points": points}
    out_file.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", type=Path, default=RESULTS / "rehearsal_grid.json")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: beside --grid, points.json (points_autocast.json for ..._autocast.json)")
    args = parser.parse_args(argv)
    if not args.grid.is_file():
        print(f"no grid at {args.grid}; run bench/rehearsal_grid.py first (or pass --grid)", file=sys.stderr)
        return 2
    try:
        result = compare(args.grid, args.out or points_file(args.grid))
    except GridError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(table(result["points"]))
    s = result["summary"]
    for name, key in (("allocated", "allocated"), ("host under offload", "host_under_offload"),
                      ("host under offload, counted", "host_under_offload_counted")):
        now, then = s[key], s["as_measured"].get(key, {})
        if now.get("points"):
            before = (f" (the plan measured against: median {then['median_abs'] * 100:.1f}%, worst "
                      f"{then['worst_abs'] * 100:.1f}%)") if then.get("points") else ""
            print(f"{name}: {now['points']} points, median |error| {now['median_abs'] * 100:.2f}%, worst "
                  f"{now['worst_abs'] * 100:.2f}%{before}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
