"""The parent's end of the relay: ``vramscope run``'s exporters carry the command's training series too.

The command's Trainers (their injected callbacks) send their step, allocator, leak and forecast series to a
socket this opens (:class:`~vramscope.exporters.relay.RelayReceiver`); they land in the run's own exporters, so
that ``run --prometheus`` / ``--push`` give the same series as the callback's own exporter would.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from vramscope.exporters.relay import ENV_RELAY, RelayReceiver
from vramscope.types import Sink

log = logging.getLogger("vramscope.runner")


def with_relay(exporters: Sequence[Sink], env: MutableMapping[str, str]) -> list[Sink]:
    """The run's sinks with the relay's receiver first (so that it is drained before the exporters' last push),
    and the socket named in ``env`` for the command. Without exporters, nothing; a socket that cannot be opened
    is one warning and the run goes on with the process-level series only."""
    if not exporters:
        return list(exporters)
    try:
        receiver = RelayReceiver(exporters)
    except OSError as exc:
        log.warning("vramscope: the Trainers' step series will not be exported (no relay socket: %s)", exc)
        return list(exporters)
    env.update(receiver.env)
    return [receiver, *exporters]


def relay_into(callback: Any, env: Mapping[str, str]) -> bool:
    """Give a Trainer's own vramscope callback (the user's, which ``run`` leaves as it is) the relay too, so that
    ``run --prometheus/--push`` carries its series as it carries the injected one's. Only adds a sink: the
    callback's log, options and figures stay the user's. True when it was added."""
    path = env.get(ENV_RELAY)
    if not path:
        return False
    # Deferred: the callback's module has it loaded already; `vramscope run`'s parent never needs it otherwise.
    from vramscope.integrations.options import export_also

    return export_also(callback, "relay", path)
