"""What holds memory now: the breakdown of a real LoRA model, optimizer and HF Trainer run (CPU, seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import vramscope  # noqa: E402
from vramscope.integrations.hf import MemoryMonitorCallback  # noqa: E402
from vramscope.training.breakdown import measure, with_readings  # noqa: E402
from vramscope.types import MemoryBreakdown  # noqa: E402

VOCAB = 96


def lora_model(tied: bool = False) -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                      max_position_embeddings=64, tie_word_embeddings=tied)
    base = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(base, lora)


def test_categories_add_up_to_the_models_and_optimizers_own_tensors() -> None:
    model = lora_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()

    b = measure(model, opt)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    assert b.device == "cpu"
    assert b.trainable_params == sum(p.numel() for p in trainable) > 0
    assert b.lora_weights == sum(p.numel() * p.element_size() for p in trainable)
    assert b.gradients == b.lora_weights  # one gradient per trainable parameter, same dtype
    assert b.weights == {"float32": sum(p.numel() * p.element_size() for p in frozen)}
    # AdamW keeps exp_avg and exp_avg_sq per parameter (the 1-element step counters are not memory)
    assert b.optimizer_states == 2 * b.lora_weights
    assert b.optimizer_states_paged == 0
    assert b.buffers == sum(x.numel() * x.element_size() for x in model.buffers())
    assert b.activations_at_peak is None and b.peak_allocated_bytes is None  # no peak on a CPU


def test_tied_embeddings_are_counted_once() -> None:
    model = lora_model(tied=True)
    b = measure(model)
    distinct = {p.untyped_storage().data_ptr(): p for p in model.parameters() if not p.requires_grad}
    assert b.weights["float32"] == sum(p.numel() * p.element_size() for p in distinct.values())
    named = model.named_parameters(remove_duplicate=False)
    assert b.weights["float32"] < sum(p.numel() * p.element_size() for _, p in named if not p.requires_grad)


def test_activations_are_the_peak_less_everything_else() -> None:
    static = MemoryBreakdown(device="cuda:0", weights={"uint8": 100}, quantization_constants=10, lora_weights=20,
                             gradients=20, optimizer_states=40)
    full = with_readings(static, peak_allocated=500, reserved=600, allocated=250, process=1100)
    assert full.activations_at_peak == 500 - 190
    assert full.allocator_cache_bytes == 600 - 500 and full.cuda_context_bytes == 1100 - 600  # cache at the peak
    assert MemoryBreakdown.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    text = str(full)
    assert "activations and temporaries at the peak" in text and "CUDA context" in text


def test_a_breakdown_file_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a vramscope memory breakdown"):
        MemoryBreakdown.from_dict({"weights": 3})
    with pytest.raises(ValueError, match="whole number of bytes"):
        MemoryBreakdown.from_dict({"device": "cpu", "weights": {}, "gradients": "lots"})


def test_a_trainer_run_leaves_its_breakdown_beside_the_step_log(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=str(log), warn=False)
    gen = torch.Generator().manual_seed(1)
    data = [{"input_ids": (ids := torch.randint(0, VOCAB, (16,), generator=gen)), "labels": ids} for _ in range(12)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                                          save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                                          dataloader_num_workers=0, remove_unused_columns=False)
    model = lora_model()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    # written once the optimizer had states (mid-run), so a run that dies later still leaves it
    saved = MemoryBreakdown.from_dict(json.loads((tmp_path / "mem.breakdown.json").read_text()))
    assert saved.optimizer_states == 2 * saved.lora_weights > 0
    assert saved.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    live = callback.monitor.breakdown()
    assert live is not None and live.lora_weights == saved.lora_weights
    callback.close()

    # the report finds it beside the log and shows it, in text, JSON and HTML
    cmd = [sys.executable, "-m", "vramscope", "report", str(log)]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "what held memory on cpu" in text and "optimizer states (on the device)" in text
    data = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert data["breakdown"]["lora_weights"] == saved.lora_weights
    subprocess.run([*cmd, "--html", str(tmp_path / "r.html")], capture_output=True, timeout=120, check=True)
    assert "What held memory on cpu" in (tmp_path / "r.html").read_text()
    # a damaged breakdown file is not the log: the report goes on without it
    (tmp_path / "mem.breakdown.json").write_text("{not json")
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "what held memory" not in text and "peak" in text


@pytest.mark.slow  # a child Python that imports torch and transformers
def test_summary_prints_a_table_in_a_fresh_interpreter() -> None:
    code = (
        "import torch, transformers, vramscope\n"
        "c = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=2, vocab_size=64)\n"
        "m = transformers.LlamaForCausalLM(c).requires_grad_(False)\n"
        "print(vramscope.summary(m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("what holds memory on cpu")
    assert "weights (float32)" in out and "unknown" in out  # no peak known on a CPU: said, not made up
    assert vramscope.summary is not None


def test_under_vramscope_run_trls_own_sft_script_leaves_a_breakdown_with_its_optimizer(tmp_path: Path) -> None:
    # The zero-code path people use: `vramscope run -- python -m trl.scripts.sft ...`. The file must keep the
    # optimizer's states even though TRL's script frees its trainer before the interpreter exits.
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[UNK]": 0, "[PAD]": 1, "</s>": 2, **{f"w{i}": 3 + i for i in range(VOCAB - 3)}}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = tmp_path / "model"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                         eos_token="</s>").save_pretrained(model_dir)
    lora_model().get_base_model().save_pretrained(model_dir)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(
        json.dumps({"text": " ".join(f"w{(i * 7 + j) % (VOCAB - 3)}" for j in range(40))}) + "\n" for i in range(16)))
    log = tmp_path / "mem.csv"
    cmd = [sys.executable, "-m", "vramscope", "run", "--quiet", "--log", str(log), "--", sys.executable, "-m",
           "trl.scripts.sft", "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--use_peft",
           "--per_device_train_batch_size", "2", "--max_length", "16", "--max_steps", "3", "--save_strategy", "no",
           "--report_to", "none", "--output_dir", str(tmp_path / "out"), "--bf16", "False", "--use_cpu"]
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    subprocess.run(cmd, capture_output=True, timeout=300, check=True, env=env, cwd=tmp_path)
    saved = MemoryBreakdown.from_dict(json.loads((tmp_path / "mem.steps.breakdown.json").read_text()))
    # TRL's defaults: LoRA r16 on q_proj and v_proj; AdamW keeps two states per trainable parameter
    assert saved.trainable_params == 2 * (16 * 32 + 32 * 16) + 2 * (16 * 32 + 16 * 16)
    assert saved.optimizer_states == 2 * saved.lora_weights > 0
