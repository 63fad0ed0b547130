"""The ``axolotl`` settings style: axolotl's YAML keys. Not a framework of its own: axolotl builds an HF
``Trainer`` subclass (the ``hf`` framework), and its own trainer, model and loop leave no "switch to TRL's
SFTTrainer", no forward arguments to pass and no output to drop.
"""

from __future__ import annotations

from vramscope.planner.frameworks.record import Style

STYLE = Style(
    name="axolotl", form="yaml",
    renamed=(("per_device_train_batch_size", "micro_batch_size"), ("optim", "optimizer"),
             ("max_length", "sequence_len"), ("r", "lora_r"), ("target_modules", "lora_target_modules")),
    not_offered=frozenset({"framework", "keep_output", "use_cache"}),
    programs=("axolotl",),
)
