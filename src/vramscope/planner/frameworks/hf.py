"""``hf``: transformers' ``Trainer`` with peft's ``prepare_model_for_kbit_training`` (the qlora.py recipe), under
the Trainer's bf16 autocast; and the ``hf`` settings style, ``TrainingArguments``' fields.

Read from the commands of HF Trainer scripts, axolotl, LLaMA-Factory, ms-swift and FastChat (their trainers are
HF ``Trainer`` subclasses).
"""

from __future__ import annotations

from vramscope.planner.frameworks import trl
from vramscope.planner.frameworks.record import Build, Framework, Style

STYLE = Style(name="hf", form="arguments", config="TrainingArguments")

FRAMEWORK = Framework(
    name="hf", title="HF Trainer + prepare_model_for_kbit_training (the qlora.py recipe), bf16 autocast",
    prepares_kbit=True, autocast=True, adapters_half=False, logits="dropped", keeps_kv_cache=False,
    reentrant=False, fragmentation=(1.718, 0.442, 1.907, 0.468), cuda_context_bytes=758 * 1024**2,
    build=Build(peft_kbit=True, trainer=True, trace_autocast=True, traced=True),
    style=STYLE.name, summary="HF Trainer + prepare_model_for_kbit_training, the qlora.py recipe",
    programs=("hf", "qlora", "axolotl", "llamafactory", "swift", "fastchat"),
    switch_to=trl.FRAMEWORK.name, switch_line="transformers.Trainer with prepare_model_for_kbit_training",
)
