"""Kept so that old imports still work: the QLoRA model builders are :mod:`vramscope.training.qlora`."""

from __future__ import annotations

from vramscope.training.qlora import (
    OPTIMIZERS,
    QLoraSpec,
    Trainer,
    build_trainer,
    load_model,
    make_optimizer,
    require,
    torch_dtype,
    write_random_checkpoint,
)

__all__ = ["OPTIMIZERS", "QLoraSpec", "Trainer", "build_trainer", "load_model", "make_optimizer", "require",
           "torch_dtype", "write_random_checkpoint"]
