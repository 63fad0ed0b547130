"""The user's own data: read a local dataset, tokenize it the way the trainer does, and find the longest batch
its collator can form, so that the plan is made at that batch rather than at ``batch x max_length``.

:func:`dataset_plan_input` is the entry point; :class:`DatasetLengths` its typed answer; :class:`DatasetError` a
one-line reason it could not read the data. pyarrow is imported here only (and only when installed).
"""

from __future__ import annotations

from vramscope.dataset.lengths import dataset_plan_input
from vramscope.dataset.types import DatasetError, DatasetLengths, Histogram

__all__ = ["DatasetError", "DatasetLengths", "Histogram", "dataset_plan_input"]
