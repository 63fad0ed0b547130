"""Explain an out-of-memory error: what was asked, what was held, by whom, and what to change.

One module per job, split so that the analysis can be tested without a GPU:

* :mod:`~vramscope.oom.classify`: :func:`oom_kind` recognises every form an OOM takes in PyTorch
  training (the caching allocator's ``torch.OutOfMemoryError``, and the cuBLAS / cuDNN / CUDA runtime
  allocation failures that arrive as plain ``RuntimeError`` messages). The tuner uses it too.
* :mod:`vramscope.analysis.oom` (re-exported here): :func:`build_report` turns a snapshot dict (torch's format)
  and the OOM's facts (:class:`OomEvent`) into an :class:`OomReport`; pure, and without advice.
* :mod:`vramscope.advice.oom` (re-exported here): the ranked ways out (vramscope's rules, and the planner's).
* :mod:`~vramscope.oom.postmortem`: :func:`post_mortem` puts the two together (:class:`PostMortem`), and
  :func:`report_from_files` rebuilds one from the files the recorder left.
* :mod:`~vramscope.oom.render`: :func:`render_markdown`, :func:`render_html`, :func:`write_report`.
* :mod:`~vramscope.oom.recorder` (needs CUDA): :class:`OomRecorder` records torch's allocator history
  into a bounded ring buffer (``torch.cuda.memory._record_memory_history(max_entries=...)``) and, from
  torch's OOM observer (``torch._C._cuda_attach_out_of_memory_observer``), writes at the moment of the
  OOM a snapshot pickle that https://pytorch.org/memory_viz opens, the OOM's facts beside it
  (``oom-N.event.json``, :class:`OomEvent`) and the post-mortem as Markdown, HTML and JSON (``oom-N.md``,
  ``.html``, ``.json``).
* :mod:`~vramscope.oom.env`: how ``vramscope run --oom-snapshot DIR`` tells the child where to write.

Imports torch lazily: importing this package costs nothing on a machine without it.
"""

from __future__ import annotations

from vramscope.advice.oom import advise, merge_advice, oom_advice, planner_advice, rank_advice
from vramscope.advice.types import Advice
from vramscope.analysis.oom import NO_STACK, AllocationSite, OomEvent, OomReport, build_report, classify_stack, site_of
from vramscope.oom.classify import OOM_KINDS, is_oom, oom_kind
from vramscope.oom.env import DEFAULT_DIR, DEFAULT_MAX_ENTRIES, ENV_MAX_ENTRIES, ENV_VAR, snapshot_env
from vramscope.oom.postmortem import PostMortem, post_mortem, report_from_files
from vramscope.oom.recorder import OomRecorder, add_oom_listener
from vramscope.oom.render import render_html, render_markdown, write_report

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
    "PostMortem",
    "add_oom_listener",
    "advise",
    "build_report",
    "classify_stack",
    "is_oom",
    "merge_advice",
    "oom_advice",
    "oom_kind",
    "planner_advice",
    "post_mortem",
    "rank_advice",
    "render_html",
    "render_markdown",
    "report_from_files",
    "site_of",
    "snapshot_env",
    "write_report",
]
