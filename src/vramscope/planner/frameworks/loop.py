"""``loop``: a hand-written loop that keeps the model output (logits, and the KV cache without checkpointing)
until the next forward returns (``prepare_model_for_kbit_training``, no autocast); and the ``loop`` settings style,
lines of its own code.

Read from the commands of Answer.AI's fsdp_qlora and llama-cookbook (their own loops).
"""

from __future__ import annotations

from vramscope.planner.frameworks import trl
from vramscope.planner.frameworks.record import Build, Framework, Style

STYLE = Style(name="loop", form="code")

# The framework it becomes when the loop keeps only the loss (the loop_loss module, which imports this one).
OUTPUT_DROPPED = "loop-loss"

FRAMEWORK = Framework(
    name="loop", title="hand-written loop keeping `out` (prepare_model_for_kbit_training, no autocast)",
    prepares_kbit=True, autocast=False, adapters_half=False, logits="kept", keeps_kv_cache=True,
    reentrant=True, fragmentation=(1.042, 0.233, 2.688, 0.129), cuda_context_bytes=744 * 1024**2,
    build=Build(peft_kbit=True, trainer=False, traced=True),
    style=STYLE.name, summary="a hand-written loop that keeps the model output until the next step",
    programs=("fsdp_qlora", "cookbook"), output_dropped=OUTPUT_DROPPED, switch_to=trl.FRAMEWORK.name,
)
