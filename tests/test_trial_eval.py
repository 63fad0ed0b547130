"""The evaluation pass of a tuning trial (issue 28 item 8): a real HF Trainer script on CPU, its own eval set and
metric, run as a trial child through the start-up hook; and the pieces (how many eval batches, the extrapolation)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.tune.command import run_trial_child
from vramscope.tune.command_trial import TrialRequest
from vramscope.tune.trial_eval import EVAL_STEPS_CAP, eval_steps, extrapolate

PY = sys.executable
# The eval entries the trial child wrote before the entry had a typed owner (EvalPass.run's dict), captured from
# these same scenarios at 2573deb: the child still writes them byte for byte.
OLD_ENTRIES: dict[str, str] = json.loads((Path(__file__).parent / "data" / "trial_eval" / "child_entries.json")
                                         .read_text(encoding="utf-8"))

# A script of the usual shape: its own eval set, compute_metrics, evaluation every few steps. Its metric writes a
# file when it runs, to show the trial does not compute it; nothing after train() may run either.
SCRIPT = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    out = Path(sys.argv[1])
    metric_mode = sys.argv[2]  # "metric", "loss", "no_eval_set", "oom_in_eval", "fails_in_eval"
    accumulate = None if sys.argv[3] == "none" else int(sys.argv[3])
    eval_rows = int(sys.argv[4])
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                         max_position_embeddings=128))

    class Rows(torch.utils.data.Dataset):
        def __init__(self, n):
            self.rows = [torch.randint(0, 64, (6 + i % 5,)) for i in range(n)]
        def __len__(self):
            return len(self.rows)
        def __getitem__(self, i):
            return {"input_ids": self.rows[i]}

    def collate(batch):
        longest = max(len(b["input_ids"]) for b in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        for r, b in enumerate(batch):
            ids[r, : len(b["input_ids"])] = b["input_ids"]
        return {"input_ids": ids, "labels": ids.clone()}

    def metric(prediction):
        (out / "metric_ran").write_text("yes")
        return {"x": 1.0}

    args = TrainingArguments(output_dir=str(out / "run"), per_device_train_batch_size=2,
                             per_device_eval_batch_size=eval_rows, eval_strategy="steps", eval_steps=1,
                             eval_accumulation_steps=accumulate, max_steps=20, report_to="none", use_cpu=True,
                             save_strategy="no")
    class FailInEval(TrainerCallback):  # an eval batch fails as a real OOM (or another error) would
        def on_prediction_step(self, args, state, control, **kwargs):
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen == 3 and metric_mode == "oom_in_eval":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
            if self.seen == 2 and metric_mode == "fails_in_eval":  # loss only: 2 batches
                raise KeyError("a column the metric needs")

    trainer = Trainer(model=model, args=args, train_dataset=Rows(10),
                      eval_dataset=None if metric_mode == "no_eval_set" else Rows(45), data_collator=collate,
                      compute_metrics=metric if metric_mode in ("metric", "oom_in_eval") else None,
                      callbacks=[FailInEval()])
    trainer.train()
    print("trained")
""")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "train_with_eval.py"
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def _trial(tmp_path: Path, script: Path, mode: str, accumulate: str = "none", eval_rows: int = 4,
           eval_batch: int | None = 5, old: str | None = None) -> dict:
    request = TrialRequest(batch_size=3, seq_len=24, max_steps=2, record=str(tmp_path / "trial.json"),
                           eval_batch_size=eval_batch)
    outcome = run_trial_child([PY, str(script), str(tmp_path), mode, accumulate, str(eval_rows)], request,
                              log_path=str(tmp_path / "trial.log"), timeout_s=300)
    assert outcome.trial.ok, (tmp_path / "trial.log").read_text()
    text = (tmp_path / "trial.json").read_text(encoding="utf-8")
    assert OLD_ENTRIES[old or mode] in text  # the entry's bytes, as the child wrote them before TrialEval
    record: dict = json.loads(text)
    assert record["status"] == "done" and [s["step"] for s in record["steps"]] == [1, 2]
    assert "trained" not in (tmp_path / "trial.log").read_text()  # it exited after the pass, as after the steps
    return record


@pytest.mark.slow  # a child Python that imports transformers: 10-20 s here
def test_a_trial_evaluates_at_the_eval_batch_with_the_logits_kept(tmp_path: Path, script: Path) -> None:
    record = _trial(tmp_path, script, "metric")
    evaluation = record["eval"]
    # compute_metrics without eval_accumulation_steps: every batch's logits stay on the device until the eval set
    # ends, so the pass runs as many batches as the real one holds (45 examples at 5 a batch: 9), capped at 8.
    assert evaluation["status"] == "done" and evaluation["logits"] == "kept"
    assert (evaluation["steps_total"], evaluation["steps_held"], evaluation["steps_run"]) == (9, 9, EVAL_STEPS_CAP)
    # Every eval batch was the trial's eval batch (5 rows, the request's, not the script's 4) of its 24 tokens.
    assert evaluation["inputs"] == [[5, 24]] * EVAL_STEPS_CAP
    assert evaluation["batch_size"] == 5 and evaluation["eval_examples"] == 45
    assert not (tmp_path / "metric_ran").exists()  # the user's metric was not computed over tiled rows
    assert record["cuda"] is False and "peak_allocated_bytes" not in evaluation  # no CUDA here: shapes only
    # The training steps still saw the training batch.
    assert [s["inputs"] for s in record["steps"]] == [[[3, 24]], [[3, 24]]]


@pytest.mark.slow
def test_loss_only_and_accumulated_evaluations_run_a_few_batches(tmp_path: Path, script: Path) -> None:
    (tmp_path / "loss").mkdir()
    (tmp_path / "acc").mkdir()
    loss = _trial(tmp_path / "loss", script, "loss")
    assert loss["eval"]["logits"] == "none" and loss["eval"]["steps_run"] == 2
    assert loss["eval"]["inputs"] == [[5, 24]] * 2
    accumulated = _trial(tmp_path / "acc", script, "metric", accumulate="3", old="accumulated")
    # eval_accumulation_steps 3: the third batch concatenates onto two before they move to the host; a fourth.
    assert accumulated["eval"]["logits"] == "kept" and accumulated["eval"]["steps_run"] == 4


@pytest.mark.slow
def test_a_trainer_without_an_eval_set_says_so(tmp_path: Path, script: Path) -> None:
    record = _trial(tmp_path, script, "no_eval_set")
    assert record["eval"]["status"] == "no_eval_dataset"


@pytest.mark.slow
def test_an_out_of_memory_error_in_evaluation_is_the_trials_attributed_to_evaluation(tmp_path: Path,
                                                                                     script: Path) -> None:
    request = TrialRequest(batch_size=3, seq_len=24, max_steps=2, record=str(tmp_path / "trial.json"),
                           eval_batch_size=5)
    outcome = run_trial_child([PY, str(script), str(tmp_path), "oom_in_eval", "none", "4"], request,
                              log_path=str(tmp_path / "trial.log"), timeout_s=300)
    text = (tmp_path / "trial.json").read_text(encoding="utf-8")
    assert OLD_ENTRIES["oom_in_eval"] in text
    record = json.loads(text)
    assert not outcome.trial.ok and record["status"] == "oom" and record["phase"] == "eval"
    assert outcome.trial.error == "in evaluation: cuda_allocator: CUDA out of memory. Tried to allocate 3.00 GiB"
    assert len(record["steps"]) == 2  # both training steps ran; the evaluation after them did not end
    assert outcome.phases.phase == "eval" and outcome.phases.eval is not None
    assert (outcome.phases.eval.status, outcome.phases.eval.batch_size, outcome.phases.eval.logits) == \
        ("oom", 5, "kept")
    assert "trained" not in (tmp_path / "trial.log").read_text()


@pytest.mark.slow
def test_another_failure_in_evaluation_leaves_the_trial_with_its_training_steps(tmp_path: Path,
                                                                              script: Path) -> None:
    record = _trial(tmp_path, script, "fails_in_eval")
    assert record["eval"]["status"] == "failed" and "KeyError" in record["eval"]["error"]


@pytest.mark.slow
def test_a_named_iterable_eval_set_is_written_as_before(tmp_path: Path) -> None:
    # The Trainer's eval sets by name, the first an iterable one (no length: the real evaluation's batches unknown).
    plain = 'eval_dataset=None if metric_mode == "no_eval_set" else Rows(45)'
    named = ('eval_dataset={"held": type("Stream", (torch.utils.data.IterableDataset,), '
             '{"__iter__": lambda self: iter(Rows(45))})()}')
    assert plain in SCRIPT
    script = tmp_path / "named_eval_sets.py"
    script.write_text(SCRIPT.replace(plain, named), encoding="utf-8")
    evaluation = _trial(tmp_path, script, "loss", old="named_iterable")["eval"]
    assert evaluation["eval_set"] == "held" and evaluation["steps_total"] is None and "eval_examples" not in evaluation


def test_eval_batches_follow_what_the_evaluation_holds() -> None:
    assert eval_steps("kept", total_steps=3, accumulation_steps=None) == (3, 3)  # a small eval set, all of it
    assert eval_steps("kept", total_steps=125, accumulation_steps=None) == (EVAL_STEPS_CAP, 125)
    assert eval_steps("kept", total_steps=None, accumulation_steps=None) == (EVAL_STEPS_CAP, EVAL_STEPS_CAP)
    assert eval_steps("preprocessed", total_steps=125, accumulation_steps=2) == (3, 3)
    assert eval_steps("kept", total_steps=125, accumulation_steps=40) == (EVAL_STEPS_CAP, 41)
    assert eval_steps("none", total_steps=125, accumulation_steps=None) == (2, 2)
    assert eval_steps("per_batch", total_steps=1, accumulation_steps=None) == (1, 1)


def test_the_held_logits_are_extrapolated_from_the_last_batches_growth() -> None:
    # Each batch adds 2 units (its logits and the concatenation's copy): 8 measured, 125 held.
    peaks = [10 + 2 * k for k in range(8)]
    assert extrapolate(peaks, 8) == 24
    assert extrapolate(peaks, 125) == 24 + 2 * 117
    assert extrapolate([10, 9], 50) == 10  # no growth: the largest measured
    assert extrapolate([7], 50) == 7 and extrapolate([], 3) == 0
