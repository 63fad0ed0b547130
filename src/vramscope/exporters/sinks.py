"""The exporters that ``--prometheus ADDRESS`` and ``--push URL`` ask for, opened and closed together."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from vramscope.exporters.collector import DEFAULT_PUSH_INTERVAL_S, PushgatewayURLError
from vramscope.exporters.http import PrometheusSink
from vramscope.exporters.push import PushgatewaySink, check_push_url

log = logging.getLogger("vramscope.exporters")  # one logger for every exporter


def open_exporters(
    prometheus: str | None = None,
    push: str | None = None,
    push_interval: float | None = None,
    labels: dict[str, str] | None = None,
) -> list[PrometheusSink | PushgatewaySink]:
    """The sinks that ``--prometheus ADDRESS`` and ``--push URL`` ask for (none when both are None).

    Built together so that a failure closes the one already started before raising.

    Raises:
        PrometheusSinkError: a bad address or URL, a port in use, or prometheus-client missing.
    """
    if push is None and push_interval is not None:
        raise PushgatewayURLError("a push interval needs a Pushgateway to push to; add --push http://HOST:9091")
    sinks: list[PrometheusSink | PushgatewaySink] = []
    try:
        if push is not None:
            check_push_url(push)  # before a server starts, so a bad URL leaves nothing behind
        if prometheus is not None:
            sinks.append(PrometheusSink(prometheus, labels=labels))
        if push is not None:
            interval = DEFAULT_PUSH_INTERVAL_S if push_interval is None else push_interval
            sinks.append(PushgatewaySink(push, labels=labels, interval=interval))
    except BaseException:
        close_all(sinks)
        raise
    return sinks


def close_all(sinks: Sequence[PrometheusSink | PushgatewaySink]) -> None:
    """Close every sink, even when one fails to close."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:
            log.warning("vramscope: closing %s failed: %s", type(sink).__name__, exc)
