"""``vramscope plan --trace``: print the traced step's memory (a table, or ``--json``).

Thin: :func:`vramscope.planner.trace.engine.trace_plan` does the work (and imports torch, so this module imports it
only when ``--trace`` is given).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from vramscope.cli.labels import BREAKDOWN_LABELS, totals_lines
from vramscope.planner.document import CommandSection, JsonObject, plan_document
from vramscope.recipe import QLoraSpec
from vramscope.units import gib

if TYPE_CHECKING:  # the trace imports torch: only when --trace is given
    from vramscope.planner.trace.engine import TracePlan

# The trace's own categories and what it modelled rather than traced, over the planner's names.
_LABELS = {
    **BREAKDOWN_LABELS,
    "activations": "activations (made in a forward)",
    "logits_and_loss": "logits and loss",
    "temporaries": "temporaries (made in backward)",
    "buffers": "buffers",
    "inputs": "inputs",
    "other": "other (made while preparing)",
    "cublas_workspaces": "cuBLAS workspaces (modelled)",
    "allocator_overhead": "allocator overhead (modelled)",
    "cuda_context": "CUDA context and kernels (modelled)",
}


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """``--trace``; which framework's step it traces is the recipe's ``--framework`` (:mod:`vramscope.cli.recipe`,
    from the frameworks' table)."""
    parser.add_argument("--trace", action="store_true",
                        help="trace the real training step on fake tensors (needs torch, transformers, peft) "
                             "instead of the analytic model")


def run_trace(args: argparse.Namespace, model: Any, spec: QLoraSpec, *, command: CommandSection | None = None,
              dataset: JsonObject | None = None) -> int:
    """Trace, print, return the exit code. Bad input raises PlanInputError (the caller makes it exit 2).

    ``command`` and ``dataset`` are a pasted command's reading and the data's lengths, for ``--json`` (the terminal
    prints them before the trace, as a plan without ``--trace`` does)."""
    from vramscope.planner.trace.engine import require_trace_libraries, trace_plan

    require_trace_libraries(spec.bits)
    line = ProgressLine(sys.stderr) if sys.stderr.isatty() and not args.json else None
    try:
        result = trace_plan(model, args.batch_size, args.seq_len, spec, gpu_memory=args.gpu_memory, gpu=args.gpu,
                            progress=line)
    finally:
        if line is not None:
            line.clear()
    if args.json:
        print(plan_document(result, command=command, dataset=dataset).dumps())
    else:
        print(format_trace(result))
    return 0


class ProgressLine:
    """One updating stderr line while the trace runs (it takes seconds to a minute): what it is doing and
    how long it has been at it. Only on a terminal and not with ``--json``; cleared when the trace ends."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.start = time.monotonic()
        self.shown = False

    def __call__(self, what: str) -> None:
        self.stream.write(f"\r\x1b[Ktracing: {what} ({time.monotonic() - self.start:.0f} s)")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def format_trace(p: TracePlan) -> str:
    s = p.spec
    lines = [
        f"{p.model}: {p.total_params / 1e9:.2f}B params, batch {p.batch_size} x {p.seq_len} tokens, "
        f"framework {s.framework} (traced in {p.trace_seconds:.1f} s)",
        f"  {s.bits}-bit base, LoRA r={s.lora_r} ({p.trainable_params / 1e6:.1f}M trainable), {s.optim}, "
        f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}, {s.attn}",
        "",
        f"  live at the traced peak ({p.peak_phase}):",
    ]
    for name, value in p.breakdown.items():
        if value:
            lines.append(f"    {_LABELS.get(name, name):42} {gib(value):>11}")
    lines += ["", *totals_lines(p)]
    if p.gpu_memory_bytes is not None:
        lines += ["", f"  {'fits' if p.fits else 'does NOT fit'} in {gib(p.gpu_memory_bytes)}"]
    lines.append("  modelled, not traced: " + "; ".join(p.modelled))
    for note in p.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)
