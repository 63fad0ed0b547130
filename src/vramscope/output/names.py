"""The names of the files beside a log: one rule, so that what the monitor writes the report finds.

A file that belongs to a log is named after the log without its last suffix (``runs/mem.csv`` ->
``runs/mem``), in the log's folder:

* another log of the same run takes a tag before the log's suffix: ``mem.rank3.csv`` (rank 3),
  ``mem.steps.csv`` (the step log of ``vramscope run``), ``mem.trainer2.csv`` (a second Trainer);
* a file of another kind takes its own suffix instead: ``mem.analysis.json``, ``mem.breakdown.json``,
  ``mem.strategy.json``, ``mem.warnings.jsonl``, ``mem.oom/`` (each snapshot in it has its ``oom-N.event.json``).

The parts of a rotated log are the one exception, by design: ``mem.csv.1``, ``mem.csv.2`` keep the whole
name, as logrotate's do (``logs.files.part_path``).
"""

from __future__ import annotations

import os
from pathlib import Path

# The tag of each other log of the same run, written once (``sibling(path, tag=...)``): rank N's log
# (training.ranks; a trial's record of rank N too, tune.trial_record), vramscope run's step log (run.inject),
# the Nth Trainer's log of one program (run.inject).
RANK_TAG = "rank"
STEPS_TAG = "steps"
TRAINER_TAG = "trainer"

# The suffix of each kind of file beside a log, written once: the writer and the reader of each import it here.
# Each file's format has one owner, named here; the writer and the reader go through it, never through a dict of
# their own. (The plan JSON is no file beside a log: the user names it; its owner is vramscope.planner.document.)
# the analysis: written by MemoryMonitor.save_analysis; format analysis.results.AnalysisResult (to_json /
# from_json; read_analysis reads the file back)
ANALYSIS_SUFFIX = ".analysis.json"
# what held memory: written by MemoryMonitor.save_breakdown; format types.MemoryBreakdown (to_dict / from_dict),
# read back by report.load.read_breakdown
BREAKDOWN_SUFFIX = ".breakdown.json"
# how the run was spread: written by MemoryMonitor.note_strategy; format types.RunStrategy (to_json / from_json),
# read back by report.plan_check.strategy_beside (report --plan)
STRATEGY_SUFFIX = ".strategy.json"
WARNINGS_SUFFIX = ".warnings.jsonl"  # every warning shown while training, one JSON object a line (analysis.alerts)
OOM_SUFFIX = ".oom"  # the folder of the OOM post-mortems (oom.env)
# beside each OOM snapshot in that folder (oom-N.event.json, not beside the log): what torch's observer and the
# training said of the OOM; written by oom.recorder.OomRecorder; format analysis.oom.OomEvent (to_json /
# from_json), read back with the snapshot by oom.postmortem.report_from_files
EVENT_SUFFIX = ".event.json"


def sibling(path: str | os.PathLike[str], *, tag: str | None = None, suffix: str | None = None) -> str:
    """The file beside ``path`` named after it.

    Args:
        path: the log (``runs/mem.csv``).
        tag: put before the suffix: ``tag="rank3"`` -> ``runs/mem.rank3.csv``.
        suffix: instead of the log's own: ``suffix=".analysis.json"`` -> ``runs/mem.analysis.json``.

    Raises:
        ValueError: ``path`` has no file name (``""``, ``"/"``).
    """
    p = Path(path)
    name = p.stem + (f".{tag}" if tag else "") + (p.suffix if suffix is None else suffix)
    return str(p.with_name(name))
