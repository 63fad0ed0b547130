"""The report in a terminal (rich): the answers first, one screen per log, or one table for several.

Plain text when the output is not a terminal (a pipe, a CI log): rich drops colours and box styles
by itself, and ``--json`` is there for machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from vramscope.advice.types import Advice
from vramscope.analysis.details import METRICS
from vramscope.analysis.results import DeviceDetail, RankImbalance
from vramscope.output.safetext import printable
from vramscope.planner.run_types import PHASE_WORDS
from vramscope.report.charts import DeviceView
from vramscope.report.compare import change_tone, compare, format_change, format_value
from vramscope.report.figures import (
    devices_of,
    duration_shown,
    leak_kind,
    leak_verdict,
    seconds_shown,
)
from vramscope.report.model import LogReport
from vramscope.report.plan_check import ParallelismCheck
from vramscope.types import MemoryBreakdown, RunStrategy
from vramscope.units import gib

# The colour of each level the analysis judges a headroom at (analysis.verdicts.headroom_level).
HEADROOM_STYLES = {"high": "bold red", "medium": "yellow", "low": "green"}
PEAK_ORDER = ("device_used_bytes", "reserved_bytes", "peak_allocated_bytes", "allocated_bytes", "process_bytes",
              "host_rss_bytes")


def print_report(reports: Sequence[LogReport], console: Console) -> None:
    """Print one log's summary, or several logs compared side by side and then each one's advice.

    Every string that came from a log or a file beside it (phase names, the file name, verdicts and advice
    that quote them, the strategy file's) is made printable where it is printed: the terminal shows an
    escape sequence or a newline from a log as ``\x1b``, ``\n``.
    """
    reports = [replace(r, path=printable(r.path)) for r in reports]
    if len(reports) > 1:
        console.print(comparison_table(reports))
        for report in reports:
            console.print()
            console.print(Text(f"{report.path}", style="bold"))
            _print_verdicts(report, console)
            _print_advice(report.advice, console, limit=3)
        return
    report = reports[0]
    console.print(_header(report))
    for view, detail in devices_of(report):
        console.print()
        console.print(device_heading(view, detail))
        if view.idle:  # the run did not use it: the heading says so, nothing else to show
            continue
        console.print(device_table(detail))
        phases = phase_table(detail)
        if phases is not None:
            console.print(phases)
        if detail.fragmentation is not None:
            console.print(Text.assemble(("allocator cache: ", "bold"), printable(detail.fragmentation.verdict)))
        if detail.longest_batches:
            console.print(Text.assemble(("longest batches: ", "bold"), batches_text(detail)))
    ranks = report.result.ranks
    if ranks is not None and len(ranks.ranks) >= 2:
        console.print()
        console.print(rank_heading(ranks))
        console.print(rank_table(ranks))
    if report.breakdown is not None:
        console.print()
        console.print(breakdown_table(report.breakdown))
    for line in parallelism_lines(report.parallelism):
        console.print(line)
    _print_verdicts(report, console)
    _print_advice(report.advice, console)


def _header(report: LogReport) -> Text:
    result = report.result
    steps, seconds = result.steps, duration_shown(result)
    parts = [f"{result.rows:,} rows", printable(report.log_format)]
    if seconds is not None:
        parts.append(format_value(seconds, "s"))
    if steps.count:
        parts.append(f"steps {steps.first}-{steps.last}")
    return Text.assemble(("vramscope report ", "bold"), (report.path, "bold cyan"), f"  ({', '.join(parts)})")


def batches_text(detail: DeviceDetail) -> str:
    """``step 1394 (8,192 tokens, 18.62 GiB), ...``; a peak the log lacks is left out and the reason said once."""
    parts = []
    for b in detail.longest_batches:
        peak = b.peak_allocated_bytes
        parts.append(f"step {b.step} ({b.tokens:,} tokens{'' if peak is None else ', ' + gib(peak)})")
    note = detail.batches_note
    return ", ".join(parts) + (f"; {note}" if note else "")


def device_heading(view: DeviceView, detail: DeviceDetail) -> Text:
    """``GPU 0 · capacity 24.00 GiB (GPU total, NVML) · headroom at the peak 3.90 GiB (16%)``, coloured by
    how tight it is; ``GPU 1 · idle: ...`` for a GPU the run did not use."""
    text = Text(view.title, style="bold")
    if view.idle:
        text.append(f" · {printable(view.idle)}", style="dim")
        return text
    room = detail.headroom
    if room.capacity_bytes is not None:
        named = view.timeline.capacity_source  # the one every chart of the device names
        source = f" ({named})" if named else ""
        text.append(f" · capacity {gib(room.capacity_bytes)}{source}")
    if room.headroom_bytes is not None:
        fraction = room.headroom_fraction or 0.0
        style = HEADROOM_STYLES.get(room.level or "", "")
        if room.headroom_bytes < 0:  # a capacity given below what the log holds: no headroom to speak of
            text.append(" · the peak is ")
            text.append(f"{gib(-room.headroom_bytes)} over it", style=style)
        else:
            text.append(" · headroom at the peak ")
            text.append(f"{gib(room.headroom_bytes)} ({fraction:.0%})", style=style)
    return text


def device_table(detail: DeviceDetail) -> Table:
    """Peaks of one GPU with when they happened."""
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold dim")
    table.add_column("memory")
    for name in ("peak", "step"):
        table.add_column(name, justify="right")
    table.add_column("phase")
    table.add_column("elapsed", justify="right")
    for metric in PEAK_ORDER:
        at = detail.peaks.get(metric)
        if at is None:
            continue
        table.add_row(METRICS[metric], gib(at.bytes), "" if at.step is None else f"{at.step:,}",
                      escape(printable(at.phase)), format_value(seconds_shown(at), "s"))
    return table


def phase_table(detail: DeviceDetail) -> Table | None:
    """Peaks per phase (train, eval, ...), when the log has more than one phase."""
    phases = detail.phases
    if len(phases) < 2:
        return None
    metrics = [m for m in PEAK_ORDER if any(m in p.peaks for p in phases.values())][:3]
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold dim")
    table.add_column("peaks by phase")
    table.add_column("rows", justify="right")
    for m in metrics:
        table.add_column(METRICS[m], justify="right")
    table.add_column("at step", justify="right")
    for name, entry in phases.items():
        cells = [gib(entry.peaks[m].bytes) if m in entry.peaks else "-" for m in metrics]
        first = entry.peaks.get(metrics[0]) if metrics else None
        step = None if first is None else first.step
        table.add_row(escape(printable(name)), f"{entry.rows:,}", *cells, "" if step is None else f"{step:,}")
    return table


def parallelism_lines(check: ParallelismCheck | None) -> list[Text]:
    """``strategy: FSDP (FSDP2 fully_shard), 2 ranks, nccl`` and each rank's peak beside the per-rank plan."""
    if check is None:
        return []
    out: list[Text] = []
    if check.strategy is not None:
        out.append(Text.assemble(("strategy: ", "bold"), printable(strategy_text(check.strategy))))
    if check.plan is not None:
        planned = printable(str(check.plan.strategy))
        for r in check.ranks:
            who = f"{r.kind if r.kind == 'rank' else 'GPU'} {r.index}"
            whole = _against_plan((
                ("peak allocated", r.measured_peak_allocated_bytes, r.measured_peak_phase,
                 r.planned_peak_allocated_bytes, r.planned_peak_phase, r.allocated_error),
                ("device", r.measured_device_bytes, r.measured_device_phase, r.planned_process_bytes,
                 r.planned_process_phase, r.device_error)))
            if whole:
                out.append(Text.assemble((f"{who} vs plan ({planned}): ", "bold"), whole))
            steps = _against_plan((
                ("peak allocated", r.measured_step_peak_allocated_bytes, None, r.planned_step_peak_allocated_bytes,
                 None, r.step_allocated_error),
                ("device", r.measured_step_device_bytes, None, r.planned_step_process_bytes, None,
                 r.step_device_error)))
            if steps:
                out.append(Text.assemble((f"{who} steps vs the plan's step: ", "bold"), steps))
    if check.note:
        out.append(Text.assemble(("note: ", "bold yellow"), printable(check.note)))
    return out


def _against_plan(figures: Iterable[tuple[str, int | None, str | None, int | None, str | None, float | None]]) -> str:
    """``peak allocated 4.35 GiB at eval, plan 4.43 GiB at evaluation (+1.9%); device ...``: each measured figure
    that has a planned one beside it, with the phase that sets each where it is given."""
    bits = []
    for label, meas, meas_phase, plan, plan_phase, err in figures:
        if meas is None or plan is None:
            continue
        seen = f" at {printable(meas_phase)}" if meas_phase else ""  # the phase as the log names it
        planned = f" at {PHASE_WORDS.get(plan_phase, printable(plan_phase))}" if plan_phase else ""
        bits.append(f"{label} {gib(meas)}{seen}, plan {gib(plan)}{planned}"
                    + (f" ({err * 100:+.1f}%)" if err is not None else ""))
    return "; ".join(bits)


def strategy_text(seen: RunStrategy) -> str:
    """``FSDP2 fully_shard, 2 ranks, nccl (from the model wrapping)``: what the strategy file beside the log says
    (a field the file did not have as its type shows as None)."""
    world = seen.world_size
    parts = [seen.implementation or seen.strategy, f"{world} rank{'s' if world != 1 else ''}"]
    if seen.backend:
        parts.append(seen.backend)
    return f"{', '.join(parts)} (from the {seen.source})"


def rank_heading(ranks: RankImbalance) -> Text:
    """``ranks · imbalance 12.5% in peak allocated``: the largest rank's peak over the smallest's, minus 1."""
    text = Text("ranks", style="bold")
    if ranks.imbalance is not None:
        metric = ranks.metric
        label = "peak " + METRICS.get(metric.removeprefix("peak_"), metric)
        text.append(f" · imbalance {ranks.imbalance:.1%} in {label}", style="bold yellow" if ranks.notable else "")
    return text


def rank_table(ranks: RankImbalance) -> Table:
    """Peaks of each rank of a distributed run (rank 0's log gathers them all)."""
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold dim")
    columns = [c for c in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_used_bytes",
                           "peak_host_rss_bytes") if any(r.peaks.get(c) is not None for r in ranks.ranks)]
    table.add_column("rank")
    for name in ("gpu", "rows", *(f"peak {METRICS[c.removeprefix('peak_')]}" for c in columns)):
        table.add_column(name, justify="right")
    for r in ranks.ranks:
        table.add_row(str(r.rank), ",".join(str(g) for g in r.gpus) or "-", f"{r.rows:,}",
                      *(gib(r.peaks.get(c)) for c in columns))
    return table


def comparison_table(reports: Sequence[LogReport]) -> Table:
    """The same figures for each log, with the change against the first."""
    table = Table(title="side by side (changes against the first log)", title_justify="left", show_edge=False,
                  pad_edge=False)
    table.add_column("")
    for report in reports:
        table.add_column(escape(report.path), justify="right", overflow="fold")
    for row in compare(reports):
        cells = []
        for value, change in zip(row.values, row.changes, strict=True):
            text = escape(printable(format_value(value, row.unit)))
            tone = change_tone(change, row.better)
            if change:
                style = {"good": "green", "bad": "red"}.get(tone or "", "dim")
                text += f" [{style}]({format_change(change)})[/{style}]"
            cells.append(text)
        table.add_row(row.figure, *cells)
    return table


def breakdown_table(b: MemoryBreakdown) -> Table:
    """What held memory, by category (the monitor's breakdown file beside the log)."""
    # The breakdown is read from a file beside the log: its text is as untrusted as the log's.
    device = escape(printable(str(b.device)))
    table = Table(title=f"what held memory on {device} at the run's peak", title_justify="left", box=None)
    table.add_column("part")
    table.add_column("memory", justify="right")
    for label, value in b.rows():
        table.add_row(escape(printable(label)), gib(value, unknown="unknown"))
    return table


def _print_verdicts(report: LogReport, console: Console) -> None:
    result = report.result
    style = "bold red" if result.leak.detected else "green"
    verdict = leak_verdict(result.leak) or leak_kind(result.leak)
    console.print(Text.assemble(("leak test: ", "bold"), (printable(verdict), style)))
    outlook = result.forecast.outlook
    # Coloured by how soon, not by the word OOM; the detail says why, as the page's card and --json do.
    style = {"high": "bold red", "medium": "yellow"}.get(outlook.level or "", "")
    detail = f" · {outlook.detail}" if outlook.detail else ""
    console.print(Text.assemble(("OOM forecast: ", "bold"), (printable(outlook.headline), style),
                                printable(detail)))
    warning = result.forecast.longest_batch.warning
    if warning:
        console.print(Text.assemble(("longest batch: ", "bold"), (printable(warning), "red")))
    # The analysis' warnings repeat the verdicts above in one line each; --json and the HTML list them.


def _print_advice(advice: Sequence[Advice], console: Console, limit: int = 5) -> None:
    items = advice[:limit]
    if not items:
        return
    sources = "this log and the planner" if any(a.source == "planner" for a in items) else "this log"
    lines: list[Text] = [Text(f"recommendations (from {sources}):", style="bold")]
    for i, item in enumerate(items, 1):
        saves = f" [saves up to {gib(item.saves_bytes)}]" if item.saves_bytes else ""
        lines.append(Text.assemble(f" {i}. ", (printable(item.title), "bold red" if item.urgent else "bold"),
                                   (saves, "green"), f": {printable(item.detail)}"))
    console.print(Group(*lines))
