"""`vramscope tune -- CMD` on a real GPU: trials are real runs of the user's command (an HfArgumentParser QLoRA
script, and TRL's sft when it is installed), under a per-process memory cap so that the answer is small.

Each test checks the budget (at most 3 trials), that no OOM escaped a trial child, that the printed setting is
the command's own flag, and then verifies the answer with one more real run of the command at that size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from vramscope.cli import main  # noqa: E402
from vramscope.tune.command import run_trial_child  # noqa: E402
from vramscope.tune.command_trial import TrialRequest  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
LIMIT = 6 * 2**30


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ~0.3B Llama (GQA, 32k vocabulary) with a word-level tokenizer, and a JSON-lines dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("gpu") / "model"
    words = [f"w{i}" for i in range(31990)]
    vocab = {"<pad>": 0, "<unk>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                            eos_token="</s>").save_pretrained(out)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=len(vocab), max_position_embeddings=8192,
                         pad_token_id=0, eos_token_id=2)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    data = out.parent / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w", encoding="utf-8") as f:
        for i in range(64):
            f.write(json.dumps({"text": " ".join(words[(i * 131 + j) % 31990] for j in range(200))}) + "\n")
    return out


def tune(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    code = main(["tune", "--gpu-memory", f"{LIMIT // 2**20}MiB", "--json", *argv])  # a bare number is refused
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["schema_version"] == 1
    return out  # type: ignore[no-any-return]


def verify(argv: list[str], tmp_path: Path, batch: int, seq: int) -> TrialRequest:
    request = TrialRequest(batch_size=batch, seq_len=seq, max_steps=2, record=str(tmp_path / "verify.json"),
                           memory_limit_bytes=LIMIT)
    outcome = run_trial_child(argv, request, log_path=str(tmp_path / "verify.log"), timeout_s=400)
    assert outcome.trial.ok, outcome.trial.error
    assert outcome.trial.peak_reserved_bytes is not None and outcome.trial.peak_reserved_bytes <= LIMIT
    return request


def hf_command(model_dir: Path, tmp_path: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--model_name_or_path", str(model_dir), "--output_dir",
            str(tmp_path / "out"), "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "16",
            "--max_seq_length", "1024", "--bf16", "--gradient_checkpointing", "--load_in_4bit",
            "--optim", "paged_adamw_32bit", "--report_to", "none", "--max_steps", "1000", "--rows", "32"]


def test_tune_an_hf_trainer_command_for_the_batch(model_dir: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    argv = hf_command(model_dir, tmp_path)
    out = tune(capsys, "--", *argv)
    assert len(out["trials"]) <= 3 and out["unit"] == "batch" and out["seq_len"] == 1024
    assert out["setting"] == f"--per_device_train_batch_size {out['size']}"
    assert "gradient_accumulation_steps" in (out["keep_effective"] or "")  # 1 x 16: keep the effective batch 16
    assert out["size"] >= 2
    verify(argv, tmp_path, out["size"], 1024)
    assert not (tmp_path / "out" / "finished.txt").exists()  # no trial ran the script to its end
    print(f"\nhf command: answer {out['size']} at 1024 tokens under {LIMIT >> 30} GiB; trials "
          f"{[(t['size'], t['ok'], t['peak_reserved_bytes']) for t in out['trials']]}")


def test_tune_an_hf_trainer_command_for_the_length(model_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = hf_command(model_dir, tmp_path)
    out = tune(capsys, "--find-seq-len", "--seq-len", "512", "--", *argv)
    assert len(out["trials"]) <= 3 and out["unit"] == "seq_len" and out["batch_size"] == 1
    assert out["size"] % 64 == 0 and out["size"] >= 512
    assert out["setting"] == f"--max_seq_length {out['size']}"
    verify(argv, tmp_path, 1, out["size"])
    print(f"\nhf command: longest sequence {out['size']} at batch 1 under {LIMIT >> 30} GiB")


def test_tune_a_trl_sft_command(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    argv = [sys.executable, "-m", "trl.scripts.sft", "--model_name_or_path", str(model_dir), "--dataset_name",
            str(model_dir.parent / "data"), "--use_peft", "--load_in_4bit", "--dtype", "bfloat16",
            "--lora_target_modules", "all-linear", "--output_dir", str(tmp_path / "trl-out"),
            "--per_device_train_batch_size", "1", "--max_length", "1024", "--report_to", "none", "--max_steps", "500"]
    out = tune(capsys, "--", *argv)
    assert len(out["trials"]) <= 3 and out["setting"] == f"--per_device_train_batch_size {out['size']}"
    assert out["command"]["framework"] == "trl"
    verify(argv, tmp_path, out["size"], 1024)
    assert not (tmp_path / "trl-out" / "adapter_model.safetensors").exists()
    print(f"\ntrl sft: answer {out['size']} at 1024 tokens under {LIMIT >> 30} GiB; trials "
          f"{[(t['size'], t['ok'], t['peak_reserved_bytes']) for t in out['trials']]}")
