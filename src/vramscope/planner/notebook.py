"""A plan shown in a notebook: Jupyter calls ``_repr_html_`` on the last value of a cell (:class:`Plan` uses this).

A small table of what the terminal leads with (the totals, whether it fits, the largest batch, the whole run's
phases, the breakdown at the peak, the notes); the terminal's full text stays ``vramscope plan``'s. Pure: no
notebook library is needed to build it.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from vramscope.units import GIB

if TYPE_CHECKING:
    from vramscope.planner.api import Plan


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.2f} GiB"


def plan_html(p: Plan) -> str:
    rows = [("peak allocated (torch.cuda.max_memory_allocated)", _gib(p.peak_allocated_bytes)),
            ("peak reserved (torch.cuda.max_memory_reserved)", _gib(p.peak_reserved_bytes)),
            ("process memory (nvidia-smi)", _gib(p.process_bytes))]
    if p.gpu_memory_bytes is not None:
        verdict = "fits" if p.fits else "does not fit"
        rows.append((f"on {_gib(p.gpu_memory_bytes)}", verdict))
        if p.max_batch_size is not None:
            rows.append(("largest batch at this length", str(p.max_batch_size)))
    table = "".join(f"<tr><td>{escape(k)}</td><td style='text-align:right'>{escape(v)}</td></tr>" for k, v in rows)
    phases = ""
    if p.run is not None and len(p.run.phases) > 1:
        phases = "<p><b>the whole run</b> (" + escape(p.run.trainer) + "): " + ", ".join(
            f"{escape(name)} {_gib(ph.peak_allocated_bytes)}{' (peak)' if name == p.run.peak_phase else ''}"
            for name, ph in p.run.phases.items()) + "</p>"
    parts = [(name, value) for name, value in p.breakdown.to_dict().items()
             if isinstance(value, int) and not isinstance(value, bool) and value > 0]
    breakdown = "".join(f"<tr><td>{escape(k.replace('_', ' '))}</td><td style='text-align:right'>{_gib(v)}</td>"
                        "</tr>" for k, v in parts)
    warn = "".join(f"<p style='color:#b00'><b>warning:</b> {escape(w)}</p>" for w in p.warnings)
    notes = "".join(f"<li>{escape(n)}</li>" for n in p.notes)
    title = (f"{escape(p.model)}: {p.total_params / 1e9:.2f}B params, batch {p.batch_size} x {p.seq_len} tokens, "
             f"LoRA r={p.spec.lora_r}, {p.spec.bits}-bit, framework {escape(p.framework)}")
    return (f"<div class='vramscope-plan'><p><b>{title}</b></p>{warn}<table>{table}</table>{phases}"
            f"<details><summary>breakdown at the peak</summary><table>{breakdown}</table></details>"
            + (f"<details><summary>notes</summary><ul>{notes}</ul></details>" if notes else "") + "</div>")
