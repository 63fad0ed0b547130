"""The trial record has one owner (vramscope.tune.trial_record): what the trial child writes, the tuner reads back
as the same typed record, and a record torn by a killed child reads as the tuner always read it: a file it cannot
parse is no record, one cut short holds what the child wrote before it died.

The records here are written by the real child (the start-up hook in a real HF Trainer run on the CPU, killed by a
real SIGKILL in one case); the memory figures need CUDA (tests/test_command_tuner_gpu.py)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.tune.command import TrialFailed, run_trial_child
from vramscope.tune.trial_record import (
    TrialEval,
    TrialRecord,
    TrialRequest,
    TrialStep,
    read_record,
    read_records,
    record_path,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
PY = sys.executable

# The keys the child wrote before the record had an owner (its free dict), on a machine without CUDA: the file
# keeps them, no more and no fewer.
CPU_RECORD_KEYS = {"status", "request", "rank", "pid", "steps", "cuda", "model_class", "parameters",
                   "parameters_held"}
CPU_STEP_KEYS = {"step", "inputs", "rss_bytes"}


@pytest.mark.slow  # a child Python with transformers and peft: 10-20 s here
def test_what_the_child_writes_the_tuner_reads_back_whole(tmp_path: Path, tiny_llama_dir: Path) -> None:
    argv = [PY, str(EXAMPLE), "--model_name_or_path", str(tiny_llama_dir), "--output_dir", str(tmp_path / "out"),
            "--per_device_train_batch_size", "2", "--max_steps", "50", "--report_to", "none", "--use_cpu",
            "--rows", "6", "--max_seq_length", "16"]
    request = TrialRequest(batch_size=3, seq_len=24, max_steps=2, record=str(tmp_path / "trial.json"))
    outcome = run_trial_child(argv, request, log_path=str(tmp_path / "trial.log"), timeout_s=300)
    assert outcome.trial.ok, (tmp_path / "trial.log").read_text()[-2000:]
    raw = json.loads((tmp_path / "trial.json").read_text(encoding="utf-8"))
    assert set(raw) == CPU_RECORD_KEYS and all(set(s) == CPU_STEP_KEYS for s in raw["steps"])
    # The round trip: the file is the record's JSON, and the record read from it writes the same file again.
    record = TrialRecord.from_json(raw)
    assert record == outcome.record and record.to_json() == raw
    assert record.request == request and record.status == "done" and record.rank == 0 and record.pid
    assert [(s.step, s.inputs) for s in record.steps] == [(1, ((3, 24),)), (2, ((3, 24),))]
    assert record.cuda is False and record.base_allocated_bytes is None and record.capacity_bytes is None
    assert record.parameters is not None and record.parameters_held == record.parameters > 0
    assert all(s.rss_bytes is not None and s.rss_bytes > 50 * 2**20 and s.peak_allocated_bytes is None
               for s in record.steps)  # the host memory; no CUDA peaks without CUDA


KILLED = """
import os, signal, sys
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
sys.path.insert(0, {examples!r})
from hf_trainer_lora import RandomRows, collate

class Killed(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:  # after the first step's record: the second step never ends
            print("killed in step 2", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
args = TrainingArguments(output_dir=sys.argv[2], use_cpu=True, report_to=[], max_steps=5, disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=RandomRows(8, 100, 16), data_collator=collate,
        callbacks=[Killed()]).train()
"""


@pytest.mark.slow  # a child Python with transformers and peft: 10-20 s here
def test_a_record_torn_by_a_killed_child_reads_as_it_stood(tmp_path: Path, tiny_llama_dir: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED.format(examples=str(EXAMPLE.parent))), encoding="utf-8")
    request = TrialRequest(batch_size=3, seq_len=24, max_steps=2, record=str(tmp_path / "trial.json"))
    # The tuner's answer to a child killed mid-trial is the one it gave before the record was typed.
    with pytest.raises(TrialFailed, match=r"the trial at batch 3 x 24's tokens failed: killed in step 2 \(exit -9"):
        run_trial_child([PY, str(script), str(tiny_llama_dir), str(tmp_path / "o")], request,
                        log_path=str(tmp_path / "t.log"), timeout_s=300)
    text = (tmp_path / "trial.json").read_text(encoding="utf-8")
    cut = read_record(str(tmp_path / "trial.json"))
    assert cut is not None and cut.to_json() == json.loads(text)
    assert cut.status == "training" and [s.step for s in cut.steps] == [1] and cut.error is None
    # A file cut in half (a full disk, a copy interrupted) is no record; the ranks beside it are still read.
    (tmp_path / "trial.json").write_text(text[: len(text) // 2], encoding="utf-8")
    Path(record_path(str(tmp_path / "trial.json"), 1)).write_text(text.replace('"rank": 0', '"rank": 1'))
    assert read_record(str(tmp_path / "trial.json")) is None
    assert [r.rank for r in read_records(str(tmp_path / "trial.json"))] == [1]


def test_what_cannot_be_read_is_no_record_and_a_field_of_another_type_is_unknown(tmp_path: Path) -> None:
    record = str(tmp_path / "trial.json")
    assert read_record(record) is None and read_records(record) == []  # killed before its first write
    Path(f"{record}.tmp").write_text('{"status": "st')  # killed inside a write: the file itself never appeared
    assert read_records(record) == []
    for text in ("", "[1, 2]", "null", '"done"', "{"):
        Path(record).write_text(text)
        assert read_record(record) is None, text
    with pytest.raises(ValueError, match="not a JSON object"):
        TrialRecord.from_json([1, 2])
    # A file edited by hand, or from another version: what is not of its type (or is a negative count) is unknown.
    odd = TrialRecord.from_json({"status": 3, "request": {"batch_size": "x"}, "rank": -1, "pid": True,
                                 "cuda": "yes", "base_allocated_bytes": 1.5, "capacity_bytes": "24",
                                 "eval": [1], "steps": [{"step": -2, "inputs": [[3, "a"], [2, 8]],
                                                         "peak_allocated_bytes": -5, "rss_bytes": 7}, "x"]})
    assert odd == TrialRecord(steps=(TrialStep(step=None, inputs=((2, 8),), rss_bytes=7),))
    # The eval entry the same way: not an object is no entry, a field of another type is unknown, an unknown key is
    # not kept, a shape or peak that is not a count is left out of its list.
    foreign = TrialRecord.from_json({"eval": {"status": 3, "batch_size": "8", "logits": "kept", "steps_run": -1,
                                              "inputs": [[5, "a"], [5, 24]], "step_peaks": [1, -2, "x", 3],
                                              "extrapolated_steps": 2.5, "from_elsewhere": 1}})
    assert foreign.eval == TrialEval(logits="kept", inputs=((5, 24),), step_peaks=(1, 3))
    assert TrialRecord.from_json({"eval": {}}).eval == TrialEval() and TrialRecord(eval=TrialEval()).to_json() == \
        {"steps": [], "eval": {}}
    assert TrialRecord.from_json({}) == TrialRecord() and TrialRecord().to_json() == {"steps": []}


def test_the_invariants_hold_where_a_record_is_built() -> None:
    with pytest.raises(AssertionError, match="never negative"):
        TrialStep(step=-1)
    with pytest.raises(AssertionError, match="peak_reserved_bytes is never negative"):
        TrialStep(step=1, peak_reserved_bytes=-1)
    with pytest.raises(AssertionError, match="shape is never negative"):
        TrialStep(step=1, inputs=((3, -24),))
    with pytest.raises(AssertionError, match="base_allocated_bytes is never negative"):
        TrialRecord(status="training", base_allocated_bytes=-1)
    evaluation = TrialEval(batch_size=8, logits="kept", eval_accumulation_steps=2, eval_set="val", eval_examples=40,
                           steps_total=5, steps_held=3, steps_run=3, status="done", inputs=((8, 16),) * 3,
                           step_peaks=(5, 6, 7), peak_allocated_bytes=7, peak_reserved_bytes=9,
                           measured_peak_allocated_bytes=7, extrapolated_steps=0)
    whole = TrialRecord(status="oom", request=TrialRequest(2, None, 2, "/r/t.json", 10, 8), rank=1, pid=42,
                        steps=(TrialStep(1, ((2, 16),), 5, 6, 4, 6, 9, 8, 3),), cuda=True, model_class="M",
                        parameters=10, parameters_held=5, device=0, device_name="H200", total_bytes=100,
                        capacity_bytes=90, base_allocated_bytes=2, base_reserved_bytes=3, phase="eval",
                        eval=evaluation, error="cuda_allocator: CUDA out of memory")
    assert TrialRecord.from_json(json.loads(json.dumps(whole.to_json()))) == whole  # every field survives the file


# Records in the form the child wrote before the eval entry had a typed owner (TrialRecord.to_json at 2573deb):
# a real CPU child's (tests/test_trial_eval.py writes them again), and the CUDA child's shapes of the entry: its
# peaks extrapolated past the batches run, an OOM in the pass with the batches' peaks so far, an OOM before the
# pass had read its settings.
OLD_RECORDS = sorted((Path(__file__).parent / "data" / "trial_eval").glob("*.json"))


@pytest.mark.parametrize("path", [p for p in OLD_RECORDS if p.name != "child_entries.json"], ids=lambda p: p.stem)
def test_a_record_with_an_eval_entry_writes_its_file_again_byte_for_byte(path: Path, tmp_path: Path) -> None:
    record = read_record(str(path))
    assert record is not None and record.eval is not None
    assert json.dumps(record.to_json()) == path.read_text(encoding="utf-8")
    raw = json.loads(path.read_text(encoding="utf-8"))["eval"]
    assert (record.eval.status, record.eval.batch_size, record.eval.step_peaks) == \
        (raw["status"], raw["batch_size"], None if "step_peaks" not in raw else tuple(raw["step_peaks"]))


def test_an_eval_entry_holds_its_invariants() -> None:
    with pytest.raises(AssertionError, match="steps_run is never negative"):
        TrialEval(steps_run=-1)
    with pytest.raises(AssertionError, match="peak is never negative"):
        TrialEval(step_peaks=(3, -1))
    with pytest.raises(AssertionError, match="shape is never negative"):
        TrialEval(inputs=((5, -24),))
