"""Regenerate the tables of docs/benchmarks.md from the JSON results in bench/results/.

The page's prose is written by hand; only the blocks between ``<!-- BEGIN GENERATED: name -->`` and
``<!-- END GENERATED: name -->`` are rewritten, so rerunning after a new GPU run refreshes every number
and nothing else. The planner's accuracy table and the tuner's trial counts are copied from
docs/planner.md and docs/tuner.md (their owners keep them there), so this page is the one place to
compare.

    python bench/make_benchmarks_md.py                      # bench/results/*.json -> docs/benchmarks.md
    python bench/make_benchmarks_md.py --results DIR --doc OUT.md --allow-tiny
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED: (?P=name) -->)", re.DOTALL
)
RERUN_HINT = "not measured yet: run the commands under “How to rerun” on a GPU, then make_benchmarks_md.py"

BENCHMARKS = ("overhead", "reading_cost", "peak_capture")

ARM_LABELS = {
    "none": "no monitor (baseline)",
    "hf_callback": "vramscope HF callback, every step",
    "loop_monitor": "vramscope `MemoryMonitor`, every step",
    "run_10hz": "`vramscope run` sampler at 10 Hz (in-process)",
    "hf_memory_tracker": "transformers `skip_memory_metrics=False`",
    "nvidia_smi_every_step": "`nvidia-smi` subprocess every step",
}


class ResultError(ValueError):
    """A result file that cannot be used (a tiny run where a real one is expected, bad JSON)."""


def load_results(directory: Path, allow_tiny: bool) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    # Only this page's benchmarks: other scripts keep their own results in the same folder.
    for path in sorted(directory / f"{name}.json" for name in BENCHMARKS):
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ResultError(f"{path}: not valid JSON ({exc}); rerun the benchmark that wrote it") from exc
        if not isinstance(data, dict) or "benchmark" not in data:
            continue  # not a result file
        if data.get("mode") == "tiny" and not allow_tiny:
            raise ResultError(
                f"{path} is a CPU --tiny run, not a measurement; rerun it on the GPU or pass --allow-tiny"
            )
        results[str(data["benchmark"])] = data
    return results


# -- formatting --------------------------------------------------------------------------------------
def gib(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value / GIB:.{digits}f}"


def pct(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f} %"


def secs(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} µs"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def tiny_note(data: dict[str, Any]) -> str:
    if data.get("mode") == "tiny":
        return "\n\n> CPU `--tiny` smoke run: these numbers prove the script runs; they measure nothing real."
    return ""


def source_line(data: dict[str, Any], name: str) -> str:
    env = data.get("environment", {})
    device = env.get("device", {})
    return (
        f"Measured {env.get('date', '?')} on {device.get('name') or device.get('kind', '?')}; "
        f"raw data: `bench/results/{name}.json`."
    )


# -- sections ----------------------------------------------------------------------------------------
def overhead_section(data: dict[str, Any] | None) -> str:
    if data is None:
        return RERUN_HINT
    steps = data["step_seconds"]
    over = data.get("step_time_overhead_pct", {})
    ci = data.get("step_time_overhead_ci95_pct", {})
    rows = []
    for arm in data["arms"]:
        s = steps[arm]
        band = ci.get(arm)
        rows.append(
            [
                ARM_LABELS.get(arm, arm),
                secs(s["median"]),
                f"{secs(s['p25'])} to {secs(s['p75'])}",
                "—" if arm == "none" else pct(over.get(arm)),
                "—" if arm == "none" or band is None else f"{band[0]:+.2f} to {band[1]:+.2f} %",
                str(s["n"]),
            ]
        )
    model = data["model"]
    proto = data["protocol"]
    out = [
        f"{model['name']}, {'4-bit QLoRA' if model.get('quantized') else 'unquantized (CPU)'}, batch "
        f"{data['batch']} x {data['seq_len']} tokens, gradient checkpointing; {proto['blocks']} interleaved "
        f"blocks, {proto['timed_steps_per_block']} timed steps per arm and block after {proto['settle_steps']} "
        f"settling step(s), {proto['warmup_steps']} warm-up steps excluded.",
        "",
        table(
            ["monitor", "median step", "p25 to p75", "overhead vs baseline", "95% CI", "timed steps"],
            rows,
        ),
    ]
    if data.get("baseline_block_spread_pct") is not None:
        out += [
            "",
            f"Baseline's own block-to-block spread (median of |block / overall - 1|): "
            f"{data['baseline_block_spread_pct']:.2f} %.",
        ]
    goal = data.get("within_goal", {})
    if goal:
        verdicts = ", ".join(f"{ARM_LABELS.get(a, a)}: {'yes' if ok else 'no'}" for a, ok in goal.items())
        out += ["", f"Upper end of the 95% CI below the {data.get('goal_pct', 0.5)} % goal — {verdicts}."]
    cost = data.get("monitor_analysis_cost") or {}
    if cost.get("available") and cost.get("by_history"):
        parts = ", ".join(f"{h['rows']} rows {secs(h['median_s'])}" for h in cost["by_history"])
        line = (
            f"`MemoryMonitor`'s leak test and forecast (every {cost['analyze_every']} logged rows, at most "
            f"every {cost['analyze_min_interval_s']:g} s; not reached inside the short blocks): {parts}"
        )
        if cost.get("amortized_pct_of_step") is not None:
            line += f"; amortised over the steps between two runs: {cost['amortized_pct_of_step']:.3f} % of a step"
        out += ["", line + "."]
    if data.get("unavailable"):
        out += [
            "",
            "Not measured here: "
            + "; ".join(f"{ARM_LABELS.get(a, a)} ({why})" for a, why in data["unavailable"].items())
            + ".",
        ]
    out += ["", source_line(data, "overhead") + tiny_note(data)]
    return "\n".join(out)


def reading_cost_section(data: dict[str, Any] | None) -> str:
    if data is None:
        return RERUN_HINT
    sources = data["sources"]
    live = sorted((k for k, v in sources.items() if v["available"]), key=lambda k: sources[k]["summary_s"]["median"])
    rows = []
    for name in live:
        s = sources[name]["summary_s"]
        rows.append(
            [
                f"`{name}`",
                sources[name]["what"],
                secs(s["median"]),
                f"{secs(s['p25'])} to {secs(s['p75'])}",
                str(s["n"]),
            ]
        )
    out = [table(["source", "what one reading is", "median", "p25 to p75", "calls"], rows)]
    missing = [k for k, v in sources.items() if not v["available"]]
    if missing:
        out += [
            "",
            "Unavailable in this run: " + "; ".join(f"`{k}` ({sources[k].get('reason')})" for k in missing) + ".",
        ]
    out += ["", source_line(data, "reading_cost") + tiny_note(data)]
    return "\n".join(out)


def peak_capture_section(data: dict[str, Any] | None) -> str:
    if data is None:
        return RERUN_HINT
    truth = data["truth"]
    true_alloc = truth.get("max_allocated_bytes")
    rows = []
    for m in data["methods"]:
        reported = m.get("reported_bytes")
        if reported is None:
            seen, diff = f"n/a ({m.get('reason')})", "n/a"
        else:
            seen = gib(reported, 3)
            diff = f"{gib(m['error_bytes'], 3)} GiB ({pct(m['error_pct'])})" if "error_bytes" in m else "n/a"
        rows.append([f"`{m['method']}`", m["reads"], m["during"], seen, diff, str(m.get("samples"))])
    refs = truth.get("reference_passes_allocated_bytes") or []
    out = [
        f"{data['model']['name']}, batch {data['batch']} x {data['seq_len']} tokens; fp32 logits alone are "
        f"{gib(data.get('logits_bytes_fp32'))} GiB. Four passes of {data['steps_per_pass']} steps.",
        "",
        f"True peak (torch `max_memory_allocated`, reference passes): **{gib(true_alloc, 3)} GiB** "
        f"(passes: {', '.join(gib(r, 3) for r in refs)} GiB); "
        f"reserved peak {gib(truth.get('max_reserved_bytes'), 3)} GiB.",
        "",
        table(["method", "reads", "during", "reports (GiB)", "vs true peak", "readings"], rows),
    ]
    outside = data.get("nvml_minus_reserved_bytes")
    if outside and outside.get("median") is not None:
        out += [
            "",
            f"NVML's figure minus torch's reserved memory (CUDA context, libraries, paged optimizer "
            f"state): median {gib(outside['median'], 3)} GiB.",
        ]
    out += ["", source_line(data, "peak_capture") + tiny_note(data)]
    return "\n".join(out)


def summary_section(results: dict[str, dict[str, Any]]) -> str:
    """A few lines with the headline figure of each benchmark, for readers who stop here."""
    lines = []
    over = results.get("overhead")
    if over is not None:
        pcts = over.get("step_time_overhead_pct", {})
        parts = [f"{ARM_LABELS.get(a, a)} {pct(v)}" for a, v in pcts.items()]
        if parts:
            lines.append("- **Cost to a QLoRA training step** (median, against no monitor): " + "; ".join(parts) + ".")
    cost = results.get("reading_cost")
    if cost is not None:
        live = {k: v["summary_s"]["median"] for k, v in cost["sources"].items() if v["available"]}
        if live:
            parts = [f"`{k}` {secs(v)}" for k, v in sorted(live.items(), key=lambda kv: kv[1])]
            lines.append("- **One reading** (median): " + "; ".join(parts) + ".")
    peak = results.get("peak_capture")
    if peak is not None:
        true_alloc = peak["truth"].get("max_allocated_bytes")
        parts = [
            f"`{m['method']}` {gib(m['reported_bytes'], 3)} GiB ({pct(m.get('error_pct'))})"
            for m in peak["methods"]
            if m.get("reported_bytes") is not None
        ]
        if parts:
            lines.append(f"- **Peak seen** (true peak {gib(true_alloc, 3)} GiB): " + "; ".join(parts) + ".")
    if not lines:
        return RERUN_HINT
    tiny = [name for name, data in results.items() if data.get("mode") == "tiny"]
    if tiny:
        lines.append("")
        lines.append(f"> From CPU `--tiny` smoke runs ({', '.join(sorted(tiny))}): not measurements.")
    return "\n".join(lines)


def environment_section(results: dict[str, dict[str, Any]]) -> str:
    if not results:
        return "No results yet."
    rows = []
    for name, data in sorted(results.items()):
        env = data.get("environment", {})
        versions = env.get("versions", {})
        device = env.get("device", {})
        rows.append(
            [
                f"`{name}.json`",
                env.get("date", "?"),
                str(device.get("name") or device.get("kind")),
                str(env.get("nvml", {}).get("driver_version") or "n/a"),
                str(env.get("torch", {}).get("cuda_runtime") or "n/a"),
                *(str(versions.get(p) or "n/a") for p in ("torch", "transformers", "peft", "bitsandbytes")),
                str(env.get("vramscope_commit") or "n/a")[:12],
            ]
        )
    return table(
        [
            "result",
            "date (UTC)",
            "device",
            "driver",
            "CUDA",
            "torch",
            "transformers",
            "peft",
            "bitsandbytes",
            "vramscope commit",
        ],
        rows,
    )


def copied_table(doc: Path, heading_word: str) -> str:
    """The first table under the first heading of ``doc`` that contains ``heading_word``; a pointer if none."""
    rel = doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc
    if not doc.is_file():
        return f"Not written yet: see `{rel}` once it exists."
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = None
    level = 0
    for i, line in enumerate(lines):
        match = re.match(r"^(#+)\s+(.*)$", line)
        if match and heading_word.lower() in match.group(2).lower():
            start, level = i, len(match.group(1))
            heading = match.group(2).strip()
            break
    if start is None:
        return f"See `{rel}` (no heading mentioning “{heading_word}” found there when this page was generated)."
    block: list[str] = []
    for line in lines[start + 1 :]:
        match = re.match(r"^(#+)\s", line)
        if match and len(match.group(1)) <= level:
            break
        if line.lstrip().startswith("|"):
            block.append(line)
        elif block:
            break
    if not block:
        return f"See `{rel}`, section “{heading}” (it has no table yet)."
    return f"From `{rel}`, section “{heading}”:\n\n" + "\n".join(block)


def tuner_section(results_dir: Path, allow_tiny: bool) -> str:
    """The tuner's comparison, from every ``tune_compare.json`` that bench/tune_compare.py wrote under the
    results folder (``--out bench/results/tune-1b``); a pointer to docs/tuner.md while there is none."""
    blocks = []
    for path in sorted(results_dir.rglob("tune_compare.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            settings = data["settings"]
            rows = data["methods"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ResultError(f"{path}: not a bench/tune_compare.py result ({exc}); rerun it") from exc
        if settings.get("tiny") and not allow_tiny:
            continue
        table_rows = [
            [
                str(r.get("method")),
                "failed" if r.get("batch") is None else str(r["batch"]),
                "-" if r.get("off_by") is None else str(r["off_by"]),
                str(r.get("trials")),
                str(r.get("steps")),
                str(r.get("oom_steps")),
                secs(r.get("seconds")),
            ]
            for r in rows
        ]
        rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        note = " (CPU `--tiny` smoke run with simulated memory: not a measurement)" if settings.get("tiny") else ""
        blocks.append(
            f"{settings.get('model')}, sequence length {settings.get('seq_len')}, memory capped at "
            f"{gib(settings.get('memory_limit_bytes'))} GiB{note}. True maximum (exhaustive search): "
            f"**{data.get('true_max')}**.\n\n"
            + table(["method", "batch found", "off by", "trials", "steps run", "OOM steps", "wall time"], table_rows)
            + f"\n\nRaw data: `{rel}`."
        )
    if not blocks:
        return (
            "Not measured on the GPU yet (docs/tuner.md has the CPU smoke run). Run "
            "`python bench/tune_compare.py --out bench/results/tune-1b "
            "--checkpoint-dir /dev/shm/vramscope-bench/tune-1b` "
            "(the checkpoint outside the results; docs/tuner.md has the 7B command), then "
            "`python bench/make_benchmarks_md.py`."
        )
    return "\n\n".join(blocks)


def render(doc_text: str, sections: dict[str, str]) -> str:
    found: set[str] = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in sections:
            return match.group(0)
        found.add(name)
        return f"{match.group(1)}{sections[name].rstrip()}\n{match.group(4)}"

    text = BLOCK.sub(replace, doc_text)
    missing = sorted(set(sections) - found)
    if missing:
        raise ResultError(f"the page has no GENERATED block for: {', '.join(missing)}; restore its markers")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate docs/benchmarks.md's tables from bench/results/*.json")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md", help="page to update in place")
    parser.add_argument(
        "--template", type=Path, default=None, help="page to read the prose from (default: --doc itself)"
    )
    parser.add_argument("--allow-tiny", action="store_true", help="accept CPU --tiny results (for tests)")
    args = parser.parse_args(argv)
    template = args.template or args.doc
    try:
        results = load_results(args.results, args.allow_tiny)
        text = template.read_text(encoding="utf-8")
        sections = {
            "summary": summary_section(results),
            "overhead": overhead_section(results.get("overhead")),
            "reading-cost": reading_cost_section(results.get("reading_cost")),
            "peak-capture": peak_capture_section(results.get("peak_capture")),
            "planner": copied_table(REPO / "docs" / "planner.md", "accuracy"),
            "tuner": tuner_section(args.results, args.allow_tiny),
            "environment": environment_section(results),
        }
        args.doc.write_text(render(text, sections), encoding="utf-8")
    except (ResultError, OSError) as exc:
        print(f"make_benchmarks_md.py: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.doc} from {len(results)} result file(s) in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
