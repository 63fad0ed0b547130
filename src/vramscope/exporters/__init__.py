"""Prometheus export: a ``/metrics`` endpoint (:class:`PrometheusSink`) and a Pushgateway pusher
(:class:`PushgatewaySink`), both fed by the sampler like any other sink.

* :mod:`~vramscope.exporters.collector`: the metric list (:data:`METRICS`), the errors, and
  :class:`SampleCollector`; the only module that imports ``prometheus_client`` (the
  ``vramscope[prometheus]`` extra), lazily, when a sink is built, so ``vramscope run --help`` works without it.
* :mod:`~vramscope.exporters.http`: :class:`PrometheusSink`, on the bounded one-thread server of
  :mod:`~vramscope.exporters.server`.
* :mod:`~vramscope.exporters.push`: :class:`PushgatewaySink`.
* :mod:`~vramscope.exporters.relay`: the training processes' series, relayed to ``vramscope run``'s exporters.
* :mod:`~vramscope.exporters.registry`: :data:`EXPORTERS`, the one table of exporters (flags, opening, ``where``),
  and :func:`open_exporters` / :func:`close_all` over it, for the CLI, the monitor and the callbacks.

Every series carries ``host`` and, when known, ``rank``; GPU series add ``gpu`` (NVML's index) and
``uuid``; per-process series add ``pid``. Units live in the names (``_bytes``, ``_seconds``, ``_ratio``);
missing data is an absent metric, never a fake 0.

Errors are :class:`PrometheusSinkError` subclasses, so an integration can catch one type, warn, and let
training go on: :class:`PrometheusAddressError` (bad ``[HOST:]PORT``), :class:`PrometheusBindError`
(port in use, not allowed, host not of this machine), :class:`PrometheusLabelError` (bad constant label),
:class:`PushgatewayURLError` (bad ``--push`` URL) and :class:`PrometheusUnavailableError`
(``prometheus-client`` not installed).
"""

from __future__ import annotations

from vramscope.exporters.collector import (
    DEFAULT_ADDRESS,
    DEFAULT_HOST,
    DEFAULT_JOB,
    DEFAULT_PUSH_INTERVAL_S,
    DEFAULT_PUSH_TIMEOUT_S,
    INSTALL_HINT,
    METRICS,
    SERIES_LABELS,
    PrometheusAddressError,
    PrometheusBindError,
    PrometheusLabelError,
    PrometheusSinkError,
    PrometheusUnavailableError,
    PushgatewayURLError,
    SampleCollector,
)
from vramscope.exporters.http import PrometheusSink, parse_address
from vramscope.exporters.push import PushgatewaySink, check_push_url
from vramscope.exporters.registry import EXPORTERS, ExportContext, close_all, open_exporters

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_HOST",
    "DEFAULT_JOB",
    "DEFAULT_PUSH_INTERVAL_S",
    "DEFAULT_PUSH_TIMEOUT_S",
    "EXPORTERS",
    "INSTALL_HINT",
    "METRICS",
    "SERIES_LABELS",
    "ExportContext",
    "PrometheusAddressError",
    "PrometheusBindError",
    "PrometheusLabelError",
    "PrometheusSink",
    "PrometheusSinkError",
    "PrometheusUnavailableError",
    "PushgatewaySink",
    "PushgatewayURLError",
    "SampleCollector",
    "check_push_url",
    "close_all",
    "open_exporters",
    "parse_address",
]
