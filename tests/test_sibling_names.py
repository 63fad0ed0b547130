"""One rule names the files beside a log: what the monitor, ``vramscope run`` and the tuner write there is
what the report and the tuner look for (vramscope.output.names)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vramscope.output.names import sibling
from vramscope.run.inject import steps_log_path
from vramscope.training.ranks import beside, rank_path
from vramscope.tune.command_trial import record_path


@pytest.mark.parametrize(
    ("path", "tag", "suffix", "expected"),
    [
        ("runs/mem.csv", "rank3", None, "runs/mem.rank3.csv"),
        ("runs/mem.csv", None, ".analysis.json", "runs/mem.analysis.json"),
        ("runs/mem.csv", "steps", ".jsonl", "runs/mem.steps.jsonl"),
        ("runs/mem.csv", None, ".oom", "runs/mem.oom"),
        ("mem", "rank1", None, "mem.rank1"),  # no suffix: the whole name is the stem
        ("mem", None, ".warnings.jsonl", "mem.warnings.jsonl"),
        ("runs/mem.tar.csv", None, ".breakdown.json", "runs/mem.tar.breakdown.json"),  # only the last suffix goes
        (".mem.csv", "rank2", None, ".mem.rank2.csv"),
    ],
)
def test_a_sibling_is_named_after_the_log_without_its_last_suffix(
    path: str, tag: str | None, suffix: str | None, expected: str
) -> None:
    assert sibling(path, tag=tag, suffix=suffix) == expected
    assert sibling(Path(path), tag=tag, suffix=suffix) == expected


def test_a_path_without_a_file_name_is_refused() -> None:
    with pytest.raises(ValueError):
        sibling("")


def test_the_writers_follow_the_rule(tmp_path: Path) -> None:
    log = str(tmp_path / "mem.csv")
    assert rank_path(log, 0) == log and rank_path(log, 3) == sibling(log, tag="rank3")
    assert record_path(log, 0) == log and record_path(log, 2) == sibling(log, tag="rank2")  # a trial's ranks too
    assert beside(log, ".analysis.json") == sibling(log, suffix=".analysis.json")
    assert steps_log_path(log) == sibling(log, tag="steps")
    assert steps_log_path(tmp_path / "mem.jsonl") == str(tmp_path / "mem.steps.jsonl")
    assert steps_log_path(tmp_path / "mem.log") == str(tmp_path / "mem.steps.csv")  # a format we do not write: CSV


def test_the_step_log_is_absolute_because_the_child_may_change_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    found = steps_log_path("mem.csv")
    assert os.path.isabs(found) and found == str(tmp_path.resolve() / "mem.steps.csv")


def test_the_readers_follow_the_rule(tmp_path: Path) -> None:
    from vramscope.analysis.alerts import warnings_path
    from vramscope.tune.trial_record import read_records

    log = tmp_path / "mem.csv"
    assert warnings_path(log) == sibling(log, suffix=".warnings.jsonl") == str(tmp_path / "mem.warnings.jsonl")
    assert warnings_path("mem") == "mem.warnings.jsonl"
    # The tuner reads back the records its trial ranks wrote, by the writers' names, in a folder whose name
    # would be a glob pattern if it were not escaped.
    folder = tmp_path / "trial[1]"
    folder.mkdir()
    record = str(folder / "trial0.json")
    for rank in (0, 1, 2):
        Path(record_path(record, rank)).write_text(f'{{"rank": {rank}}}', encoding="utf-8")
    (folder / "trial0.steps.json").write_text('{"rank": 9}', encoding="utf-8")  # beside it, not a rank's
    assert [r.rank for r in read_records(record)] == [0, 1, 2]
