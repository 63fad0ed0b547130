"""The whole run as phases (issue 28): evaluation, DPO/KTO/reward steps, GRPO's generation, the events between
steps, and the plan's JSON and terminal. The eval, no-grad forward and KV-cache figures are checked against a real
HF Trainer.evaluate, a real forward and a real model.generate on a tiny Llama on the CPU, with the tensors alive
counted by the trace's counter (planner/trace/counter.py)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from typing import Any

import pytest

from vramscope.cli import main
from vramscope.planner import estimate, plan, resolve_model
from vramscope.planner.errors import PlanInputError
from vramscope.planner.frameworks import FRAMEWORK_TABLE, precision
from vramscope.planner.phases import (
    RunPhases,
    eval_accumulation_peak,
    generation_phase,
    kv_cache_bytes,
    nograd_layer_bytes,
    plan_run,
)
from vramscope.planner.shapes import shape_from_config
from vramscope.recipe import QLoraSpec

GIB = 2**30


def shape(name: str):  # type: ignore[no-untyped-def]
    return resolve_model(name)[1]


# --- the default is today's plan ---------------------------------------------------------------------------

def test_a_plain_plan_is_one_sft_step_with_the_same_numbers() -> None:
    old = estimate(shape("Llama-3-8B"), QLoraSpec(), 4, 1024)
    p = plan("Llama-3-8B", 4, 1024)
    assert (p.peak_allocated_bytes, p.peak_reserved_bytes, p.process_bytes) == (
        old.peak_allocated_bytes, old.peak_reserved_bytes, old.process_bytes)
    assert p.peak_phase == old.peak_phase and p.run_peak_phase == "train"
    out = p.to_dict()
    assert out["peak_phase"] == "train" and out["step_peak_phase"] == old.peak_phase
    # loading is a phase of every run; it sets nothing here (its peak is the weights and adapters)
    assert set(out["phases"]) == {"load", "train"}
    assert out["phases"]["train"]["peak_allocated_bytes"] == p.peak_allocated_bytes
    assert out["trainer"] == "sft" and out["step_phases"] == old.phases


# --- evaluation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["hf", "trl"])
def test_the_eval_peak_grows_with_the_batches_held_only_when_logits_are_kept(framework: str) -> None:
    spec = QLoraSpec(framework=framework)

    def eval_peak(logits: str, examples: int, every: int | None = None) -> int:
        run = RunPhases(eval_batch=8, eval_logits=logits, eval_examples=examples, eval_accumulation_steps=every)
        return plan_run(shape("Llama-3-8B"), spec, 2, 1024, run=run).phases["eval"].peak_allocated_bytes

    V, T = 128256, 8 * 1024
    logits_and_labels = 4 * T * V + 8 * T
    # compute_metrics keeps fp32 [8, 1024, V] logits and the labels per batch, concatenated on the GPU
    assert eval_peak("kept", 80) - eval_peak("kept", 40) == pytest.approx(2 * 5 * logits_and_labels, rel=1e-6)
    # loss only, or argmax ids and labels (16 bytes a token, the next forward's peak beside them): nothing
    # vocabulary-sized piles up
    assert eval_peak("none", 80) == eval_peak("none", 8)
    assert eval_peak("argmax", 80) - eval_peak("argmax", 40) == 5 * 16 * T
    # eval_accumulation_steps bounds what is held, whatever the eval set's size
    assert eval_peak("kept", 800, every=2) == eval_peak("kept", 32, every=2) < eval_peak("kept", 32)


def test_the_eval_loop_replay_holds_old_and_new_predictions_at_each_concatenation() -> None:
    X, tr = 1000, 10
    # step 1 adopts its tensors, step k >= 2 builds a tensor of k batches beside the k-1 old ones and its own
    assert eval_accumulation_peak(X, X, tr, 3, None) == (6 * X, 6 * X, "eval concat")
    # every 2 batches the predictions go to the host; the next cycle starts again
    assert eval_accumulation_peak(X, X, tr, 4, 2) == (4 * X, 4 * X, "eval concat")
    # a large forward beside the 2 gathered batches and the last one's own tensors
    assert eval_accumulation_peak(X, X, 10 * X, 3, None) == (13 * X, 3 * X, "eval forward")
    # loss only: the forward's own transient is the peak
    assert eval_accumulation_peak(0, 0, tr, 50, None) == (tr, 0, "eval forward")
    # a long eval set is planned from its last step, as the replay of every step finds it, and at once
    for transient in (tr, 40 * X):
        replayed = eval_accumulation_peak(X + 3, X, transient, 40, 10**6)  # never reaches the host: a replay
        assert eval_accumulation_peak(X + 3, X, transient, 40, None) == replayed
    assert eval_accumulation_peak(X, X, tr, 10**12, None)[0] == 2 * 10**12 * X


def _tiny_llama(vocab: int = 4096, intermediate: int = 128) -> Any:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=intermediate, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                                   max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model


def _counted(model: Any, fn: Any) -> int:
    """Peak bytes of the tensors ``fn`` creates (the model's own parameters are counted before it starts)."""
    torch = pytest.importorskip("torch")
    from vramscope.planner.trace.counter import LiveBytes

    counter = LiveBytes()
    for t in [*model.parameters(), *model.buffers()]:
        counter.track(t)
    start = counter.now
    counter.reset_peak()
    with torch.no_grad(), counter:
        fn()
    return counter.peak - start


# A CPU step: fp32, no autocast, no LoRA dropout, no quantization: the planner's HF Trainer model with
# autocast off is exactly that program.
CPU_SPEC = QLoraSpec(bits=16, compute_dtype="fp32", lora_dropout=0.0, framework="hf")
CPU_HF = dataclasses.replace(FRAMEWORK_TABLE["hf"], autocast=False)


@pytest.mark.parametrize("logits", ["none", "kept", "argmax"])
def test_the_eval_plan_matches_a_real_trainer_evaluate(logits: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = _tiny_llama()
    b, s = 2, 64
    shp = shape_from_config(model.config.to_dict())

    def measured(examples: int) -> int:
        data = [{"input_ids": torch.randint(0, 4096, (s,)), "labels": torch.randint(0, 4096, (s,)),
                 "attention_mask": torch.ones(s, dtype=torch.long)} for _ in range(examples)]
        extra: dict[str, Any] = {}
        if logits != "none":
            extra["compute_metrics"] = lambda p: {"rows": float(len(p.predictions))}
        if logits == "argmax":
            extra["preprocess_logits_for_metrics"] = lambda out, labels: out.argmax(-1)
        with tempfile.TemporaryDirectory() as d:
            args = transformers.TrainingArguments(output_dir=d, per_device_eval_batch_size=b, report_to=[],
                                                  use_cpu=True, disable_tqdm=True)
            trainer = transformers.Trainer(model=model, args=args, eval_dataset=data,
                                           data_collator=transformers.default_data_collator, **extra)
            return _counted(model, trainer.evaluate)

    def planned(examples: int) -> int:
        run = RunPhases(eval_batch=b, eval_logits=logits, eval_examples=examples)
        bd = plan_run(shp, CPU_SPEC, 1, s, run=run, framework=CPU_HF).phases["eval"].breakdown
        return bd.temporaries + bd.eval_predictions + bd.activations  # what the evaluation adds to the weights

    for examples in (2, 8):
        assert planned(examples) == pytest.approx(measured(examples), rel=0.01)
    if logits == "kept":
        assert measured(8) > 3 * measured(2)  # the classic eval OOM: every batch's logits stay
    else:
        assert measured(8) == pytest.approx(measured(2), rel=0.01)


def test_a_no_grad_forward_matches_a_real_one() -> None:
    # the evaluation's, the reference's and the generation prefill's working set
    model = _tiny_llama(vocab=256, intermediate=512)
    torch = pytest.importorskip("torch")
    shp = shape_from_config(model.config.to_dict())
    pr = precision(CPU_SPEC, CPU_HF)
    for b, s in ((2, 128), (4, 256)):
        x = torch.randint(0, 256, (b, s))
        real = _counted(model, lambda x=x: model.model(input_ids=x, use_cache=False))
        assert nograd_layer_bytes(shp, CPU_SPEC, b, s, pr) == pytest.approx(real, rel=0.02)


def test_eval_mid_training_runs_beside_the_optimizer_states_but_not_the_gradients() -> None:
    spec = QLoraSpec(framework="trl", optim="adamw_torch")
    p = plan_run(shape("Llama-2-7B"), spec, 2, 1024, run=RunPhases(eval_batch=4))
    ev, train = p.phases["eval"].breakdown, p.phases["train"].breakdown
    assert ev.optimizer_states == train.optimizer_states > 0
    assert ev.lora_weights == train.lora_weights and ev.lora_gradients == 0
    assert ev.eval_predictions == 0  # loss only: TRL's fused head, no logits


def test_the_eval_phase_sets_the_peak_and_says_what_to_change() -> None:
    run = RunPhases(eval_batch=8, eval_logits="kept", eval_examples=400)
    p = plan("Llama-3-8B", 2, 1024, QLoraSpec(framework="trl"), gpu="H200", run=run)
    assert p.run_peak_phase == "eval" and not p.fits
    assert p.peak_allocated_bytes == p.run.phases["eval"].peak_allocated_bytes > 100 * GIB
    assert p.cannot_fit_reason is not None and "eval phase" in p.cannot_fit_reason
    assert p.recommendations[0].name in ("eval_accumulation", "eval_argmax") and p.recommendations[0].sufficient


# --- trainers ------------------------------------------------------------------------------------------------

def test_a_dpo_step_is_an_sft_step_at_twice_the_rows_plus_the_reference_forward() -> None:
    s, spec = shape("Llama-3-8B"), QLoraSpec(framework="trl")
    sft2b = estimate(s, spec, 8, 1024)
    dpo = plan_run(s, spec, 4, 1024, run=RunPhases(trainer="dpo")).phases["train"]
    assert dpo.rows == 8
    for moment, allocated in sft2b.phases.items():
        assert dpo.moments[moment] == allocated
    ref = dpo.moments["reference forward"]
    # the reference runs beside the policy's saved activations and adds at most one no-grad layer or its head
    assert sft2b.phases["forward"] - 2 * GIB < ref < sft2b.phases["forward"] + 2 * GIB
    assert dpo.peak_allocated_bytes == max(*sft2b.phases.values(), ref)
    pre = plan_run(s, spec, 4, 1024, run=RunPhases(trainer="dpo", precompute_ref=True))
    assert "reference forward" not in pre.phases["train"].moments
    assert pre.phases["precompute_ref"].breakdown.optimizer_states == 0  # it runs before the first step


def test_the_python_api_plans_a_dpo_run_with_trls_dtypes() -> None:
    p = plan("Llama-2-7B", 2, 1024, run=RunPhases(trainer="dpo"))
    assert p.framework == "trl" and any("TRL's" in n for n in p.notes)
    assert p.run.phases["train"].rows == 4
    assert all(r.name not in ("micro_batch", "seq_len") for r in p.recommendations)


def test_the_reward_model_has_no_vocabulary_sized_logits() -> None:
    s, spec = shape("Qwen2.5-7B"), QLoraSpec(framework="trl")
    reward = plan_run(s, spec, 4, 1024, run=RunPhases(trainer="reward")).phases["train"]
    dpo = plan_run(s, spec, 4, 1024, run=RunPhases(trainer="dpo", precompute_ref=True)).phases["train"]
    assert reward.rows == dpo.rows == 8
    assert reward.breakdown.logits_and_loss < 16 * 8 * 1024 * s.hidden  # a score per position, h-sized grads
    assert reward.peak_allocated_bytes <= dpo.peak_allocated_bytes


def test_kto_runs_its_reference_after_the_policy_forward() -> None:
    p = plan_run(shape("Llama-2-7B"), QLoraSpec(framework="trl"), 4, 1024, run=RunPhases(trainer="kto"))
    assert p.phases["train"].rows == 4 and "reference forward" in p.phases["train"].moments


def test_grpos_kv_cache_formula_is_a_real_dynamic_caches_bytes() -> None:
    torch = pytest.importorskip("torch")
    model = _tiny_llama(vocab=256, intermediate=128).eval()
    shp = shape_from_config(model.config.to_dict())
    rows, prompt, completion = 6, 10, 7
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        m = model.to(dtype)
        x = torch.randint(0, 256, (rows, prompt))
        out = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=completion,
                         min_new_tokens=completion, do_sample=True, return_dict_in_generate=True, pad_token_id=0,
                         use_cache=True)
        real = sum(layer.keys.nbytes + layer.values.nbytes for layer in out.past_key_values.layers)
        # the last sampled token is never fed back: P + C - 1 positions
        assert kv_cache_bytes(shp, rows, prompt + completion - 1, size) == real
    # the plan's generation phase holds that cache for every row generated at once (bf16 under TRL's autocast)
    run = RunPhases(trainer="grpo", grad_accum=4, num_generations=4, max_prompt_len=prompt,
                    max_completion_len=completion)
    gen = plan_run(shp, QLoraSpec(framework="trl"), 2, prompt, run=run).phases["generation"]
    last = gen.breakdowns["decode (last token)"]
    assert gen.rows == 8 and last.kv_cache == kv_cache_bytes(shp, 8, prompt + completion - 1, 2)
    assert gen.breakdowns["prefill"].kv_cache == kv_cache_bytes(shp, 8, prompt, 2)


def test_grpo_generates_for_every_accumulation_step_at_once() -> None:
    s, spec = shape("Llama-3-8B"), QLoraSpec(framework="trl")

    def phases(**kw: Any) -> Any:
        return plan_run(s, spec, 4, 256, run=RunPhases(trainer="grpo", max_completion_len=1024, **kw)).phases

    small, big = phases(grad_accum=2), phases(grad_accum=16)
    assert big["generation"].breakdown.kv_cache == 8 * small["generation"].breakdown.kv_cache
    assert big["train"].peak_allocated_bytes == small["train"].peak_allocated_bytes  # b x (P + C) either way
    assert big["train"].seq == 256 + 1024
    assert "scoring" not in big["generation"].moments  # beta 0.0: no reference forward
    assert "scoring" in phases(grad_accum=2, beta=0.04)["generation"].moments
    assert plan_run(s, spec, 4, 256, run=RunPhases(trainer="grpo", grad_accum=16)).peak_phase == "generation"
    with pytest.raises(PlanInputError, match="not a multiple of num_generations 8"):
        plan_run(s, spec, 3, 256, run=RunPhases(trainer="grpo"))


def test_the_events_between_steps_add_nothing_and_say_why() -> None:
    p = plan_run(shape("Llama-2-7B"), QLoraSpec(), 1, 512)
    events = {e.name: e for e in p.events}
    assert set(events) == {"first_step", "checkpoint_save", "epoch_end"}
    assert all(e.adds_bytes == 0 for e in events.values())
    assert "first optimizer.step()" in events["first_step"].why and "host" in events["checkpoint_save"].why


@pytest.mark.parametrize("bad", [RunPhases(trainer="ppo"), RunPhases(eval_batch=0), RunPhases(eval_logits="all"),
                                 RunPhases(grad_accum=True)])
def test_bad_run_settings_are_one_line(bad: RunPhases) -> None:
    with pytest.raises(PlanInputError) as err:
        plan("Llama-2-7B", 1, 512, run=bad)
    assert "\n" not in str(err.value)


# --- the command line ----------------------------------------------------------------------------------------

def test_plan_json_has_the_phases_and_the_phase_that_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3-8B", "--batch-size", "2", "--seq-len", "512", "--trainer", "grpo",
                 "--grad-accum", "8", "--max-completion-len", "1024", "--eval-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["phases"]) == {"load", "train", "generation", "eval"} and out["trainer"] == "grpo"
    assert out["peak_phase"] == "generation"
    assert out["peak_allocated_bytes"] == out["phases"]["generation"]["peak_allocated_bytes"]
    assert out["phases"]["generation"]["breakdown"]["kv_cache"] > 0 and out["events"]["checkpoint_save"]


def test_plan_prints_the_phases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-3-8B", "--batch-size", "2", "--seq-len", "1024", "--eval-batch", "8",
                 "--eval-logits", "kept", "--eval-examples", "100"]) == 0
    text = capsys.readouterr().out
    assert "the whole run (sft)" in text and "<- peak" in text and "eval predictions gathered" in text
    assert "breakdown at the peak (eval: eval concat" in text


@pytest.mark.parametrize("argv, says", [
    (["--eval-logits", "kept"], "--eval-batch"),
    (["--max-completion-len", "256"], "--trainer grpo"),
    (["--precompute-ref"], "--trainer dpo"),
    (["--trainer", "grpo", "--num-generations", "3"], "num_generations"),
])
def test_phase_flags_out_of_place_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "512", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_trls_evaluation_keeps_no_logits_unless_compute_metrics_asks() -> None:
    # TRL 1.16's SFTTrainer computes the eval loss through its fused head (no logits); compute_metrics makes it
    # run a second no-grad forward whose full logits the Trainer then gathers. (On the CPU the fused head's
    # fallback fold holds fp32 copies of its tile that CUDA's Triton kernel does not, so the check is on growth.)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models

    words = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(4096)}, unk_token="w3"))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="w0", eos_token="w2",
                                               unk_token="w3")
    b, s = 2, 64

    def measured(logits: str, examples: int) -> int:
        model = _tiny_llama()
        rows = [{"input_ids": torch.randint(4, 4096, (s - 1,)).tolist()} for _ in range(examples)]
        data = datasets.Dataset.from_list(rows)
        extra = {"compute_metrics": lambda p: {"rows": float(len(p.predictions))}} if logits == "kept" else {}
        with tempfile.TemporaryDirectory() as d:
            args = trl.SFTConfig(output_dir=d, per_device_eval_batch_size=b, report_to=[], use_cpu=True,
                                 disable_tqdm=True, bf16=True, max_length=s, gradient_checkpointing=False)
            trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, eval_dataset=data,
                                     processing_class=tok, **extra)
            return _counted(trainer.model, trainer.evaluate)

    def planned(logits: str, examples: int) -> int:
        shp = shape_from_config(_tiny_llama().config.to_dict())
        spec = QLoraSpec(bits=16, compute_dtype="fp32", lora_dropout=0.0, framework="trl")
        run = RunPhases(eval_batch=b, eval_logits=logits, eval_examples=examples)
        return plan_run(shp, spec, 1, s, run=run).phases["eval"].peak_allocated_bytes

    assert measured("none", 8) == pytest.approx(measured("none", 2), rel=0.01)
    assert planned("none", 8) == planned("none", 2)
    grew = measured("kept", 8) - measured("kept", 2)
    assert grew > 3 * 4 * b * s * 4096  # at least three batches of fp32 logits more
    assert planned("kept", 8) - planned("kept", 2) == pytest.approx(grew, rel=0.05)


@pytest.mark.parametrize("flag", [["--trace"], ["--gpus", "2"]])
def test_trace_and_gpus_refuse_the_phase_flags(flag: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "256", "--trainer", "dpo",
                 *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert "training step alone" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("vocab, intermediate, rows, prompt, completion", [
    (256, 1024, 8, 32, 16),  # the prefill's layer peaks
    (32000, 128, 8, 4, 64),  # the last token's logits beside the full cache peak
])
def test_the_generation_phase_matches_a_real_generate(vocab: int, intermediate: int, rows: int, prompt: int,
                                                      completion: int) -> None:
    # GRPO's sampling as TRL configures it (top_k=0, top_p=1.0, temperature 1.0), without stopping early
    from vramscope.planner.memory import Hardware

    torch = pytest.importorskip("torch")
    model = _tiny_llama(vocab=vocab, intermediate=intermediate).eval()
    model.generation_config.eos_token_id = None
    x = torch.randint(0, vocab, (rows, prompt))
    real = _counted(model, lambda: model.generate(
        input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=completion, do_sample=True, top_k=0,
        top_p=1.0, temperature=1.0, pad_token_id=0, use_cache=True))
    shp = shape_from_config(model.config.to_dict())
    spec = dataclasses.replace(CPU_SPEC, framework="loop-loss")
    run = RunPhases(trainer="grpo", num_generations=1, max_prompt_len=prompt, max_completion_len=completion)
    phase = generation_phase(shp, spec, rows, prompt, estimate(shp, spec, rows, prompt + completion), Hardware(),
                             run, framework=CPU_HF)
    bd = phase.breakdown
    assert bd.kv_cache + bd.temporaries + bd.activations == pytest.approx(real, rel=0.05)


# --- the whole run's corrections from the H200 (bench/results/whole-run) ------------------------------------

def test_gradient_accumulation_keeps_the_gradients_through_the_next_forward() -> None:
    # The Trainer zeroes the gradients only after the optimizer step: micro-batch 2..N run beside them.
    s, spec = shape("Llama-2-7B"), QLoraSpec()
    once = plan_run(s, spec, 1, 528, run=RunPhases(grad_accum=1)).phases["train"]
    many = plan_run(s, spec, 1, 528, run=RunPhases(grad_accum=16)).phases["train"]
    grads = once.breakdowns["optimizer step"].lora_gradients
    assert grads > 0
    assert once.breakdowns["forward"].lora_gradients == 0
    assert many.breakdowns["forward"].lora_gradients == grads
    assert many.moments["forward"] == once.moments["forward"] + grads
    assert many.peak_allocated_bytes >= once.peak_allocated_bytes


def test_an_evaluation_holds_at_least_the_pool_training_reserved() -> None:
    # TRL's evaluation allocates less than its step; the step's pool stays reserved (no empty_cache).
    p = plan_run(shape("Llama-3-8B"), QLoraSpec(framework="trl"), 2, 1024, run=RunPhases(eval_batch=4))
    train, ev = p.phases["train"], p.phases["eval"]
    assert ev.peak_allocated_bytes < train.peak_allocated_bytes
    # and its wider tensors (the fused head's tile at 4 x 1024) open segments beside it: tests/test_planner_eval_pool.py
    assert ev.peak_reserved_bytes >= train.peak_reserved_bytes
    assert ev.process_bytes >= train.process_bytes
    assert any("pool" in n for n in ev.notes)


def test_an_hf_evaluation_longer_than_the_step_opens_segments_for_its_fp32_loss_tensors() -> None:
    # 4 x 1024 eval rows beside a 2 x 1024 step: the loss's fp32 upcast and log-softmax ([4096, V] each) are
    # larger than any logits block the step freed (the H200: +4.2 GB on Llama-3.1-8B, two such tensors).
    s = shape("Llama-3-8B")
    p = plan_run(s, QLoraSpec(), 2, 1024, run=RunPhases(eval_batch=4))
    train, ev = p.phases["train"], p.phases["eval"]
    assert ev.peak_reserved_bytes == train.peak_reserved_bytes + 2 * 4 * 4096 * s.vocab
    # eval rows no longer than the step's: the pool serves them, nothing beside it
    same = plan_run(s, QLoraSpec(), 4, 1024, run=RunPhases(eval_batch=4)).phases
    assert same["eval"].peak_reserved_bytes == same["train"].peak_reserved_bytes


def test_a_no_grad_head_frees_its_half_weight_copy_before_the_loss() -> None:
    # HF recipe: lm_head fp32 under bf16 autocast. Without grad the half copy lives only through the matmul, so
    # the head's peak is the logits plus the larger of that copy and the loss' fp32 pair, not their sum.
    from vramscope.planner.nograd import full_logits_nograd

    s = shape("Llama-3-8B")
    fw = FRAMEWORK_TABLE["hf"]
    pr = precision(QLoraSpec(), fw)
    T = 4096
    TV = T * s.vocab
    assert pr.params == 4 and fw.autocast
    assert full_logits_nograd(s, fw, pr, T, with_loss=True) == 2 * TV + max(2 * s.vocab * s.hidden, 8 * TV)
    # a tiny eval batch: the copy is the larger
    assert full_logits_nograd(s, fw, pr, 8, with_loss=True) == 2 * 8 * s.vocab + 2 * s.vocab * s.hidden


# --- loading ------------------------------------------------------------------------------------------------

def test_loading_is_a_phase_and_sets_the_peak_when_the_loader_holds_more_than_a_step() -> None:
    # Mixtral-8x7B under TRL at 1 x 256: the 16-bit experts (84 GiB) plus the loader's worst target (a fused expert
    # stack stacked beside its per-expert sources) hold more than the short step does
    spec = QLoraSpec(framework="trl", lora_dropout=0.0, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    p = plan("Mixtral-8x7B", 1, 256, spec)
    assert p.run is not None and p.run_peak_phase == "load" and p.run.phases["load"].moment == "from_pretrained"
    load, train = p.run.phases["load"], p.run.phases["train"]
    assert p.max_allocated_bytes == load.peak_allocated_bytes > train.peak_allocated_bytes
    # a longer step holds more than loading again
    assert plan("Mixtral-8x7B", 8, 4096, spec).run_peak_phase == "train"


def test_qlora_py_peaks_at_its_cast_back_to_bf16_while_loading() -> None:
    # qlora.py (guanaco 7B flags): after get_peft_model its cast loop makes embed_tokens' bf16 copy beside every fp32
    # tensor; the H200 run's start row was 5.31 GiB against a 5.18 GiB step (bench/results/whole-run/points.json)
    spec = QLoraSpec(framework="qlora", lora_r=64, lora_alpha=16, lora_dropout=0.1, gradient_checkpointing=True)
    p = plan("Llama-2-7B", 1, 528, spec)
    assert p.run is not None
    load = p.run.phases["load"]
    assert load.moment == "cast back to bf16" and load.peak_allocated_bytes > p.run.phases["train"].peak_allocated_bytes
    assert p.max_allocated_bytes == load.peak_allocated_bytes


def test_step_advice_for_a_dpo_run_is_written_in_dpo_config() -> None:
    # the step's advice took its config class from the framework's style (TRL's: SFTConfig), whatever the trainer
    p = plan("Llama-3.1-8B", 4, 2048, QLoraSpec(optim="adamw_torch"), run=RunPhases(trainer="dpo"))
    hows = [r.how for r in p.recommendations if "optim" in r.change]
    assert hows and all(h.startswith("DPOConfig(") for h in hows)
    assert not any("SFTConfig" in r.how for r in p.recommendations)
