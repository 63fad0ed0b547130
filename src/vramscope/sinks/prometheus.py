"""Kept so that ``from vramscope.sinks.prometheus import PrometheusSink`` still works: the code is in
:mod:`vramscope.exporters` (collector, http, push)."""

from __future__ import annotations

from vramscope.exporters import *  # noqa: F403
from vramscope.exporters import __all__ as __all__
