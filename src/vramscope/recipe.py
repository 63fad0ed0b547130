"""The training recipe as pure data: how a model is fine-tuned, and by which framework.

The planner, the tuner, the advice and the CLI all describe a run with one :class:`QLoraSpec`. Nothing
here imports torch or any training library, so the planner stays pure arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

# The training programs whose memory differs for the same model and shapes (see docs/planner.md):
# ``hf``   HF Trainer with peft's prepare_model_for_kbit_training (everything not 4-bit in fp32),
# ``qlora`` qlora.py with --bf16: the same, then LoRA, embeddings and lm_head cast back to bf16,
# ``unsloth`` TRL's trainer under Unsloth, its checkpoints offloaded to the host,
# ``trl``  TRL's SFTTrainer with its defaults (no kbit preparation: norms, embeddings, lm_head stay 16-bit),
# ``loop`` a hand-written loop that keeps the model output (logits) until the next step,
# ``loop-loss`` a hand-written loop that keeps only ``.loss`` (vramscope's own measurement and DDP steps).
FRAMEWORKS = ("hf", "trl", "qlora", "unsloth", "loop", "loop-loss")

OPTIMIZERS = ("paged_adamw_32bit", "paged_adamw_8bit", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "sgd")


@dataclass(frozen=True)
class QLoraSpec:
    """How a model is fine-tuned. The defaults follow the QLoRA reference recipe (``qlora.py``)."""

    bits: int = 4  # 4 (NF4), 8 (LLM.int8) or 16 (no quantization: plain LoRA)
    double_quant: bool = True
    quant_type: str = "nf4"
    compute_dtype: str = "bf16"  # or "fp16"
    lora_r: int = 64
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] | None = None  # None = every linear layer but lm_head
    gradient_checkpointing: bool = True
    attn: str = "sdpa"  # or "eager", "flash_attention_2"
    optim: str = "paged_adamw_32bit"
    learning_rate: float = 2e-4
    framework: str = "hf"  # one of FRAMEWORKS

    def with_(self, **changes: Any) -> QLoraSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


