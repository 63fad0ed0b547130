"""Explain an out-of-memory error: what was asked, what was held, by whom, and what to change.

One module per job, split so that the analysis can be tested without a GPU:

* :mod:`~vramscope.oom.classify`: :func:`oom_kind` recognises every form an OOM takes in PyTorch
  training (the caching allocator's ``torch.OutOfMemoryError``, and the cuBLAS / cuDNN / CUDA runtime
  allocation failures that arrive as plain ``RuntimeError`` messages). The tuner uses it too.
* :mod:`~vramscope.oom.snapshot`: :func:`build_report` turns a snapshot dict (torch's format) and the
  OOM's facts (:mod:`~vramscope.oom.records`) into an :class:`OomReport`; pure.
* :mod:`vramscope.advice.oom` (re-exported here): the ranked ways out (vramscope's rules, and the planner's).
* :mod:`~vramscope.oom.render`: :func:`render_markdown`, :func:`render_html`, :func:`write_report`.
* :mod:`~vramscope.oom.recorder` (needs CUDA): :class:`OomRecorder` records torch's allocator history
  into a bounded ring buffer (``torch.cuda.memory._record_memory_history(max_entries=...)``) and, from
  torch's OOM observer (``torch._C._cuda_attach_out_of_memory_observer``), writes at the moment of the
  OOM a snapshot pickle that https://pytorch.org/memory_viz opens, plus a Markdown and an HTML report.
* :mod:`~vramscope.oom.env`: how ``vramscope run --oom-snapshot DIR`` tells the child where to write.

Imports torch lazily: importing this package costs nothing on a machine without it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names resolve lazily (see __getattr__)
    from vramscope.advice.oom import advise, merge_advice, planner_advice, rank_advice
    from vramscope.oom.classify import OOM_KINDS, is_oom, oom_kind
    from vramscope.oom.env import DEFAULT_DIR, DEFAULT_MAX_ENTRIES, ENV_MAX_ENTRIES, ENV_VAR, snapshot_env
    from vramscope.oom.recorder import OomRecorder, add_oom_listener
    from vramscope.oom.records import NO_STACK, Advice, AllocationSite, OomEvent, OomReport
    from vramscope.oom.render import render_html, render_markdown, write_report
    from vramscope.oom.snapshot import build_report, classify_stack, report_from_files, site_of

# Resolved on first access: the advice builder reads this package's records and this package's report builder
# calls it, so an eager import here would run in a circle whichever module is imported first.
_LAZY = {
    **dict.fromkeys(("advise", "merge_advice", "planner_advice", "rank_advice"), "vramscope.advice.oom"),
    **dict.fromkeys(("OOM_KINDS", "is_oom", "oom_kind"), "vramscope.oom.classify"),
    **dict.fromkeys(("DEFAULT_DIR", "DEFAULT_MAX_ENTRIES", "ENV_MAX_ENTRIES", "ENV_VAR", "snapshot_env"),
                    "vramscope.oom.env"),
    **dict.fromkeys(("OomRecorder", "add_oom_listener"), "vramscope.oom.recorder"),
    **dict.fromkeys(("NO_STACK", "Advice", "AllocationSite", "OomEvent", "OomReport"), "vramscope.oom.records"),
    **dict.fromkeys(("render_html", "render_markdown", "write_report"), "vramscope.oom.render"),
    **dict.fromkeys(("build_report", "classify_stack", "report_from_files", "site_of"), "vramscope.oom.snapshot"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope.oom' has no attribute {name!r}")
    return getattr(import_module(module), name)



__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_MAX_ENTRIES",
    "ENV_MAX_ENTRIES",
    "ENV_VAR",
    "NO_STACK",
    "OOM_KINDS",
    "Advice",
    "AllocationSite",
    "OomEvent",
    "OomRecorder",
    "OomReport",
    "add_oom_listener",
    "advise",
    "build_report",
    "classify_stack",
    "is_oom",
    "merge_advice",
    "oom_kind",
    "planner_advice",
    "rank_advice",
    "render_html",
    "render_markdown",
    "report_from_files",
    "site_of",
    "snapshot_env",
    "write_report",
]
