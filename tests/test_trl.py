"""The step log's tokens under TRL's SFTTrainer, for real, on tiny random models of each architecture.

Issue 19 saw `tokens` = the batch size (4 for `--per_device_train_batch_size 4 --max_length 32`) with a
Qwen2 model under `trl.scripts.sft`. The forward pre-hook read the batch right: the batch *was* 4 x 1.
transformers 5 loads a Qwen2 checkpoint's tokenizer as `Qwen2Tokenizer` whatever tokenizer_config.json
says, and that class rebuilds a byte-level BPE from the vocabulary without its word-level model: every
word becomes nothing, each example is only the EOS token that TRL appends, and TRL's own `num_tokens`
counts 4 per step too. Here every architecture TRL and the HF Trainer drive gets a byte-level BPE
tokenizer (which every tokenizer class transformers picks reads the same way) and texts longer than
`max_length`, so that each batch is exactly 4 x 32; the word-level Qwen2 case is kept as it was found,
with the warning it now gets.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl", reason="TRL is not installed: pip install 'vramscope[trl]'")
datasets = pytest.importorskip("datasets", reason="datasets is not installed: pip install 'vramscope[trl]'")
pytest.importorskip("peft", reason="peft is not installed: pip install 'vramscope[hf]'")
tokenizers = pytest.importorskip("tokenizers")

from vramscope.analysis.alerts import read_warnings  # noqa: E402
from vramscope.integrations.hf import MemoryMonitorCallback  # noqa: E402
from vramscope.logs.reader import read_log  # noqa: E402

BATCH, LENGTH = 4, 32
VOCAB = 300
WORDS = ["memory", "batch", "token", "layer", "adapter", "gradient", "step", "peak", "the", "a", "of", "and"]

# Every decoder family TRL's SFT and the HF Trainer drive, as the smallest random model of each.
_COMMON = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 256,
           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "mistral": ("MistralConfig", {}),
    "phi3": ("Phi3Config", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 16}),
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "shared_expert_intermediate_size": 32}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def texts(count: int = 24) -> list[str]:
    """Texts of 40-60 words: each is longer than LENGTH tokens, so every batch is BATCH x LENGTH."""
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 60))) for _ in range(count)]


def byte_level_tokenizer() -> Any:
    """A byte-level BPE trained on the texts: the kind of tokenizer Llama-3, Qwen2 and Mistral ship."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>")


def word_level_tokenizer(words: list[str]) -> Any:
    """One id per word: what issue 19's runs used."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{w: 4 + i for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                                eos_token="</s>", unk_token="<unk>")


def save_tiny_model(arch: str, folder: Path, tokenizer: Any) -> Path:
    """A random-weight checkpoint with its tokenizer, as `from_pretrained` (and so TRL) reads it."""
    config_name, extra = ARCHITECTURES[arch]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**_COMMON, **extra)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_dataset(folder: Path, lines: list[str]) -> Path:
    """A local JSON-lines dataset in a folder, as `--dataset_name` and `load_dataset` take it."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "train.jsonl").open("w") as handle:
        for text in lines:
            handle.write(json.dumps({"text": text}) + "\n")
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data"), texts())


def sft(model: Path | Any, data_dir: Path, out: Path, callback: MemoryMonitorCallback,
        processing_class: Any = None, **config: Any) -> Any:
    """Three steps of TRL's SFTTrainer with LoRA, as `trl.scripts.sft --use_peft` runs it."""
    from peft import LoraConfig

    options: dict[str, Any] = {"max_steps": 3, "per_device_train_batch_size": BATCH, "max_length": LENGTH,
                               "use_cpu": True, **config}
    args = trl.SFTConfig(output_dir=str(out), logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
                         dataloader_num_workers=0, **options)
    dataset = datasets.load_dataset("json", data_files=str(data_dir / "train.jsonl"), split="train")
    trainer = trl.SFTTrainer(model=str(model) if isinstance(model, Path) else model, args=args,
                             train_dataset=dataset, callbacks=[callback], processing_class=processing_class,
                             peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                    task_type="CAUSAL_LM"))
    trainer.train()
    callback.close()
    return trainer


def train_tokens(log: Path) -> list[tuple[int | None, int | None]]:
    table = read_log(log)
    return [(s, t) for s, p, t in zip(table.ints("step"), table.strings("phase"), table.ints("tokens"), strict=True)
            if p == "train"]


def trl_tokens_per_step(trainer: Any) -> list[float]:
    """TRL's own count (the attention mask's sum, or the packed length), one per step."""
    totals = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    return [b - a for a, b in zip([0.0, *totals], totals, strict=False)]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_sft_trainer_logs_batch_times_length_for_every_architecture(arch: str, tmp_path: Path,
                                                                     data_dir: Path) -> None:
    model_dir = save_tiny_model(arch, tmp_path / arch, byte_level_tokenizer())
    log = tmp_path / "mem.csv"
    trainer = sft(model_dir, data_dir, tmp_path / "out", MemoryMonitorCallback(log=log, warn=False))
    assert train_tokens(log) == [(1, BATCH * LENGTH), (2, BATCH * LENGTH), (3, BATCH * LENGTH)]
    # Held against TRL's own count: no padding here, so the non-padding tokens are the batch.
    assert trl_tokens_per_step(trainer) == [BATCH * LENGTH] * 3
    assert not (tmp_path / "mem.warnings.jsonl").exists()  # no one-token warning for a right batch


@pytest.mark.parametrize("arch", ["qwen2", "mixtral"])
def test_packed_batches_count_the_packed_row(arch: str, tmp_path: Path, data_dir: Path) -> None:
    """Packing (padding-free, one row of several sequences with position_ids): tokens = 1 x packed length."""
    model_dir = save_tiny_model(arch, tmp_path / arch, byte_level_tokenizer())
    log = tmp_path / "mem.csv"
    trainer = sft(model_dir, data_dir, tmp_path / "out", MemoryMonitorCallback(log=log, warn=False), packing=True)
    tokens = [t for _, t in train_tokens(log)]
    assert tokens == trl_tokens_per_step(trainer) == [BATCH * LENGTH] * 3


def test_a_word_level_qwen2_tokenizer_gives_one_token_sequences_and_a_warning(tmp_path: Path) -> None:
    """Issue 19's own setup: the tokens column said 4 because the model saw 4 x 1, and now it says why."""
    words = [f"w{i}" for i in range(90)]
    rng = random.Random(0)
    data_dir = write_dataset(tmp_path / "data", [" ".join(rng.choices(words, k=50)) for _ in range(24)])
    model_dir = save_tiny_model("qwen2", tmp_path / "qwen2", word_level_tokenizer(words))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"  # not the class saved
    assert tokenizer("w1 w2 w3")["input_ids"] == []  # every word becomes nothing
    log = tmp_path / "mem.csv"
    trainer = sft(model_dir, data_dir, tmp_path / "out", MemoryMonitorCallback(log=log, warn=False))
    assert train_tokens(log) == [(1, BATCH), (2, BATCH), (3, BATCH)]
    assert trl_tokens_per_step(trainer) == [BATCH] * 3  # TRL counts the same 4 x 1
    warnings = read_warnings(tmp_path / "mem.warnings.jsonl")
    assert [(w.kind, w.step) for w in warnings] == [("short_sequences", 1)]
    assert "batch is 4 x 1 tokens" in warnings[0].message and "tokenizer" in warnings[0].message


def test_the_train_summary_carries_the_runs_peak(tmp_path: Path, data_dir: Path) -> None:
    """TRL's last log (train_runtime, ...) comes after the last step's log: its window is empty."""
    model_dir = save_tiny_model("qwen2", tmp_path / "qwen2", byte_level_tokenizer())
    trainer = sft(model_dir, data_dir, tmp_path / "out", MemoryMonitorCallback(warn=False))
    key = "mem/peak_allocated_gib" if torch.cuda.is_available() else "mem/peak_rss_gib"
    steps = [h for h in trainer.state.log_history if "loss" in h]
    summary = next(h for h in trainer.state.log_history if "train_runtime" in h)
    assert len(steps) == 3 and all(h[key] > 0 for h in steps)
    assert summary[key] == max(h[key] for h in steps)  # the run's peak, not 0 and not missing


@pytest.mark.slow
def test_vramscope_run_under_trl_scripts_sft(tmp_path: Path, data_dir: Path) -> None:
    """The zero-code path of issue 19: `vramscope run -- python -m trl.scripts.sft ... --use_peft`."""
    model_dir = save_tiny_model("qwen2", tmp_path / "qwen2", byte_level_tokenizer())
    command = [sys.executable, "-m", "trl.scripts.sft", "--model_name_or_path", str(model_dir),
               "--dataset_name", str(data_dir), "--output_dir", "out", "--use_peft", "--lora_r", "4",
               "--per_device_train_batch_size", str(BATCH), "--max_length", str(LENGTH), "--max_steps", "3",
               "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none", "--use_cpu",
               "--dataloader_num_workers", "0", "--disable_tqdm", "true"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    result = subprocess.run([sys.executable, "-m", "vramscope", "run", "--quiet", "--log", "mem.csv", "--", *command],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert train_tokens(tmp_path / "mem.steps.csv") == [(1, BATCH * LENGTH), (2, BATCH * LENGTH),
                                                         (3, BATCH * LENGTH)]


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "length"), [(4, 1024), (1, 4096)])
def test_on_the_gpu_a_qwen2_7b_shaped_model_logs_batch_times_length(batch: int, length: int,
                                                                    tmp_path: Path) -> None:
    """Issue 19's H200 runs (4 x 1024 and 1 x 4096 logged 4 and 1), with a tokenizer that tokenizes:
    the step log says b x s, and train()'s summary carries the run's allocator peak, not 0."""
    config = transformers.Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                      max_position_embeddings=32768, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    rng = random.Random(0)
    data_dir = write_dataset(tmp_path / "data",
                             [" ".join(rng.choices(WORDS, k=length + 100)) for _ in range(4 * batch)])
    log = tmp_path / "mem.csv"
    trainer = sft(model, data_dir, tmp_path / "out", MemoryMonitorCallback(log=log, warn=False),
                  processing_class=byte_level_tokenizer(), use_cpu=False, bf16=True, gradient_checkpointing=True,
                  per_device_train_batch_size=batch, max_length=length)
    tokens = train_tokens(log)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    summary = next(h for h in trainer.state.log_history if "train_runtime" in h)
    found = f"step log {tokens}, TRL {trl_tokens_per_step(trainer)}, steps {steps}, summary {summary}"
    assert tokens == [(1, batch * length), (2, batch * length), (3, batch * length)], found
    assert trl_tokens_per_step(trainer) == [batch * length] * 3, found
    peaks = [h["mem/peak_allocated_gib"] for h in steps]
    assert min(peaks) > 14 and summary["mem/peak_allocated_gib"] == max(peaks), found  # bf16 weights: 14.2 GiB
    print(found)
