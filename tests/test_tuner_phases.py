"""tune -- <command> sees the whole run (issue 28 item 8): the eval batch each trial evaluates at, read from the
command; a trial's per-phase peaks from its records; the phase that limits the answer, in the terminal and JSON.

The trials themselves need CUDA (tests/test_tuner_gpu.py); here the search runs over trials whose peaks follow a
known memory model (the pure search's boundary), and the records are in the form the trial child writes
(tests/test_trial_eval.py runs the child itself on CPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vramscope.cli.tune_command import format_command_result
from vramscope.commands import parse_command
from vramscope.tune.command import CommandTrial, CommandTuneResult
from vramscope.tune.phase_limit import (
    PhasePeaks,
    describe_eval,
    eval_batch_for,
    eval_follows_train,
    eval_plan_check,
    limiting,
    phase_peaks,
)
from vramscope.tune.search import Trial, search
from vramscope.tune.trial_record import TrialEval, TrialRecord

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
GIB = 2**30


def _hf(*flags: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--output_dir", "o",
            "--per_device_train_batch_size", "4", "--max_seq_length", "512", *flags]


def test_each_trial_evaluates_at_the_commands_eval_batch() -> None:
    assert eval_batch_for(parse_command(_hf()), 4) is None  # no evaluation: no pass
    given = parse_command(_hf("--eval_strategy", "steps", "--per_device_eval_batch_size", "16"))
    assert given.eval.evaluates and eval_batch_for(given, 4) == 16 and eval_batch_for(given, 9) == 16
    default = parse_command(_hf("--do_eval"))
    assert eval_batch_for(default, 4) == 8 and not eval_follows_train(default)  # TrainingArguments' default


def test_axolotls_eval_batch_follows_the_batch_tried(tmp_path: Path) -> None:
    # axolotl's eval_batch_size defaults to micro_batch_size: the batch the trial tries.
    config = tmp_path / "qlora.yml"
    config.write_text("base_model: NousResearch/Llama-2-7b-hf\nload_in_4bit: true\nadapter: qlora\n"
                      "sequence_len: 1024\nmicro_batch_size: 2\nval_set_size: 0.05\nlora_r: 8\n", encoding="utf-8")
    parsed = parse_command(["axolotl", "train", str(config)], cwd=tmp_path)
    assert parsed.eval.evaluates and eval_follows_train(parsed)
    assert eval_batch_for(parsed, 5) == 5 and eval_batch_for(parsed, 7) == 7
    config.write_text(config.read_text() + "eval_batch_size: 3\n", encoding="utf-8")
    fixed = parse_command(["axolotl", "train", str(config)], cwd=tmp_path)
    assert eval_batch_for(fixed, 7) == 3 and not eval_follows_train(fixed)


def _record(train: list[int], evaluation: dict | None = None, **top: object) -> TrialRecord:
    steps = [{"step": i + 1, "peak_allocated_bytes": p, "peak_reserved_bytes": p + GIB} for i, p in enumerate(train)]
    return TrialRecord.from_json({"status": "done", "steps": steps, **({"eval": evaluation} if evaluation else {}),
                                  **top})


def test_a_trials_phases_come_from_every_rank_and_step() -> None:
    evaluation = {"status": "done", "batch_size": 8, "logits": "kept", "steps_run": 8, "steps_held": 20,
                  "extrapolated_steps": 12, "peak_allocated_bytes": 30 * GIB, "peak_reserved_bytes": 31 * GIB}
    peaks = phase_peaks([_record([20 * GIB, 22 * GIB], evaluation), _record([23 * GIB], dict(evaluation,
                         peak_allocated_bytes=29 * GIB, peak_reserved_bytes=33 * GIB))])
    assert (peaks.train_allocated, peaks.train_reserved) == (23 * GIB, 24 * GIB)
    assert (peaks.eval_allocated, peaks.eval_reserved) == (30 * GIB, 33 * GIB)
    assert peaks.peak_allocated == 30 * GIB and peaks.peak_reserved == 33 * GIB and peaks.phase == "eval"
    assert describe_eval(peaks.eval) == ("per_device_eval_batch_size 8, logits kept, 8 of 20 held eval batches "
                                         "run, the rest extrapolated")
    # The evaluation runs in the training step's cached reserve: a reserve peak as high as the step's is not the
    # evaluation's; the allocations say which phase needed more.
    cached = phase_peaks([_record([20 * GIB], {"status": "done", "batch_size": 8, "logits": "none",
                                               "peak_allocated_bytes": 12 * GIB, "peak_reserved_bytes": 21 * GIB})])
    assert cached.phase == "train"
    oom = phase_peaks([TrialRecord.from_json({"status": "oom", "phase": "eval",
                                              "steps": [{"peak_allocated_bytes": 5}]})])
    assert oom.phase == "eval" and oom.oom_phase == "eval"
    assert phase_peaks([_record([7])]).phase == "train" and phase_peaks([_record([7])]).eval is None


# A memory model: the training step holds 10 + 8b GiB, the evaluation (its batch following the batch tried, logits
# kept) 10 + 11b GiB, on a 100 GiB device. The step alone would fit 10 (5% margin: 95 GiB); evaluation fits 7.
CAPACITY = 100 * GIB


def _run(size: int, done: list[CommandTrial]) -> Trial:
    train, evaluation = (10 + 8 * size) * GIB, (10 + 11 * size) * GIB
    info = TrialEval(status="done", batch_size=size, logits="kept", steps_run=4, steps_held=4)
    if evaluation > CAPACITY:
        phases = PhasePeaks(train, train, eval=info, oom_phase="eval")
        trial = Trial(size=size, ok=False, base_bytes=10 * GIB, peak_bytes=None, seconds=1.0,
                      error="in evaluation: CUDA out of memory", base_reserved_bytes=10 * GIB)
    else:
        phases = PhasePeaks(train, train, evaluation, evaluation, eval=info)
        trial = Trial(size=size, ok=True, base_bytes=10 * GIB, peak_bytes=phases.peak_allocated, seconds=1.0,
                      base_reserved_bytes=10 * GIB, peak_reserved_bytes=phases.peak_reserved)
    done.append(CommandTrial(trial, CAPACITY, {}, f"trial{len(done) + 1}.log", phases))
    return trial


def test_the_answer_names_the_evaluation_that_limits_it() -> None:
    done: list[CommandTrial] = []
    result = search(lambda size: _run(size, done), CAPACITY, start=1, max_size=64, margin=0.05, max_trials=6)
    assert result.size == 7
    sized = [(t.size, t.ok, t.limited()[1], o.phases) for t, o in zip(result.trials, done, strict=True)]
    limit = limiting(sized, result.size, CAPACITY * 0.95)
    # The fitted line is exact here: 8 was not run; the line rules it out, through the evaluation's peak.
    assert (limit.phase, limit.at_size, limit.measured) == ("eval", 8, False)
    words = limit.words(7, follows=True)
    assert words == ("batch 7 fits; evaluation (eval batch 7, the batch tried, logits kept) limits it at 8 "
                     "(by the trials' fitted line; not run)")
    tuned = CommandTuneResult(result=result, unit="batch", batch_size=7, seq_len=512,
                              setting="micro_batch_size: 7 (in qlora.yml)", keep_effective=None,
                              trials=tuple(done), notes=(), limit=limit, eval_follows=True)
    out = json.loads(json.dumps(tuned.to_dict(), default=str))
    assert out["limiting_phase"] == "eval" and out["limit"]["words"] == words
    assert out["phase_peaks"]["train"]["peak_reserved_bytes"] == (10 + 8 * 7) * GIB
    assert out["phase_peaks"]["eval"]["peak_reserved_bytes"] == (10 + 11 * 7) * GIB
    assert out["phase_peaks"]["eval"]["logits"] == "kept"
    assert [row["phase"] for row in out["trials"]] == [o.phases.phase for o in done]
    text = format_command_result(out)
    assert f"  limit: {words}" in text
    assert "  peak reserved at 7: training step 66.00 GiB, evaluation 87.00 GiB" in text


def test_without_a_larger_trial_the_answers_own_peak_names_the_phase() -> None:
    loss_only = TrialEval(status="done", batch_size=8, logits="none")
    train_sets = PhasePeaks(40 * GIB, 41 * GIB, 12 * GIB, 41 * GIB, eval=loss_only)
    limit = limiting([(6, True, 41 * GIB, train_sets)], 6, 95 * GIB, capped=True)
    assert (limit.phase, limit.at_size) == ("train", None)
    assert limit.words(6) == "batch 6 fits; the training step sets its peak"
    # A size above that ran out of memory in evaluation names it, measured.
    evaluation = PhasePeaks(50 * GIB, 51 * GIB, eval=TrialEval(batch_size=8, logits="kept"), oom_phase="eval")
    limit = limiting([(6, True, 41 * GIB, train_sets), (9, False, None, evaluation),
                      (7, True, 96 * GIB, train_sets)], 6, 95 * GIB)
    assert (limit.phase, limit.at_size, limit.ran_out) == ("train", 7, False)  # 7 broke the margin: the step
    limit = limiting([(6, True, 41 * GIB, train_sets), (7, False, None, evaluation)], 6, 95 * GIB)
    assert limit.words(6) == ("batch 6 fits; evaluation (per_device_eval_batch_size 8, logits kept) limits it "
                              "at 7 (out of memory)")


def test_a_command_that_does_not_evaluate_is_limited_by_its_step() -> None:
    done: list[CommandTrial] = []

    def run(size: int) -> Trial:
        peak = (10 + 8 * size) * GIB
        trial = Trial(size=size, ok=peak <= CAPACITY, base_bytes=10 * GIB, seconds=1.0, base_reserved_bytes=10 * GIB,
                      peak_bytes=peak if peak <= CAPACITY else None,
                      peak_reserved_bytes=peak if peak <= CAPACITY else None)
        done.append(CommandTrial(trial, CAPACITY, {}, "t.log", PhasePeaks(trial.peak_bytes, trial.peak_bytes)))
        return trial

    result = search(run, CAPACITY, max_size=64, max_trials=5)
    tuned = CommandTuneResult(result=result, unit="batch", batch_size=result.size, seq_len=512,
                              setting=f"--per_device_train_batch_size {result.size}", keep_effective=None,
                              trials=tuple(done), notes=())
    out = tuned.to_dict()
    assert out["limiting_phase"] == "train" and out["limit"] is None and "eval" not in out["phase_peaks"]
    assert "limit:" not in format_command_result(out)


def test_without_an_eval_pass_the_answer_is_checked_against_the_eval_plan() -> None:
    parsed = parse_command(_hf("--eval_strategy", "steps", "--per_device_eval_batch_size", "16"))
    loss = eval_plan_check(parsed, 4, 512, 80 * GIB, None)
    assert loss.startswith("checked against the planner's eval plan instead: evaluation at "
                           "per_device_eval_batch_size 16 (loss only) is planned at ") and loss.endswith("it fits")
    # What the trial's Trainer recorded (logits kept, 2,000 eval examples) is what the plan is made for: 125 eval
    # batches of [16, 512, 32000] fp32 logits held on the GPU do not fit 80 GiB.
    kept = eval_plan_check(parsed, 4, 512, 80 * GIB, TrialEval(status="failed", logits="kept",
                                                                 eval_examples=2000))
    assert "(logits kept)" in kept and kept.endswith("it does not fit")
    assert eval_plan_check(parse_command(_hf()), 4, 512, 80 * GIB, None) == ""  # no evaluation: nothing to check
