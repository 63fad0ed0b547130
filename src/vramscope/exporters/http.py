"""The ``/metrics`` endpoint: :class:`PrometheusSink`, on the bounded server of :mod:`~vramscope.exporters.server`."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import urllib.parse
from typing import TYPE_CHECKING, Any

from vramscope.exporters.collector import (
    DEFAULT_ADDRESS,
    DEFAULT_HOST,
    ExporterBase,
    PrometheusAddressError,
    PrometheusBindError,
    load_prometheus_client,
)
from vramscope.exporters.server import MetricsServer

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("vramscope.exporters")  # one logger for every exporter


def parse_address(text: str) -> tuple[str, int]:
    """Read ``"[HOST:]PORT"`` into ``(host, port)``; the host defaults to 127.0.0.1.

    ``"19400"`` -> ``("127.0.0.1", 19400)``, ``"0.0.0.0:19400"`` -> all interfaces, ``"[::1]:19400"`` -> IPv6.
    Port 0 asks the system for a free port (see :attr:`PrometheusSink.port`).

    Raises:
        PrometheusAddressError: with the accepted forms.
    """
    raw = text.strip()
    host = DEFAULT_HOST
    port_text = raw
    if raw.startswith("["):  # [IPv6]:PORT
        end = raw.find("]")
        if end < 0 or raw[end + 1 : end + 2] != ":":
            raise PrometheusAddressError(f"cannot read {text!r} as an address; write an IPv6 one as [::1]:19400")
        host, port_text = raw[1:end], raw[end + 2 :]
    elif ":" in raw:
        host, _, port_text = raw.rpartition(":")
        if ":" in host:
            raise PrometheusAddressError(f"cannot read {text!r} as an address; write an IPv6 one as [::1]:19400")
    if not host:
        # Prometheus reads ":19400" as "every interface"; we never widen exposure without an explicit host.
        raise PrometheusAddressError(
            f"no host before ':' in {text!r}; give just the port (binds 127.0.0.1) or 0.0.0.0:PORT for every interface"
        )
    # ASCII digits only, as every number vramscope reads ("٩٤٠٠".isdigit() is true too), and short.
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5) or int(port_text) > 65535:
        shown = repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"
        raise PrometheusAddressError(f"cannot read {shown} as [HOST:]PORT; write e.g. 19400 or 0.0.0.0:19400")
    return host, int(port_text)


def binds_every_interface(host: str) -> bool:
    """True when listening on ``host`` means every interface: the unspecified address in any spelling.

    Read as the socket layer reads it, not as a string: ``0``, ``0.0``, ``0x0`` and ``000.0.0.0`` are
    IPv4's 0.0.0.0 to ``inet_aton`` (which getaddrinfo uses for numeric hosts), ``::0`` and ``0:0::`` are
    IPv6's ``::``. A name that resolves to it counts too.
    """
    text = host.strip().strip("[]").partition("%")[0]  # an IPv6 zone (fe80::1%eth0) does not change the address
    if not text:
        return True
    try:
        return ipaddress.ip_address(text).is_unspecified
    except ValueError:
        pass
    try:
        return socket.inet_aton(text) == bytes(4)  # the short and old forms ipaddress refuses
    except OSError:
        pass
    try:
        found = socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return any(ipaddress.ip_address(str(info[4][0]).partition("%")[0]).is_unspecified for info in found)


class PrometheusSink(ExporterBase):
    """Serves ``/metrics`` over HTTP for Prometheus to scrape, from the latest sample.

    The server starts at construction, on daemon threads, and stops at :meth:`close`.

    Args:
        address: ``"[HOST:]PORT"``; binds 127.0.0.1 unless a host is given (``0.0.0.0:19400`` for every
            interface). Port 0 picks a free port, readable as :attr:`port`.
        labels: constant labels on every series, e.g. ``{"rank": "0", "run": "llama-qlora"}``.
        registry: a ``prometheus_client.CollectorRegistry`` to register into and serve (so that your own
            metrics share the endpoint); default: a fresh one holding only vramscope's collector.

    Raises:
        PrometheusAddressError: ``address`` is not ``[HOST:]PORT``.
        PrometheusLabelError: a label name is not valid or is one vramscope sets per series.
        PrometheusBindError: the port is in use or not allowed, or the host is not of this machine.
        PrometheusUnavailableError: prometheus-client is not installed.
    """

    def __init__(
        self,
        address: str = DEFAULT_ADDRESS,
        labels: dict[str, str] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        host, port = parse_address(address)
        super().__init__(labels, registry)
        try:
            self._server = _serve(host, port, self._render)
        except PrometheusBindError:
            self._unregister()
            raise
        self.host = host
        self.port: int = self._server.server_port
        log.info("vramscope: serving Prometheus metrics at %s", self.url)
        if self.every_interface:
            log.warning("vramscope: warning: %s", self.exposure)

    @property
    def every_interface(self) -> bool:
        """True when bound to every interface (``0.0.0.0``, ``0``, ``0.0``, ``::``, ``[::0]``...): reachable
        from the network."""
        return binds_every_interface(self.host)

    @property
    def exposure(self) -> str:
        """The one-line warning for a server open to the network."""
        return (
            f"the metrics on port {self.port} can be read by anyone who can reach this machine (host name, "
            "GPUs, process ids); give just the port to keep them on 127.0.0.1"
        )

    def _render(self, accept: str, query: str) -> tuple[bytes, str]:
        """A scrape's answer, as prometheus_client's own server gives it (format by Accept, ``name[]`` filters)."""
        encoder, content_type = load_prometheus_client().exposition.choose_encoder(accept)
        names = urllib.parse.parse_qs(query).get("name[]")
        registry = self.registry.restricted_registry(names) if names else self.registry
        body: bytes = encoder(registry)
        return body, content_type

    @property
    def url(self) -> str:
        """Where the metrics are, e.g. ``http://127.0.0.1:19400/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    @property
    def where(self) -> str:
        """One line for people: where the metrics are served."""
        return f"serving Prometheus metrics at {self.url}"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.close()
        self._unregister()


def _serve(host: str, port: int, render: Any) -> MetricsServer:
    """The bounded metrics server (exporters/server.py) on ``host:port``, bind failures as one clear line."""
    where = f"{host}:{port}"
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise PrometheusBindError(f"cannot listen on {where}: unknown host ({exc.strerror}); check the name") from None
    try:
        return MetricsServer(host, port, family, render)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            why = f"port {port} on {host} is already in use; choose another port (or stop what listens there)"
        elif exc.errno == errno.EACCES:
            why = f"not allowed to listen on port {port}; choose a port above 1023"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"{host} is not an address of this machine; use 127.0.0.1 or one of its own addresses"
        else:
            why = f"cannot listen on {where}: {exc.strerror or exc}"
        raise PrometheusBindError(why) from None
