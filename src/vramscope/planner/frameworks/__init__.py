"""What each training framework keeps and casts during a QLoRA step, how it builds and steps its model, and
whose keys its users write settings in: one module per framework, one table.

The same model and shapes take different memory under different training programs, because the program
decides the dtypes (peft's ``prepare_model_for_kbit_training``, autocast, TRL's adapter cast), how the loss
meets the logits (dropped before backward, kept by the caller, or never materialised) and what the output
keeps alive (a KV cache). :func:`framework_for` turns a recipe into those facts; the memory model
(:mod:`vramscope.planner.memory`, :mod:`vramscope.planner.layer`) reads only them.

- :mod:`~vramscope.planner.frameworks.record`: the records a framework module fills in (``Framework``, ``Build``,
  ``Style``);
- :mod:`~vramscope.planner.frameworks.hf`, ``trl``, ``qlora``, ``unsloth``, ``loop``, ``loop_loss``: one framework
  each (``hf``, ``trl`` and ``loop`` also their settings style); ``axolotl``: a settings style only;
- :mod:`~vramscope.planner.frameworks.registry`: the one table (``FRAMEWORK_TABLE``, ``STYLE_TABLE``) and the
  lookups; a new framework is a module and its line in ``registry.MODULES``;
- :mod:`~vramscope.planner.frameworks.precision`: the dtypes of a step and the breakdown's notes.

Pure data: nothing here imports torch.
"""

from vramscope.planner.frameworks.precision import Precision, component_notes, precision
from vramscope.planner.frameworks.record import (
    FRAMEWORK_COMPONENTS,
    OFFLOAD_MIN_SEQ,
    TOKEN_TILE,
    VOCAB_TILE,
    Build,
    Framework,
    Style,
)
from vramscope.planner.frameworks.registry import (
    FRAMEWORK_TABLE,
    FRAMEWORKS,
    HARNESS,
    STYLE_TABLE,
    STYLES,
    TRL_TRAINERS,
    framework_for,
    framework_help,
    framework_named,
    register,
    registered,
    style_named,
    style_of_program,
    traced,
)

__all__ = [
    "FRAMEWORKS", "FRAMEWORK_COMPONENTS", "FRAMEWORK_TABLE", "HARNESS", "OFFLOAD_MIN_SEQ", "STYLES", "STYLE_TABLE",
    "TOKEN_TILE", "TRL_TRAINERS", "VOCAB_TILE", "Build", "Framework", "Precision", "Style", "component_notes",
    "framework_for", "framework_help", "framework_named", "precision", "register", "registered", "style_named",
    "style_of_program", "traced",
]
