"""The leak detector over the trace corpus: detection delay and false alarms, as a Markdown table.

    python bench/leak_table.py                                   # print the table
    python bench/leak_table.py --write docs/leak-detection.md    # refresh the table in the docs

Reads every ``*.csv`` with a ``.truth.json`` beside it under ``tests/data/traces/`` (the CPU traces and,
once recorded, the H200 ones from ``bench/record_traces.py``). Each trace is replayed as the live monitor
sees it: the leak test on every prefix ending every ``--every`` steps. A detection on a clean trace, or
before a planted leak began, is a false alarm; the delay is the first detection at or after the leak's
first step minus that step. The final verdict is :func:`vramscope.analysis.summary.analyze` on the whole
trace. Nothing here is tuned per trace: the thresholds are the library's defaults.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO / "tests" / "data" / "traces"
START = "<!-- leak-table:start -->"
END = "<!-- leak-table:end -->"
MIB = 1024 * 1024


def primary_series(table: Any) -> Any:
    """The device the trace is about: the one whose leak signal is the allocator's, else the first."""
    from vramscope.analysis.summary import leak_series

    series = leak_series(table)
    ranked = sorted(series.values(), key=lambda s: (s.signal != "allocated_bytes", -len(s.xs)))
    return ranked[0] if ranked else None


def evaluate(csv_path: Path, every: int = 5) -> dict[str, Any]:
    """Replay one trace against its truth file."""
    from vramscope.analysis.leak import first_detection
    from vramscope.analysis.summary import analyze, config_for
    from vramscope.logs.reader import read_log

    truth = json.loads(csv_path.with_name(csv_path.stem + ".truth.json").read_text())
    table = read_log(csv_path)
    series = primary_series(table)
    final = analyze(table).to_json()
    start = truth.get("leak_start_step")
    config = config_for(series.signal)  # what analyze() and the live monitor use for this signal
    first_x, _ = first_detection(series.xs, series.ys, every=every, config=config, tokens=series.tokens)
    false_alarm = first_x is not None and (not truth["leak"] or (start is not None and first_x < start))
    caught_x = None
    if truth["leak"]:
        caught_x, _ = first_detection(series.xs, series.ys, every=every, config=config, after=start,
                                      tokens=series.tokens)
    leak = final["leak"]["devices"][series.key]
    return {
        "trace": f"{csv_path.parent.name}/{csv_path.stem}",
        "device": truth["device"],
        "integration": truth["integration"],
        "signal": series.signal,
        "expect": truth["expect"],
        "leak": truth["leak"],
        "planted_mib_per_step": (truth["planted_bytes_per_step"] or 0) / MIB if truth["leak"] else None,
        "leak_start": start,
        "first_alarm": first_x,
        "false_alarm": false_alarm,
        "caught_at": caught_x,
        "delay": (caught_x - start) if caught_x is not None and start is not None else None,
        "final_kind": leak["kind"],
        "final_slope_mib": (leak["slope_bytes_per_step"] or 0) / MIB if leak["detected"] else None,
        "final_start": leak["start_step"],
        "steps": truth["steps"],
    }


def traces(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.csv") if p.with_name(p.stem + ".truth.json").is_file())


def markdown(rows: list[dict[str, Any]], every: int) -> str:
    def num(v: Any, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    lines = [
        f"Replayed every {every} steps with the default thresholds. *Delay*: steps from the leak's first step to the "
        "first detection. *False alarm*: a detection on a clean trace or before the leak began.",
        "",
        "| trace | device | planted MiB/step | leak from | caught at | delay | false alarm | final verdict "
        "| slope found MiB/step | start found |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        planted = num(r["planted_mib_per_step"]) if r["leak"] else "clean"
        alarm = f"**yes, step {r['first_alarm']:.0f}**" if r["false_alarm"] else "no"
        caught = num(r["caught_at"], "{:.0f}") if r["leak"] else "-"
        if r["leak"] and r["caught_at"] is None:
            caught = "**missed**"
        lines.append(
            f"| {r['trace']} | {r['device']} ({r['signal']}) | {planted} | {num(r['leak_start'], '{:.0f}')} | {caught} "
            f"| {num(r['delay'], '{:.0f}')} | {alarm} | {r['final_kind']} | {num(r['final_slope_mib'])} "
            f"| {num(r['final_start'], '{:.0f}')} |"
        )
    goal = [r for r in rows if r["leak"] and (r["planted_mib_per_step"] or 0) >= 1.0]
    met = [r for r in goal if r["delay"] is not None and r["delay"] <= 100]
    alarms = sum(1 for r in rows if r["false_alarm"])
    lines += [
        "",
        f"Goal (every planted leak of 1 MiB/step or more caught within 100 steps, no false alarm): "
        f"{len(met)} of {len(goal)} leaks caught in time; {alarms} false alarm(s) over {len(rows)} traces.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Detection delay and false alarms of the leak test over the corpus")
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of traces (searched recursively)")
    parser.add_argument("--every", type=int, default=5, help="replay the test every this many steps (default 5)")
    parser.add_argument("--write", type=Path, default=None,
                        help=f"replace the table between {START} and {END} in this Markdown file")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    paths = traces(args.traces)
    if not paths:
        parser.error(f"no traces (*.csv with a .truth.json) under {args.traces}")
    rows = [evaluate(p, args.every) for p in paths]
    table = markdown(rows, args.every)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.write is not None:
        text = args.write.read_text()
        if START not in text or END not in text:
            parser.error(f"{args.write} has no {START} ... {END} block to replace")
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
        args.write.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text))
        print(f"updated the table in {args.write} ({len(rows)} traces)", file=sys.stderr)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
