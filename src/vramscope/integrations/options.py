"""Keyword spellings the callbacks share: ``prometheus=`` is the one name for the exporter's address.

The options themselves, and the old ``prometheus_port=`` spelling, are read in one place,
:class:`vramscope.training.settings.MonitorSettings`; these names are re-exported from there for the imports
that knew them here.
"""

from __future__ import annotations

from vramscope.training.settings import prometheus_address, prometheus_option

__all__ = ["prometheus_address", "prometheus_option"]
