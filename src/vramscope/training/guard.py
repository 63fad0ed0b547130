"""The monitor's failure is never the training's failure: a guard for every trainer callback event."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("vramscope")

_Event = TypeVar("_Event", bound=Callable[..., Any])


def never_stops_training(event: _Event) -> _Event:
    """Guard a callback event (HF ``on_*``, Lightning ``on_*``).

    The first exception (a step log that cannot be created, a full disk, a hook that breaks) is
    reported in one warning; the callback then closes its monitor (``self.monitor``) and does nothing
    more, and the trainer goes on as if it had never been added.
    """

    @functools.wraps(event)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_failed", False):
            return None
        try:
            return event(self, *args, **kwargs)
        except Exception as exc:
            self._failed = True
            log.warning("vramscope: the memory callback stopped (%s: %s); training goes on without it",
                        type(exc).__name__, exc)
            with contextlib.suppress(Exception):
                self.monitor.close()
            return None

    return guarded  # type: ignore[return-value]
