"""Issue 28 walked as a user: ``vramscope plan -- <command>`` on the commands people paste (TRL's reward, DPO and
GRPO scripts, accelerate over two GPUs, an axolotl YAML with sample packing), each with its own local data and a
word-level tokenizer. What broke: a reward run on preference pairs planned as DPO, DPO/KTO/reward runs still said
"NOT MODELLED ... planned as SFT" beside the phases that plan them, a GRPO run's prompt-length guess and its second
reading kept after its prompts were read, a DPO command over two GPUs refused for a ``--trainer`` flag nobody gave,
and packing / padding_free / group_by_length in the command not reaching the dataset's batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dataset_tokenizer import make_tokenizer, words
from vramscope.cli import main
from vramscope.planner import registry
from vramscope.planner.gpus import get_gpu

LONG = 300  # words of the one long example in each file


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder (Llama-2-7B's config.json and the word-level tokenizer) and the datasets, side by side."""
    root = tmp_path_factory.mktemp("walk28")
    model = root / "model"
    make_tokenizer(model)
    (model / "config.json").write_text(json.dumps(registry.get_config("Llama-2-7B")))

    def lines(name: str, rows: list[dict[str, Any]]) -> None:
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    lines("pairs.jsonl", [{"prompt": words(10), "chosen": " " + words(20),
                           "rejected": " " + words(LONG if i == 3 else 30)} for i in range(40)])
    lines("prompts.jsonl", [{"prompt": words(LONG if i == 5 else 12)} for i in range(40)])
    lines("text.jsonl", [{"text": words(LONG if i == 7 else 20 + i)} for i in range(40)])
    return root


def plan(capsys: pytest.CaptureFixture[str], folder: Path, *command: str, before: tuple[str, ...] = ()
         ) -> dict[str, Any]:
    code = main(["plan", "--json", *before, "--", *command])
    out = capsys.readouterr()
    assert code == 0, out.err
    result: dict[str, Any] = json.loads(out.out)
    return result


def trl(kind: str, folder: Path, data: str, *extra: str) -> tuple[str, ...]:
    return ("trl", kind, "--model_name_or_path", str(folder / "model"), "--dataset_name", str(folder / data),
            "--load_in_4bit", "--use_peft", "--per_device_train_batch_size", "2", "--output_dir", "out", *extra)


def test_a_reward_run_on_preference_pairs_stays_a_reward_run(capsys: pytest.CaptureFixture[str],
                                                             folder: Path) -> None:
    out = plan(capsys, folder, *trl("reward", folder, "pairs.jsonl", "--max_length", "1024"))
    # The pairs' longest batch: 2 pairs stacked as 4 rows of prompt 10 + 300 words + BOS + EOS.
    assert (out["dataset"]["peak_batch_rows"], out["dataset"]["peak_batch_seq"]) == (4, 312)
    assert out["trainer"] == "reward" and out["run"]["trainer"] == "reward"  # was "dpo", with a reference forward
    assert (out["batch_size"], out["phases"]["train"]["rows"]) == (2, 4)
    assert "reference forward" not in out["phases"]["train"]["moments"]
    assert out["dataset"]["how"].startswith("TRL reward; prompt + chosen and prompt + rejected")  # was "TRL DPO"
    assert not any("reward" in u.lower() for u in out["unsupported"])


@pytest.mark.parametrize("kind", ["dpo", "kto", "reward"])
def test_the_trainers_the_phases_plan_are_not_called_not_modelled(capsys: pytest.CaptureFixture[str],
                                                                  folder: Path, kind: str) -> None:
    out = plan(capsys, folder, *trl(kind, folder, "text.jsonl", "--max_length", "512"))
    assert out["trainer"] == kind
    assert not any("planned as SFT" in u for u in out["unsupported"]), out["unsupported"]
    code = main(["plan", "--", *trl(kind, folder, "text.jsonl", "--max_length", "512")])
    assert code == 0 and "NOT MODELLED" not in capsys.readouterr().out


def test_grpo_prompts_read_from_the_data_replace_the_prompt_guess(capsys: pytest.CaptureFixture[str],
                                                                  folder: Path) -> None:
    argv = trl("grpo", folder, "prompts.jsonl", "--num_generations", "4", "--max_completion_length", "64",
               "--gradient_accumulation_steps", "2")
    out = plan(capsys, folder, *argv)
    longest = LONG + 1  # the prompt and its BOS
    assert out["run"]["max_prompt_len"] == longest
    # The plan's row is the longest prompt and its completion, as the policy step's is.
    assert out["seq_len"] == longest + 64 == out["phases"]["train"]["seq"]
    assert not any("GRPO prompt length" in a for a in out["assumed"])
    assert out["alternatives"] == []  # "if prompts run to 2048 tokens" planned the same numbers as the data
    code = main(["plan", "--", *argv])
    text = capsys.readouterr().out
    assert code == 0 and "ASSUMED" not in text and "if prompts run to" not in text
    assert f"batch 2 x {longest + 64} tokens" in text


def test_a_dpo_command_over_two_gpus_is_planned_and_says_what_it_leaves_out(capsys: pytest.CaptureFixture[str],
                                                                            folder: Path) -> None:
    argv = ("accelerate", "launch", "--num_processes", "2", "-m", "trl.scripts.dpo",
            *trl("dpo", folder, "pairs.jsonl", "--max_length", "1024", "--eval_strategy", "steps")[2:])
    code = main(["plan", "--", *argv])
    out = capsys.readouterr()
    # was: "--gpus plans the SFT training step alone: drop --trainer ..." (exit 2), for a flag nobody gave
    assert code == 0, out.err
    first = out.out.splitlines()[0]
    assert first.startswith("NOT MODELLED: the DPO trainer and evaluation at 8 rows: over several GPUs")
    assert "DDP over 2 GPUs" in out.out


def test_padding_free_and_packing_in_the_command_reach_the_dataset(capsys: pytest.CaptureFixture[str],
                                                                   folder: Path) -> None:
    padded = plan(capsys, folder, *trl("sft", folder, "text.jsonl", "--max_length", "1024"))
    free = plan(capsys, folder, *trl("sft", folder, "text.jsonl", "--max_length", "1024", "--padding_free"))
    assert padded["dataset"]["batching"] == "padded" and (padded["batch_size"], padded["seq_len"]) == (2, 302)
    assert free["dataset"]["batching"] == "padding_free" and free["batch_size"] == 1
    assert free["seq_len"] == free["dataset"]["peak_batch_tokens"] < 2 * 302  # one row of the real tokens
    (folder / "axo.yml").write_text(
        f"base_model: {folder / 'model'}\nload_in_4bit: true\nadapter: qlora\nlora_r: 8\nlora_target_linear: true\n"
        f"sequence_len: 512\nsample_packing: true\nmicro_batch_size: 2\ndatasets:\n"
        f"  - path: {folder / 'text.jsonl'}\n    type: completion\nval_set_size: 0.1\neval_batch_size: 2\n")
    packed = plan(capsys, folder, "axolotl", "train", str(folder / "axo.yml"))
    assert packed["dataset"]["batching"] == "packed"  # was "padded" at 2 x 302, the rows unpacked
    assert packed["dataset"]["peak_batch_tokens"] == 2 * 512
    # The eval rows are packed rows of sequence_len, not the training batch's one long row of two of them.
    assert (packed["phases"]["eval"]["rows"], packed["phases"]["eval"]["seq"]) == (2, 512)


def test_qlora_py_groups_by_length_by_default_and_says_so(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    from vramscope.commands import parse_command

    parsed = parse_command(["python", "qlora.py", "--model_name_or_path", "huggyllama/llama-7b"], cwd=folder)
    assert parsed.memory.group_by_length and parsed.defaults["group_by_length"] == "true"
    off = parse_command(["python", "qlora.py", "--model_name_or_path", "huggyllama/llama-7b",
                         "--group_by_length", "False"], cwd=folder)
    assert not off.memory.group_by_length
    hf = parse_command(["python", "train.py", "--model_name_or_path", "x", "--per_device_train_batch_size", "2",
                        "--group_by_length"], cwd=folder)
    assert hf.memory.group_by_length and "--group_by_length" in hf.read


@pytest.mark.parametrize(("written", "name"), [("A100-40G", "A100-40GB"), ("A100 80G", "A100-80GB"),
                                               ("H100 80GB", "H100-80GB"), ("RTX 4090", "RTX-4090"),
                                               ("A10G", "A10G")])
def test_gpu_names_as_people_write_them(written: str, name: str) -> None:
    assert get_gpu(written).name == name


def test_a_hub_dataset_the_command_names_is_read_from_the_cache_or_said_unread(
        capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    argv = ["trl", "sft", "--model_name_or_path", str(folder / "model"), "--dataset_name", "org/chat",
            "--per_device_train_batch_size", "2", "--max_length", "1024", "--use_peft", "--load_in_4bit"]
    # Not in the cache: one line says the data was not read and what the plan is made at (was: nothing at all).
    code = main(["plan", "--", *argv])
    out = capsys.readouterr().out
    assert code == 0
    line = next(x for x in out.splitlines() if x.startswith("dataset: "))
    assert "org/chat" in line and "never downloads" in line
    assert line.endswith("planned at batch x max_length (2 x 1024) instead")
    # Once in the hub cache (a snapshot_download), the command's hub id is read from it.
    snap = tmp_path / "hub" / "datasets--org--chat" / "snapshots" / "abc123"
    (snap / "data").mkdir(parents=True)
    (snap / "data" / "train.jsonl").write_text((folder / "text.jsonl").read_text())
    (tmp_path / "hub" / "datasets--org--chat" / "refs").mkdir()
    (tmp_path / "hub" / "datasets--org--chat" / "refs" / "main").write_text("abc123")
    read = plan(capsys, folder, *argv)
    assert read["dataset"]["examples"] == 40 and (read["batch_size"], read["seq_len"]) == (2, LONG + 2)


def test_the_example_script_without_its_4bit_switch_is_planned_16_bit(tmp_path: Path) -> None:
    """examples/hf_trainer_lora.py builds its BitsAndBytesConfig(load_in_4bit=True) only under
    ``if model_args.load_in_4bit and cuda:``; its switch defaults to False, so without --load_in_4bit the run is
    16-bit (it was planned NF4, "bits 4 (the script's BitsAndBytesConfig)")."""
    from vramscope.commands import parse_command

    script = str(Path(__file__).parents[1] / "examples" / "hf_trainer_lora.py")
    base = ["python", script, "--model_name_or_path", "m", "--output_dir", "o", "--per_device_train_batch_size", "2",
            "--max_seq_length", "512", "--bf16"]
    assert parse_command(base, cwd=tmp_path).spec.bits == 16
    assert parse_command([*base, "--load_in_4bit"], cwd=tmp_path).spec.bits == 4
    # A script whose literal is not behind its switch still loads in 4-bit, whatever the switch's default.
    (tmp_path / "train.py").write_text(
        "from dataclasses import dataclass, field\nfrom transformers import HfArgumentParser, BitsAndBytesConfig, "
        "AutoModelForCausalLM, TrainingArguments\n@dataclass\nclass A:\n    load_in_4bit: bool = False\n"
        "parser = HfArgumentParser((A, TrainingArguments))\nbnb = BitsAndBytesConfig(load_in_4bit=True)\n"
        "AutoModelForCausalLM.from_pretrained('m', quantization_config=bnb)\n")
    assert parse_command(["python", "train.py", "--model_name_or_path", "m", "--per_device_train_batch_size", "2"],
                         cwd=tmp_path).spec.bits == 4


def test_trace_of_a_pasted_command_shows_its_reading_and_its_data(capsys: pytest.CaptureFixture[str],
                                                                  folder: Path) -> None:
    """``plan --trace -- trl dpo ... --eval_strategy steps``: the trace is of one SFT step; it printed neither what
    it read from the command nor that the DPO and eval phases were left out, and its --json had no command and no
    dataset. (With the eval's length set from the data it also refused the run for an --eval-seq-len nobody gave.)"""
    pytest.importorskip("peft")
    tiny = folder / "tiny"
    make_tokenizer(tiny)
    (tiny / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}))
    argv = ["trl", "dpo", "--model_name_or_path", str(tiny), "--dataset_name", str(folder / "pairs.jsonl"),
            "--per_device_train_batch_size", "2", "--max_length", "512", "--eval_strategy", "steps", "--use_peft",
            "--load_in_4bit"]
    code = main(["plan", "--trace", "--json", "--", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    doc = json.loads(out.out)
    # The traced step is the data's longest batch: 2 pairs as one SFT batch of 2 rows, at the longest row.
    assert (doc["engine"], doc["batch_size"], doc["seq_len"]) == ("trace", 2, 10 + LONG + 2)
    assert doc["command"]["program"] == "trl" and doc["dataset"]["peak_batch_rows"] == 4
    assert any(u.startswith("the DPO trainer and evaluation at 8 rows: --trace traces one SFT training step")
               for u in doc["unsupported"])


def test_a_trainer_read_from_the_columns_is_named_when_its_plan_cannot_be_made(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """``plan --dataset prompts.jsonl --batch-size 3``: prompts alone make it GRPO, whose 8 generations do not
    divide a batch of 3; the one line now says the trainer came from the columns, and how to read them as text."""
    base = ["plan", "--model", "Llama-2-7B", "--batch-size", "3", "--seq-len", "512", "--tokenizer",
            str(folder / "model"), "--dataset", str(folder / "prompts.jsonl")]
    code = main(base)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "not a multiple of num_generations 8" in err and "was planned as GRPO because of its columns" in err
    code = main([*base, "--dataset-field", "prompt", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["trainer"] == "sft" and out["seq_len"] == LONG + 1


def test_dpo_eval_advice_counts_pairs(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """per_device_eval_batch_size counts DPO pairs (each two rows): halving 4 pairs is 2 pairs, not "2 rows"."""
    code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "1024", "--trainer", "dpo",
                 "--eval-batch", "4", "--eval-logits", "kept", "--gpu", "RTX-4090"])
    out = capsys.readouterr().out
    assert code == 0 and "eval                8 x 1024" in out
    assert "evaluate 2 pairs at a time" in out and "rows at a time" not in out


def test_the_terminal_says_which_phase_sets_max_memory_allocated(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-8B under TRL, 4 x 2048, eval batch 8: the eval phase needs the most GPU memory (the training pool
    stays reserved beside it) and so gives the totals, but the train phase allocates more. The totals line read
    "peak allocated (torch.cuda.max_memory_allocated) 7.87 GiB" beside a train phase of 10.21 GiB, with no word of
    which one max_memory_allocated() reads after the run."""
    argv = ["plan", "--model", "Llama-3.1-8B", "--batch-size", "4", "--seq-len", "2048", "--framework", "trl",
            "--eval-batch", "8"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    train = doc["phases"]["train"]["peak_allocated_bytes"]
    assert doc["peak_phase"] == "eval" and doc["peak_allocated_bytes"] < train
    assert doc["max_allocated_bytes"] == train  # what max_memory_allocated() reads after the run, in the JSON too
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"(the run's largest allocated is the train phase's, {train / 2**30:.2f} GiB: " \
           "torch.cuda.max_memory_allocated() reads that after the run; the totals are the eval phase's" in text
    # A run whose peak phase also allocates the most says nothing more.
    assert main(["plan", "--model", "Llama-3.1-8B", "--batch-size", "4", "--seq-len", "2048", "--eval-batch", "1"]) == 0
    assert "the run's largest allocated" not in capsys.readouterr().out


def test_trace_of_a_two_process_command_says_it_is_the_command_that_runs_two(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """It said "drop --calibrate, --target-batch and --gpus", none of which the user gave."""
    code = main(["plan", "--trace", "--", "accelerate", "launch", "--num_processes", "2", "-m", "trl.scripts.sft",
                 "--model_name_or_path", str(folder / "model"), "--use_peft", "--max_length", "128"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "the command runs 2 processes and --trace traces one GPU's step alone" in err and "drop" not in err


def test_the_commands_train_split_is_the_one_read(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """``--dataset_train_split validation`` was ignored: the plan read the train split."""
    splits = folder / "splits"
    splits.mkdir(exist_ok=True)
    (splits / "train.jsonl").write_text("".join(json.dumps({"text": words(10)}) + "\n" for _ in range(6)))
    (splits / "validation.jsonl").write_text("".join(json.dumps({"text": words(50)}) + "\n" for _ in range(3)))
    argv = ["trl", "sft", "--model_name_or_path", str(folder / "model"), "--dataset_name", str(splits),
            "--use_peft", "--per_device_train_batch_size", "2"]
    train = plan(capsys, folder, *argv)
    validation = plan(capsys, folder, *argv, "--dataset_train_split", "validation")
    assert (train["dataset"]["examples"], train["seq_len"]) == (6, 12)
    assert (validation["dataset"]["examples"], validation["seq_len"]) == (3, 52)


def test_the_eval_flags_that_shape_the_eval_phase_are_listed_as_read(folder: Path) -> None:
    """They planned the eval phase but "read:" never named them, as if they changed nothing."""
    from vramscope.commands import parse_command

    base = ["trl", "sft", "--model_name_or_path", "m", "--use_peft", "--per_device_eval_batch_size", "4"]
    evaluating = parse_command([*base, "--eval_strategy", "steps", "--eval_accumulation_steps", "2"], cwd=folder)
    assert {"--eval_strategy", "--per_device_eval_batch_size", "--eval_accumulation_steps"} <= evaluating.read.keys()
    assert evaluating.read["--per_device_eval_batch_size"] == "4"
    quiet = parse_command(base, cwd=folder)  # no evaluation: the eval batch shapes nothing
    assert "--per_device_eval_batch_size" not in quiet.read and not any("eval" in u for u in quiet.unknown)


def test_grpo_under_vllm_does_not_say_the_generation_it_plans_is_not_planned(
        capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """NOT MODELLED said "its generation pass is not modelled, only the policy step" above a planned generation
    phase; the generation phase is TRL's own generate(), which vLLM replaces, and the line now says that."""
    out = plan(capsys, folder, *trl("grpo", folder, "prompts.jsonl", "--num_generations", "2", "--use_vllm"))
    assert "generation" in out["phases"]
    line = next(u for u in out["unsupported"] if u.startswith("GRPO: 2 completions per prompt are generated by vLLM"))
    assert "only the policy step" not in line and "the generation phase shown is TRL's own generate()" in line


def test_axolotl_pad_to_sequence_len_plans_full_rows(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    """``pad_to_sequence_len: true`` pads every batch to sequence_len: the data's longest example (302 tokens) is
    no measure of the batch, which was planned at 2 x 302 (low)."""
    config = (f"base_model: {folder / 'model'}\nload_in_4bit: true\nadapter: qlora\nlora_r: 8\nsequence_len: 1024\n"
              f"micro_batch_size: 2\ndatasets:\n  - path: {folder / 'text.jsonl'}\n    type: completion\n")
    (folder / "pad.yml").write_text(config + "pad_to_sequence_len: true\n")
    (folder / "nopad.yml").write_text(config)
    padded = plan(capsys, folder, "axolotl", "train", str(folder / "pad.yml"))
    unpadded = plan(capsys, folder, "axolotl", "train", str(folder / "nopad.yml"))
    assert (padded["batch_size"], padded["seq_len"]) == (2, 1024)
    assert (unpadded["batch_size"], unpadded["seq_len"]) == (2, LONG + 1)
    # TRL's pad_to_multiple_of rounds the longest batch up the same way.
    rounded = plan(capsys, folder, *trl("sft", folder, "text.jsonl", "--pad_to_multiple_of", "64"))
    assert rounded["seq_len"] == 320  # 302 up to a multiple of 64
