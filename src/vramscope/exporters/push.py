"""Pushing the metrics to a Prometheus Pushgateway: :class:`PushgatewaySink`, on its own timer thread."""

from __future__ import annotations

import logging
import threading
import urllib.parse
from typing import TYPE_CHECKING

from vramscope.exporters.collector import (
    DEFAULT_JOB,
    DEFAULT_PUSH_INTERVAL_S,
    DEFAULT_PUSH_TIMEOUT_S,
    ExporterBase,
    PrometheusLabelError,
    PushgatewayURLError,
    check_labels,
    load_prometheus_client,
)

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("vramscope.exporters")  # one logger for every exporter


def check_push_url(url: str) -> str:
    """Validate a Pushgateway URL (``http(s)://HOST[:PORT][/PATH]``) and return it without a trailing '/'.

    Raises:
        PushgatewayURLError: with the accepted form.
    """
    parts = urllib.parse.urlsplit(url.strip())
    example = "e.g. http://pushgateway:9091"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PushgatewayURLError(f"cannot push to {url!r}: give the Pushgateway as http(s)://HOST[:PORT], {example}")
    try:
        parts.port  # noqa: B018 - reading it validates it
    except ValueError:
        raise PushgatewayURLError(f"cannot push to {url!r}: the port is not a number, {example}") from None
    if parts.query or parts.fragment:
        raise PushgatewayURLError(f"cannot push to {url!r}: drop the '?...' or '#...' part, {example}")
    return url.strip().rstrip("/")


class PushgatewaySink(ExporterBase):
    """Pushes the metrics to a Prometheus Pushgateway every ``interval`` seconds, on its own thread.

    For nodes that Prometheus cannot scrape (batch jobs, firewalled workers). A push replaces the
    group's previous one (HTTP PUT). Pushes happen on the timer, never per sample, and only when something
    changed; :meth:`close` makes a last push so that the end state of a short run is on record. A failed
    push is logged once (per cause) and retried at the next tick: a gateway that is down never stops
    training.

    The group is ``job`` plus ``instance`` (the host), the ``grouping`` labels (``vramscope run`` adds
    ``run``: the log's stem, else host-pid-start, so two runs on one host never share a group) and, when
    known, ``rank``: several ranks on one host push to separate groups.

    Args:
        url: the gateway, ``http(s)://HOST[:PORT][/PATH]``.
        labels: constant labels on every series.
        interval: seconds between pushes.
        job: the ``job`` of the group.
        timeout: seconds one push may take before it is given up.
        registry: a registry to register into and push (your own metrics ride along).
        delete_on_close: remove the group from the gateway at :meth:`close` instead of a last push.
        grouping: more labels of the group (``{"run": "llama-qlora"}``); ``job`` and ``instance`` are not
            among them.

    Raises:
        PushgatewayURLError: ``url`` is not an http(s) URL.
        PrometheusLabelError: a label name is not valid or is one vramscope sets per series.
        PrometheusUnavailableError: prometheus-client is not installed.
    """

    def __init__(
        self,
        url: str,
        labels: dict[str, str] | None = None,
        interval: float = DEFAULT_PUSH_INTERVAL_S,
        job: str = DEFAULT_JOB,
        timeout: float = DEFAULT_PUSH_TIMEOUT_S,
        registry: CollectorRegistry | None = None,
        delete_on_close: bool = False,
        grouping: dict[str, str] | None = None,
    ) -> None:
        self.url = check_push_url(url)
        self._extra_grouping = check_labels(grouping)
        for reserved in ("job", "instance"):
            if reserved in self._extra_grouping:
                raise PrometheusLabelError(f"the group's {reserved!r} is set by vramscope; choose another label")
        if not interval > 0:
            raise ValueError(f"push interval must be positive, got {interval}")
        super().__init__(labels, registry)
        self.job = job
        self.interval = float(interval)
        self.timeout = float(timeout)
        self.pushes = 0  # successful pushes, for tests and the curious
        self._delete_on_close = delete_on_close
        self._pushed_version = -1
        self._grouping: dict[str, str] | None = None
        self._failures: set[str] = set()
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vramscope-pushgateway", daemon=True)
        self._thread.start()

    def grouping_key(self) -> dict[str, str]:
        """The group's labels besides ``job``: fixed at the first push, so a group never moves."""
        if self._grouping is None:
            base = self.collector.base_labels()
            self._grouping = {"instance": base["host"], **self._extra_grouping}
            if "rank" in base and "rank" not in self._grouping:
                self._grouping["rank"] = base["rank"]
        return self._grouping

    @property
    def where(self) -> str:
        """One line for people: where the metrics go."""
        group = "".join(f", {k} {v!r}" for k, v in self._extra_grouping.items())
        return f"pushing metrics to {self.url} every {self.interval:g} s (job {self.job!r}{group})"

    def push_now(self) -> bool:
        """Push the current state now if it changed since the last push; True when the gateway has it."""
        with self._push_lock:
            version = self.collector.version
            if version == self._pushed_version:
                return True
            if version == 0:  # nothing written yet: an empty push would only erase an older group
                return False
            client = load_prometheus_client()
            try:
                client.push_to_gateway(
                    self.url,
                    job=self.job,
                    registry=self.registry,
                    grouping_key=self.grouping_key(),
                    timeout=self.timeout,
                )
            except Exception as exc:  # urllib's URLError, HTTPError, socket timeouts: never fatal
                self._warn(exc)
                return False
            self._pushed_version = version
            self.pushes += 1
            if self._failures:
                log.warning("vramscope: pushing to %s works again", self.url)
                self._failures.clear()
            return True

    def _warn(self, exc: Exception) -> None:
        cause = f"{type(exc).__name__}: {exc}"
        if cause not in self._failures:
            self._failures.add(cause)
            log.warning(
                "vramscope: cannot push metrics to %s (%s); retrying every %g s", self.url, cause, self.interval
            )

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.push_now()

    def close(self) -> None:
        """Stop the timer and make the last push (or delete the group); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=self.timeout + 1.0)
        if self._delete_on_close:
            try:
                load_prometheus_client().delete_from_gateway(
                    self.url, job=self.job, grouping_key=self.grouping_key(), timeout=self.timeout
                )
            except Exception as exc:
                self._warn(exc)
        else:
            self.push_now()
        self._unregister()
