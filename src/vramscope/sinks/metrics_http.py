"""Kept so that old imports still work: the exporter's bounded HTTP server is :mod:`vramscope.exporters.server`."""

from __future__ import annotations

from vramscope.exporters.server import (
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    REQUEST_TIMEOUT_S,
    SEND_TIMEOUT_S,
    MetricsServer,
)

__all__ = ["MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "REQUEST_TIMEOUT_S", "SEND_TIMEOUT_S", "MetricsServer"]
