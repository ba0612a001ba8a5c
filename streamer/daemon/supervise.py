"""The main thread of one daemon while its engine works: systemd's watchdog fed while the engine
makes progress, its status sent, and after a stop request at most `drain_timeout` for the batch
in hand."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def supervise(engine: threading.Thread, stop: threading.Event, notifier: Any, service: Any,
              stalled: Callable[[float], bool], status_line: Callable[[], str]) -> bool:  # fmt: skip
    """Until the engine ends; True when the drain timeout passed with the batch still in hand (abandoned).
    `notifier`: `streamer.daemon.notify.Notifier`; `service`: the `service.*` configuration."""
    ping = notifier.watchdog_interval
    tick = min(x for x in (ping, service.status_interval, 0.5) if x)
    next_ping = next_status = time.monotonic()
    drain_deadline = None
    while engine.is_alive():
        engine.join(tick)
        now = time.monotonic()
        if stop.is_set() and drain_deadline is None:
            drain_deadline = now + service.drain_timeout
            notifier.stopping("stopping: finishing the batch in hand")
        if drain_deadline is not None and now >= drain_deadline and engine.is_alive():
            log.warning("the batch in hand did not finish within %g s; exiting without it (it is redone at "
                        "the next start)", service.drain_timeout)
            return True
        if ping and now >= next_ping and not stalled(service.stall_timeout):
            notifier.watchdog()
            next_ping = now + ping
        if now >= next_status:
            notifier.status(status_line())
            next_status = now + service.status_interval
    return False
