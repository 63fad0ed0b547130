"""The training recipe as pure data: how a model is fine-tuned, and by which framework.

The planner, the tuner, the advice and the CLI all describe a run with one :class:`QLoraSpec`. Nothing
here imports torch or any training library, so the planner stays pure arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

# The training frameworks are vramscope.planner.frameworks' table (one module each; docs/planner.md): a recipe
# names one by its name, and the names are the table's (vramscope.planner.frameworks.FRAMEWORKS), written nowhere
# else, so that a new framework is its module and its line in the registry.
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
    framework: str = "hf"  # a name in vramscope.planner.frameworks.FRAMEWORK_TABLE

    def with_(self, **changes: Any) -> QLoraSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


