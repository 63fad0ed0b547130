"""``unsloth``: TRL's trainers (dtypes, fused head, allocator behaviour: trl's) under Unsloth's patches, whose
``use_gradient_checkpointing="unsloth"`` keeps the checkpoints on the host. Not measured (docs/planner.md).
Its users' settings are written as HF's ``TrainingArguments`` (what Unsloth's notebooks pass).
"""

from __future__ import annotations

from vramscope.planner.frameworks import hf
from vramscope.planner.frameworks.record import Build, Framework

FRAMEWORK = Framework(
    name="unsloth", title="Unsloth (TRL's trainer; checkpoints offloaded to pinned host memory)",
    prepares_kbit=False, autocast=True, adapters_half=True, logits="chunked", keeps_kv_cache=False,
    reentrant=False, fragmentation=(0.808, 0.0, 1.411, 0.0), cuda_context_bytes=758 * 1024**2,
    offloads_checkpoints=True,
    build=Build(peft_kbit=False, trainer=True),
    dataset_trainer="sft", style=hf.STYLE.name, summary="TRL's trainer under Unsloth, checkpoints on the host",
    # no programs: the unsloth reader plans with it where the command offloads the checkpoints (its default)
)
