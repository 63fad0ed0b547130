"""Keyword spellings the callbacks share: ``prometheus=`` is the one name for the exporter's address.

The HF callback called it ``prometheus_port=`` until this release; both callbacks accept that spelling for one
more release, with one FutureWarning line (FutureWarning: shown to the people who run the code, not only to
developers as a DeprecationWarning would be).
"""

from __future__ import annotations

import warnings


def prometheus_address(port: int | str | None) -> str | None:
    """``19400`` -> ``"127.0.0.1:19400"``; an address with a host is kept as it is."""
    if port is None:
        return None
    text = str(port)
    return text if ":" in text else f"127.0.0.1:{text}"


def prometheus_option(prometheus: int | str | None, prometheus_port: int | str | None) -> str | None:
    """The exporter's ``"HOST:PORT"`` from ``prometheus=`` or its old spelling ``prometheus_port=``.

    Raises:
        TypeError: both were given (which one is meant cannot be guessed).
    """
    if prometheus_port is not None:
        if prometheus is not None:
            raise TypeError("give prometheus= only (prometheus_port= is its old name)")
        # stacklevel 3: the warning names the user's line that built the callback, not this one
        warnings.warn("prometheus_port= is now prometheus=; the old name works until the next release",
                      FutureWarning, stacklevel=3)
        prometheus = prometheus_port
    return prometheus_address(prometheus)
