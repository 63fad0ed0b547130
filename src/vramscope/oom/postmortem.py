"""A post-mortem: the facts of one OOM (:mod:`vramscope.analysis.oom`) and what to change
(:mod:`vramscope.advice.oom`), put together where its files are written: by the recorder at the moment of the OOM,
and by :func:`report_from_files` from the files it left."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vramscope.advice.oom import oom_advice
from vramscope.advice.types import Advice
from vramscope.analysis.oom import OomEvent, OomReport, build_report


@dataclass(frozen=True)
class PostMortem:
    """One OOM's report and its ranked advice, with where the advice came from (the planner, or only the rules)."""

    report: OomReport
    advice: tuple[Advice, ...]
    advice_source: str

    def to_dict(self) -> dict[str, Any]:
        """The ``oom-N.json`` form: the report's fields with the advice among them, in the order the file has
        always had (``advice`` and ``advice_source`` after ``history_entries``)."""
        out: dict[str, Any] = {}
        for key, value in self.report.to_dict().items():
            if key == "snapshot_file":
                out["advice"] = tuple(asdict(a) for a in self.advice)
                out["advice_source"] = self.advice_source
            out[key] = value
        return out


def post_mortem(
    snapshot: Mapping[str, Any],
    event: OomEvent,
    *,
    top: int = 10,
    snapshot_file: str | None = None,
    model: Any = None,
    spec: Any = None,
) -> PostMortem:
    """Analyse one OOM (:func:`vramscope.analysis.oom.build_report`) and advise on it.

    Args:
        snapshot, event, top, snapshot_file: as :func:`~vramscope.analysis.oom.build_report`.
        model: the model for the planner (a registry name such as ``"Llama-2-7B"`` or a config.json
            dict); with it and a ``batch_shape`` in the context, the advice includes the planner's
            recommendations fed with the measured peak and capacity. Also read from the context's
            ``"model"`` key.
        spec: the recipe (:class:`~vramscope.recipe.QLoraSpec`, or its dict) for the planner;
            also read from the context's ``"spec"`` key. Default: the QLoRA reference recipe.
    """
    report = build_report(snapshot, event, top=top, snapshot_file=snapshot_file)
    ctx = dict(event.context or {})
    advice, source = oom_advice(
        report, model if model is not None else ctx.get("model"), spec if spec is not None else ctx.get("spec")
    )
    return PostMortem(report, tuple(advice), source)


def report_from_files(
    snapshot_path: str | os.PathLike[str],
    event_path: str | os.PathLike[str] | None = None,
    *,
    model: Any = None,
    spec: Any = None,
) -> PostMortem:
    """Rebuild a post-mortem from a snapshot pickle (and the ``*.event.json`` the recorder wrote beside it)."""
    with open(snapshot_path, "rb") as f:
        snapshot = pickle.load(f)  # a file the user points at, written by torch
    event = OomEvent()
    if event_path is not None:
        event, _ = OomEvent.from_json(json.loads(Path(event_path).read_text(encoding="utf-8")))
    return post_mortem(snapshot, event, snapshot_file=str(snapshot_path), model=model, spec=spec)
