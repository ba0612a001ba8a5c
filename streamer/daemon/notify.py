"""systemd's notify protocol (`sd_notify`): datagrams on the AF_UNIX socket in `$NOTIFY_SOCKET`.

A dozen lines instead of a dependency. Outside systemd (no `$NOTIFY_SOCKET`) every call is a
no-op, so the daemon calls it unconditionally. The watchdog interval comes from
`$WATCHDOG_USEC` (set by `WatchdogSec=`), and the daemon pings at half of it.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends READY, STATUS, WATCHDOG and STOPPING to systemd when run under `Type=notify`."""

    def __init__(self, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)  # a full socket queue must never stall the daemon
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval: float | None = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *assignments: str) -> None:
        """Send `KEY=value` lines; a failure (or a full queue) is logged, never raised or waited on."""
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(assignments).encode(), self._address)
        except OSError as exc:
            log.warning("cannot notify systemd at %s: %s", self._address, exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address(value: str) -> str | bytes | None:
    if not value:
        return None
    if value.startswith("@"):  # abstract namespace
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    log.warning("ignoring NOTIFY_SOCKET=%r (not an AF_UNIX path)", value)
    return None
