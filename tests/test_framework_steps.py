"""tune.qlora steps a real tiny model the way each framework does (what tune and plan --calibrate
measure): TRL's fused LM head and bf16-free CPU path, a loop's kept output, HF Trainer's dropped output."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("trl")

from vramscope.recipe import QLoraSpec
from vramscope.tune.qlora import build_trainer, write_random_checkpoint

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(TINY, tmp_path_factory.mktemp("tiny"), dtype="fp32")


@pytest.mark.parametrize("framework", ["hf", "trl", "loop"])
def test_each_framework_steps_a_real_model(checkpoint: Path, framework: str) -> None:
    spec = QLoraSpec(framework=framework, lora_r=4, optim="adamw_torch")
    trainer = build_trainer(checkpoint, spec, device="cpu")
    first = trainer.step(2, 32)
    second = trainer.step(2, 32)
    assert math.isfinite(first) and math.isfinite(second)
    if framework == "loop":
        # the loop's `out` survives the step, with the full logits, until the next forward returns
        assert trainer._kept is not None and tuple(trainer._kept.logits.shape) == (2, 32, TINY["vocab_size"])
    else:
        assert trainer._kept is None
    if framework == "trl":
        # TRL's fused LM head replaced the forward: per-token log-probabilities, never the logits
        out = trainer.model(input_ids=trainer.batch(1, 8), labels=trainer.batch(1, 8), fused_lm_head=True)
        assert out.log_probs.shape == (1, 7) and getattr(out, "logits", None) is None


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["hf", "trl", "loop"])
def test_each_framework_steps_a_4bit_model_on_the_gpu(checkpoint: Path, framework: str) -> None:
    import torch

    trainer = build_trainer(checkpoint, QLoraSpec(framework=framework, lora_r=4))
    assert math.isfinite(trainer.step(2, 32)) and math.isfinite(trainer.step(2, 32))
    adapters = {p.dtype for p in trainer.model.parameters() if p.requires_grad}
    # TRL casts the adapters of a quantized model to bf16; peft keeps them fp32 for the others
    assert adapters == ({torch.bfloat16} if framework == "trl" else {torch.float32})
