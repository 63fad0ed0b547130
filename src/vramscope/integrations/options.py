"""Keyword spellings the callbacks share: ``prometheus=`` is the one name for the exporter's address.

The options themselves, and the old ``prometheus_port=`` spelling, are read in one place,
:class:`vramscope.training.settings.MonitorSettings`; these names are re-exported from there for the imports
that knew them here. :func:`export_also` adds an exporter to a callback that exists already (``vramscope run``
relays the user's own callback's series that way).
"""

from __future__ import annotations

from typing import Any

from vramscope.training.settings import MonitorSettings, prometheus_address, prometheus_option

__all__ = ["export_also", "prometheus_address", "prometheus_option"]


def export_also(callback: Any, name: str, value: Any) -> bool:
    """Give a vramscope callback (HF's or Lightning's) one more exporter option (``"relay"``, a socket's path):
    for every monitor it makes from now on, and for its current one when that has not started. False when the
    callback already has that exporter, or is not one of vramscope's."""
    settings = getattr(callback, "settings", None)
    monitor = getattr(callback, "monitor", None)
    if not isinstance(settings, MonitorSettings) or monitor is None or settings.export.get(name):
        return False
    callback.settings = settings.with_export(name, value)  # a monitor made again (train() once more) has it too
    if not monitor.started and not monitor.closed:
        monitor.configure(export=callback.settings.export)
    return True
