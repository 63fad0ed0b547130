"""One Advice type, whoever gives it: an OOM's post-mortem, a log's analysis, a plan (vramscope.advice).

Each builder runs on real inputs: the OOM snapshot recorded on the H200, a training log written to disk and read
back, the planner's own plan.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_report_fixtures import MIB, Run, write_training_log
from vramscope.advice import Advice, rank_by_sufficiency, rank_by_urgency
from vramscope.advice.log import RunSettings, advise_result, advise_run_result
from vramscope.advice.plan import advise_plan, title_of
from vramscope.logs.reader import read_log
from vramscope.oom import report_from_files
from vramscope.planner import plan
from vramscope.report.json_output import summary_of
from vramscope.report.model import LogReport, build_report

OOM = Path(__file__).parent / "data" / "oom"
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def leak_report(tmp_path_factory: pytest.TempPathFactory) -> LogReport:
    path = write_training_log(tmp_path_factory.mktemp("log") / "leak.csv",
                              Run(steps=600, leak_per_step=3 * MIB, leak_from=200))
    return build_report(read_log(path))


def test_an_oom_a_log_and_a_plan_give_the_same_type(leak_report: LogReport) -> None:
    oom = report_from_files(OOM / "h200-oom-1-snapshot.pickle", OOM / "h200-oom-1.event.json", model="TinyLlama-1.1B")
    assert leak_report.result is not None
    from_log = advise_result(leak_report.result)
    planned = advise_plan(plan("Llama-2-7B", 4, 2048, gpu_memory="24GiB"))
    for items, sources in ((oom.advice, {"snapshot", "planner"}), (from_log, {"log"}), (planned, {"planner"})):
        assert items and all(isinstance(a, Advice) for a in items)
        assert {a.source for a in items} <= sources
        assert len({a.key for a in items}) == len(items)  # one stable key per change
    assert "planner" in {a.source for a in oom.advice}  # the model was given: the planner speaks


def test_the_oom_rules_write_the_change_in_the_runs_keys() -> None:
    oom = report_from_files(OOM / "h200-oom-1-snapshot.pickle", OOM / "h200-oom-1.event.json")
    by_key = {a.key: a for a in oom.advice}
    micro = by_key["micro_batch"]  # the batch was 64 x 1024 tokens
    assert micro.change["batch_size"] * micro.change["grad_accum"] <= 64
    assert micro.how.startswith(f"TrainingArguments(per_device_train_batch_size={micro.change['batch_size']}, ")
    assert by_key["seq_len"].how == f"tokenizer(..., truncation=True, max_length={by_key['seq_len'].change['seq_len']})"
    # The OOM's JSON carries the same fields as every other advice.
    assert set(oom.to_dict()["advice"][0]) == set(Advice("k", "t", "d").__dataclass_fields__)


def test_plan_advice_keeps_the_planners_numbers_and_drops_the_saving_from_the_title() -> None:
    p = plan("Llama-2-7B", 4, 2048, gpu_memory="24GiB")
    for rec, advice in zip(p.recommendations, advise_plan(p), strict=True):
        assert (advice.key, advice.saves_bytes, advice.how, advice.sufficient) == (
            rec.name, rec.saving_bytes, rec.how, rec.sufficient)
        assert ": saves" not in advice.title and advice.title[0].isupper()
        assert rec.text.lower().startswith(advice.title.lower())
    assert title_of(p.recommendations[0]) == advise_plan(p)[0].title


def test_log_advice_urgent_first_then_the_planner(leak_report: LogReport) -> None:
    assert leak_report.result is not None
    plain = advise_result(leak_report.result)
    assert plain[0].key == "leak" and plain[0].urgent and plain[0].device == "0"
    both = advise_run_result(leak_report.result, RunSettings("Llama-2-7B", 4))
    urgent = [a for a in plain if a.urgent]
    assert both[: len(urgent)] == urgent
    assert both[len(urgent)].source == "planner" and both[len(urgent)].device == "all"
    # The JSON edge: the keys report --json always had, and the stable key as "name".
    assert {"title", "detail", "saves_bytes", "urgent", "device", "source", "name"} <= plain[0].to_dict().keys()


def test_the_two_orders() -> None:
    a = Advice("a", "A", "", 10, sufficient=False)
    b = Advice("b", "B", "", 1, sufficient=True)
    c = Advice("c", "C", "", None, urgent=True)
    d = Advice("d", "D", "", 5)
    assert [x.key for x in rank_by_sufficiency([a, b, d])] == ["b", "a", "d"]
    assert [x.key for x in rank_by_urgency([a, d, Advice("e", "E", ""), c])] == ["c", "a", "d", "e"]


@pytest.mark.parametrize("first", ["vramscope.advice.oom", "vramscope.oom", "vramscope.oom.render",
                                   "vramscope.analysis.oom", "vramscope.advice.log", "vramscope.report.model"])
def test_any_import_order_works(first: str) -> None:
    # The OOM's facts are below its advice and the post-mortem above both: no order can run in a circle.
    code = f"import {first}; from vramscope.oom import advise, build_report, post_mortem; import vramscope.advice.oom"
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_report_json_carries_the_typed_advice(leak_report: LogReport) -> None:
    # report --json's recommendations are the typed Advice at the JSON edge, urgent (the leak) first.
    recs = summary_of(leak_report)["recommendations"]
    assert recs and recs[0]["name"] == "leak" and recs[0]["urgent"] and recs[0]["source"] == "log"
    assert set(recs[0]) == set(Advice("k", "t", "d").to_dict())
