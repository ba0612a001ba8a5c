"""sd_notify: datagrams to $NOTIFY_SOCKET, and nothing at all without it."""

from __future__ import annotations

import os
import socket

import pytest

from streamer.daemon.notify import Notifier

from daemon_support import no_leaks  # noqa: F401


@pytest.fixture
def notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(2)
    yield sock, str(path)
    sock.close()


def test_messages_reach_the_socket(notify_socket, no_leaks):
    sock, path = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000"})
    assert n.enabled and n.watchdog_interval == 2.0
    n.ready("ready: watching /data")
    n.status("12 reads done")
    n.watchdog()
    n.stopping("bye")
    n.close()
    got = [sock.recv(4096).decode() for _ in range(4)]
    assert got[0].split("\n")[:2] == ["READY=1", "STATUS=ready: watching /data"]
    assert f"MAINPID={os.getpid()}" in got[0]
    assert got[1:] == ["STATUS=12 reads done", "WATCHDOG=1", "STOPPING=1\nSTATUS=bye"]


def test_abstract_namespace_socket(no_leaks):
    name = f"streamer-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        with_notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        with_notifier.watchdog()
        with_notifier.close()
        assert sock.recv(64) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_without_systemd_nothing_happens(no_leaks):
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval is None
    n.ready("x")
    n.watchdog()
    n.close()


def test_watchdog_meant_for_another_process_is_ignored(notify_socket):
    _, path = notify_socket
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None
    n.close()


def test_a_vanished_socket_is_logged_not_raised(tmp_path, caplog):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    n.status("x")
    n.close()
    assert "cannot notify systemd" in caplog.text
