"""The post-mortem (:class:`~vramscope.oom.postmortem.PostMortem`: the report and its advice) as Markdown and as
one self-contained HTML page, and the files they go to."""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path
from typing import Any

from vramscope.advice.types import Advice
from vramscope.analysis.oom import OomReport
from vramscope.oom.postmortem import PostMortem
from vramscope.output.atomic import write_atomically
from vramscope.types import MemoryBreakdown
from vramscope.units import human


def _facts(report: OomReport) -> list[tuple[str, str]]:
    rows = [
        ("Kind", report.kind),
        ("Requested", human(report.requested_bytes)),
        ("Capacity (allowed for the allocator)", human(report.capacity_bytes)),
        ("Free on the device (CUDA)", human(report.device_free_bytes)),
        ("Reserved by PyTorch", human(report.reserved_bytes)),
        ("Allocated (in use by tensors)", human(report.allocated_bytes)),
        ("Free inside reserved segments", human(report.free_in_segments_bytes)),
        ("Largest free block", human(report.largest_free_block_bytes)),
        ("Fragmentation", "-" if report.fragmentation is None else f"{report.fragmentation:.0%}"),
        ("Held outside PyTorch's allocator", human(report.outside_bytes)),
        ("Short by", human(report.shortfall_bytes)),
        ("Step", _text(report.step)),
        ("Phase", _text(report.phase)),
        ("Tokens in the batch", _text(report.tokens)),
        ("Batch shape", "-" if report.batch_shape is None else " x ".join(str(d) for d in report.batch_shape)),
        ("Segments", str(report.segments)),
        ("History events kept", str(report.history_entries)),
    ]
    return rows


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _breakdown_rows(report: OomReport) -> list[tuple[str, str]]:
    """What the model's and optimizer's own tensors held when memory ran out (empty when unknown)."""
    if report.breakdown is None:
        return []
    try:
        found = MemoryBreakdown.from_dict(report.breakdown)
    except (ValueError, TypeError):
        return []
    return [(label, "-" if value is None else human(value)) for label, value in found.rows()]


def _md(text: str) -> str:
    # Text from the snapshot (file and function names) goes into Markdown that renderers may turn into
    # HTML: escape markup, keep table cells intact (pipes) and on one line.
    return html.escape(text, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _advice_tail(a: Advice) -> str:
    parts = []
    if a.saves_bytes:
        parts.append(f"frees about {human(a.saves_bytes)}")
    if a.sufficient is not None:
        parts.append("enough on its own" if a.sufficient else "not enough alone")
    parts.append(a.source)
    return f" ({'; '.join(parts)})"


def render_markdown(post_mortem: PostMortem) -> str:
    """The post-mortem as Markdown (GitHub tables)."""
    report = post_mortem.report
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.time)) if report.time else "unknown time"
    lines = [f"# CUDA out of memory on GPU {report.device}", "", f"_{when}_", ""]
    if report.message:
        lines += ["```", report.message.strip().splitlines()[0][:500].replace("`", "'"), "```", ""]
    lines += ["## At the moment of the OOM", "", "| | |", "|---|---|"]
    lines += [f"| {_md(k)} | {_md(v)} |" for k, v in _facts(report)]
    held = _breakdown_rows(report)
    if held:
        lines += [
            "",
            "## What held memory (the model's and the optimizer's tensors, the run's peak)",
            "",
            "| | |",
            "|---|---|",
        ]
        lines += [f"| {_md(k)} | {_md(v)} |" for k, v in held]
    lines += ["", "## Where the memory was allocated", ""]
    if report.top_sites:
        lines += ["| Site | Called from | What | Live | Blocks | Largest |", "|---|---|---|---:|---:|---:|"]
        for s in report.top_sites:
            lines.append(
                f"| {_md(s.where)} | {_md(' <- '.join(s.via) or '-')} | {_md(s.kind)} | {human(s.bytes)} | "
                f"{s.blocks} | {human(s.largest_bytes)} |"
            )
    else:
        lines.append("No live blocks in the snapshot.")
    lines += ["", "## What to change, ranked", "", f"_Advice: {_md(post_mortem.advice_source)}._", ""]
    if post_mortem.advice:
        for i, a in enumerate(post_mortem.advice, 1):
            lines.append(f"{i}. **{_md(a.title)}**{_advice_tail(a)}: {_md(a.detail)}")
    else:
        lines.append("No rule applied; open the snapshot in https://pytorch.org/memory_viz to look at the timeline.")
    if report.snapshot_file:
        lines += [
            "",
            f"Snapshot: `{report.snapshot_file}`; drag it onto https://pytorch.org/memory_viz, or run "
            f"`python -m torch.cuda._memory_viz trace_plot {report.snapshot_file} -o oom.html`.",
        ]
    return "\n".join(lines) + "\n"


def render_html(post_mortem: PostMortem) -> str:
    """The post-mortem as one self-contained HTML page; every value from the snapshot is escaped."""
    report = post_mortem.report
    e = html.escape
    facts = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _facts(report))
    held = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _breakdown_rows(report))
    sites = "".join(
        f"<tr><td><code>{e(s.where)}</code></td><td><code>{e(' <- '.join(s.via) or '-')}</code></td>"
        f"<td>{e(s.kind)}</td>"
        f"<td class=n>{e(human(s.bytes))}</td><td class=n>{s.blocks}</td>"
        f"<td class=n>{e(human(s.largest_bytes))}</td></tr>"
        for s in report.top_sites
    )
    advice = "".join(
        f"<li><b>{e(a.title)}</b>"
        + (f" <i>{e(_advice_tail(a).strip())}</i>" if _advice_tail(a) else "")
        + f": {e(a.detail)}</li>"
        for a in post_mortem.advice
    )
    message = f"<pre>{e(report.message.strip().splitlines()[0][:500])}</pre>" if report.message else ""
    snap = (
        f"<p>Snapshot: <code>{e(report.snapshot_file)}</code>; open it in "
        "<a href='https://pytorch.org/memory_viz'>pytorch.org/memory_viz</a>.</p>"
        if report.snapshot_file
        else ""
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>CUDA out of memory on GPU {report.device}</title><style>"
        "body{font-family:system-ui,sans-serif;max-width:70em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
        "td.n{text-align:right}code{font-size:.9em}</style></head><body>"
        f"<h1>CUDA out of memory on GPU {report.device}</h1>{message}"
        f"<h2>At the moment of the OOM</h2><table>{facts}</table>"
        + (f"<h2>What held memory</h2><table>{held}</table>" if held else "")
        + "<h2>Where the memory was allocated</h2>"
        "<table><tr><th>Site</th><th>Called from</th><th>What</th><th>Live</th><th>Blocks</th><th>Largest</th></tr>"
        f"{sites}</table>"
        f"<h2>What to change, ranked</h2><p><i>Advice: {e(post_mortem.advice_source)}.</i></p><ol>{advice}</ol>{snap}"
        "</body></html>\n"
    )


def write_report(post_mortem: PostMortem, out_dir: str | os.PathLike[str], stem: str) -> dict[str, Path]:
    """Write ``stem.md``, ``stem.html`` and ``stem.json`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / f"{stem}.md", "html": out / f"{stem}.html", "json": out / f"{stem}.json"}
    # Whole or not at all: the recorder rewrites these files when the OOM's message arrives, and a full disk then
    # must not leave a half report where a good one was.
    write_atomically(paths["md"], render_markdown(post_mortem).encode("utf-8"))
    write_atomically(paths["html"], render_html(post_mortem).encode("utf-8"))
    write_atomically(paths["json"], json.dumps(post_mortem.to_dict(), indent=2, default=str).encode("utf-8"))
    return paths
