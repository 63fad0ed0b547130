"""``loop-loss``: a hand-written loop keeping only ``.loss`` (``prepare_model_for_kbit_training``, no autocast):
vramscope's own measurement and DDP steps (:data:`~vramscope.planner.frameworks.HARNESS`), and what a ``loop``
becomes when it drops its output.
"""

from __future__ import annotations

from vramscope.planner.frameworks import trl
from vramscope.planner.frameworks.loop import STYLE
from vramscope.planner.frameworks.record import Build, Framework

FRAMEWORK = Framework(
    name="loop-loss", title="hand-written loop keeping only `loss` (prepare_model_for_kbit_training, no "
    "autocast)", prepares_kbit=True, autocast=False, adapters_half=False, logits="dropped", keeps_kv_cache=False,
    reentrant=True, fragmentation=(0.615, 0.269, 1.037, 0.026), cuda_context_bytes=745 * 1024**2,
    build=Build(peft_kbit=True, trainer=False, traced=True),
    style=STYLE.name, summary="one that keeps only its .loss",
    switch_to=trl.FRAMEWORK.name,
)
