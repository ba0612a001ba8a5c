"""The ZeroMQ publisher: results out to any number of subscribers, never back-pressure in.

Callers (the pipeline, the tuning monitor, the daemon) encode their message and
append it to a byte-bounded queue; one thread owns every socket and sends. The
pipeline therefore never waits on a subscriber: a slow one loses messages at
the high-water mark (PUB semantics) and sees the loss in the sequence numbers.
Should the sending thread itself fall behind, the queue drops the newest
message, counts it, and still spends its sequence number so the loss shows.

The same thread serves the snapshot endpoint (ROUTER, the clone pattern),
sends a `status` heartbeat every `heartbeat_interval`, and sends one at once to
each new `status` subscriber (XPUB sees subscriptions) so a joiner learns the
snapshot endpoint and the current sequence numbers without waiting.

Snapshots come from one per-site table. By default the publisher keeps it,
applying each `meth.freq` update; `serve_sites` hands it the table its caller
already keeps instead (the daemon's `MethFreq`, the source of meth-freq.tsv),
so a genome's sites are held once. That table's owner writes it from its own
thread, and only after changing the table publishes the update; this thread
reads it through `snapshot()`, under the owner's lock. A snapshot may then hold
a batch whose update is still to come, which is harmless: updates carry
absolute counts, so applying one on top of a snapshot that has it changes nothing.

It is over 400 lines because the sockets, the queue and the snapshot service belong to the one
thread that owns them: split apart, each piece would reach into the others' state.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from streamer.errors import ConfigError
from streamer.publish.frequencies import FrequencyTable, SiteCounts, SiteKey, site_columns
from streamer.publish.protocol import (
    CALL_COLUMNS,
    FREQ_COLUMNS,
    RUN_EVENTS,
    SNAPSHOT_REQUEST,
    Topic,
    decode_columns,
    encode_columns,
    pack,
    stamp,
)
from streamer.publish.security import CurveServer, check_binds, make_server, start_authenticator

log = logging.getLogger(__name__)

_CLOSE = object()  # queue sentinel: flush, say goodbye, stop
_STATUS = object()  # queue sentinel: send a status now, in order with the data


class SiteSource(Protocol):
    """A per-site table that the publisher may read from its own thread."""

    def snapshot(self) -> Mapping[SiteKey, SiteCounts]:
        """A consistent copy of the sites, safe to call while the owner writes."""


@dataclass(frozen=True)
class PublisherConfig:
    endpoints: tuple[str, ...] = ("tcp://127.0.0.1:5556",)
    snapshot_endpoint: str | None = "tcp://127.0.0.1:5557"
    sndhwm: int = 1000
    """Messages queued per subscriber before PUB drops for that subscriber."""
    queue_bytes: int = 256 << 20
    """Payload bytes handed over but not yet sent, beyond which the publisher drops messages."""
    heartbeat_interval: float = 2.0
    linger: float = 1.0
    """Seconds `close` may wait to deliver what is still queued."""
    curve: CurveServer | None = None
    insecure_bind: bool = False

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ConfigError("publish endpoints: at least one endpoint is needed")
        for name in ("sndhwm", "queue_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"publish {name}: must be at least 1, not {getattr(self, name)}")
        if not self.heartbeat_interval > 0:
            raise ConfigError(f"publish heartbeat_interval: must be positive, not {self.heartbeat_interval}")
        if self.linger < 0:
            raise ConfigError(f"publish linger: must not be negative, not {self.linger}")


@dataclass(frozen=True)
class PublisherStats:
    sent: int
    dropped: int
    """Messages the publisher itself dropped (queue full); per-subscriber PUB drops show in sequence gaps."""
    queued_bytes: int


MALFORMED_WARNING_INTERVAL = 60.0  # seconds: a local client cannot fill the log with bad requests


class _RateLimitedWarning:
    """At most one WARNING per `interval` for malformed snapshot requests, counting those not logged."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval, self._clock = interval, clock
        self._next = 0.0
        self._quiet = 0  # not logged since the last line

    def note(self, n_frames: int) -> None:
        now = self._clock()
        if now < self._next:
            self._quiet += 1
            return
        more = f" (and {self._quiet} more since the last such warning)" if self._quiet else ""
        log.warning("ignored a malformed snapshot request of %d frames%s; at most one such warning every %g s",
                    n_frames, more, self.interval)
        self._next, self._quiet = now + self.interval, 0


class Publisher:
    """Binds the PUB (XPUB) and snapshot sockets and publishes results; thread-safe.

    `close()` (or leaving the `with` block) flushes the queue, sends a final
    `status` with state "closed" and releases every socket and thread.
    """

    def __init__(self, config: PublisherConfig = PublisherConfig(), *, run_id: str | None = None,
                 context: zmq.Context | None = None):
        targets = config.endpoints + ((config.snapshot_endpoint,) if config.snapshot_endpoint else ())
        check_binds(targets, config.curve, config.insecure_bind)
        self._config = config
        self.run_id = run_id or uuid.uuid4().hex
        self._ctx = context or zmq.Context()
        self._own_context = context is None
        self._auth = None
        self._sockets: list[zmq.Socket] = []
        self._lock = threading.Lock()
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._dropping = False
        self._closed = False
        self._sent = 0
        self._dropped = 0
        self._seq = dict.fromkeys(Topic, 0)
        self._handed: dict[str, int] = {}  # sending thread only: last seq sent or dropped, per topic
        self._counters: dict[str, Any] = {}
        self._malformed = _RateLimitedWarning(MALFORMED_WARNING_INTERVAL)
        self._table: FrequencyTable | None = FrequencyTable()  # None once `serve_sites` shares a table
        self._sites: SiteSource = self._table
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._wake_r.setblocking(False)
        try:
            if config.curve is not None:
                self._auth = start_authenticator(self._ctx, config.curve)
            self._pub, self.endpoints = self._bind(zmq.XPUB, config.endpoints)
            self._router, snapshot = self._bind(zmq.ROUTER, targets[len(config.endpoints):])
            self.snapshot_endpoint = snapshot[0] if snapshot else None
        except BaseException:
            self._release()
            raise
        self._thread = threading.Thread(target=self._serve, name="streamer-publish", daemon=True)
        self._thread.start()
        log.info("publishing run %s on %s (snapshots: %s, CURVE %s)", self.run_id, ", ".join(self.endpoints),
                 self.snapshot_endpoint, "on" if config.curve else "off")

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish_calls(self, columns: Mapping[str, Any]) -> None:
        """A batch of per-read CpG calls: CALL_COLUMNS as arrays, lists or `Categorical`."""
        self._publish(Topic.CALLS, encode_columns(columns, CALL_COLUMNS))

    def serve_sites(self, table: SiteSource) -> None:
        """Serve snapshots from `table` (which its owner keeps current) rather than from a copy.

        Call before the first `publish_freq`; from then on `publish_freq` only sends, and the
        owner must change `table` before publishing the update that says so.
        """
        with self._lock:
            self._table, self._sites = None, table

    def publish_freq(self, updates: Mapping[str, Any]) -> None:
        """Absolute counts (FREQ_COLUMNS) of the sites that changed; kept for snapshots too (unless `serve_sites`)."""
        columns = encode_columns(updates, FREQ_COLUMNS)
        if self._table is None:
            self._publish(Topic.FREQ, columns)
            return
        sites = decode_columns(columns, FREQ_COLUMNS)  # exactly what subscribers will apply
        table = self._table
        self._publish(Topic.FREQ, columns, lambda: table.apply(sites))

    def publish_eventalign(self, columns: Mapping[str, Any]) -> None:
        """Event-to-k-mer rows: numeric arrays and string sequences, any column names."""
        self._publish(Topic.EVENTALIGN, encode_columns(columns, None))

    def publish_status(self, counters: Mapping[str, Any]) -> None:
        """Replace the counters that every heartbeat carries, and send a heartbeat now."""
        with self._lock:
            self._check_open()
            self._counters = dict(counters)
            self._enqueue(_STATUS)

    def publish_tuning(self, decision: Mapping[str, Any]) -> None:
        self._publish(Topic.TUNING, {"decision": dict(decision)})

    def publish_run(self, event: str, info: Mapping[str, Any]) -> None:
        if event not in RUN_EVENTS:
            raise ValueError(f"run event {event!r} is not one of {RUN_EVENTS}")
        self._publish(Topic.RUN, {"event": event, "info": dict(info)})

    @property
    def stats(self) -> PublisherStats:
        with self._lock:
            return PublisherStats(self._sent, self._dropped, self._queued_bytes)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._enqueue(_CLOSE)
        self._thread.join()
        self._release()
        log.info("publisher closed: %s", self.stats)

    # -- callers' side -------------------------------------------------------

    def _publish(self, topic: Topic, obj: Mapping[str, Any], apply: Callable[[], None] | None = None) -> None:
        """Pack, then under the lock: apply to the snapshot state, number, queue (or drop and count)."""
        payload = pack(obj)
        with self._lock:
            self._check_open()
            if apply is not None:
                apply()
            seq = self._seq[topic] = self._seq[topic] + 1
            if self._queued_bytes and self._queued_bytes + len(payload) > self._config.queue_bytes:
                self._dropped += 1
                if not self._dropping:
                    log.warning("publish queue full (%d bytes): dropping messages", self._queued_bytes)
                self._dropping = True
                self._enqueue((topic, seq, None))
                return
            self._dropping = False
            self._queued_bytes += len(payload)
            self._enqueue((topic, seq, [topic.encode(), stamp(topic, self.run_id, seq), payload]))

    def _enqueue(self, entry: object) -> None:
        """Append under the lock; wake the sending thread when the queue was empty."""
        if not self._queue:
            try:
                self._wake_w.send(b"\0")
            except BlockingIOError:  # wake-ups already pending
                pass
        self._queue.append(entry)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the publisher is closed")

    # -- sending thread --------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        poller.register(self._pub, zmq.POLLIN)
        if self._router is not None:
            poller.register(self._router, zmq.POLLIN)
        interval = self._config.heartbeat_interval
        next_beat = time.monotonic()
        try:
            while True:
                ready = dict(poller.poll(max(0.0, next_beat - time.monotonic()) * 1000))
                if self._wake_r.fileno() in ready:
                    self._wake_r.recv(4096)
                if self._send_queued():
                    break
                beat = self._pub in ready and self._status_subscribed()
                if self._router in ready:
                    self._serve_snapshots()
                if beat or time.monotonic() >= next_beat:
                    self._send_status("running")
                    next_beat = time.monotonic() + interval
            self._send_final_status()
        finally:
            for sock in self._sockets:
                sock.close()

    def _send_queued(self) -> bool:
        """Send everything queued; True once the close sentinel (always last) is reached.

        Takes the whole queue at once, so the lock (and the GIL it may cost) changes hands per
        wake-up rather than per message: this keeps up with a producer that holds the GIL.
        """
        while True:
            with self._lock:
                entries, self._queue = self._queue, deque()
            if not entries:
                return False
            size = attempted = sent = 0
            for entry in entries:
                if entry is _CLOSE:
                    break
                if entry is _STATUS:
                    self._send_status("running")
                    continue
                topic, seq, frames = entry
                self._handed[topic] = seq
                if frames is not None:
                    size += len(frames[2])
                    attempted += 1
                    sent += self._send(frames)
            with self._lock:
                self._queued_bytes -= size
                self._sent += sent
                self._dropped += attempted - sent
            if entry is _CLOSE:
                return True

    def _send(self, frames: list[bytes]) -> bool:
        try:
            self._pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def _send_status(self, state: str, retry: bool = False) -> bool:
        """Send a status; with `retry` a refused one is not counted (the caller sends it again)."""
        with self._lock:
            seq = self._seq[Topic.STATUS] = self._seq[Topic.STATUS] + 1
            body = {
                "state": state,
                "heartbeat_interval": self._config.heartbeat_interval,
                "snapshot": self.snapshot_endpoint,
                "counters": self._counters,
                "publisher": {"sent": self._sent, "dropped": self._dropped, "queued_bytes": self._queued_bytes},
                "last_seq": dict(self._handed),
            }
            header = stamp(Topic.STATUS, self.run_id, seq)
        sent = self._send([Topic.STATUS.encode(), header, pack(body)])
        if retry and not sent:
            with self._lock:
                self._seq[Topic.STATUS] -= 1  # the same number again at the next attempt
            return False
        with self._lock:
            self._sent += sent
            self._dropped += not sent
        return sent

    def _send_final_status(self) -> None:
        """The "closed" status, which tells a subscriber what it missed at the tail: a subscriber whose
        queue is full gets up to `linger` seconds to make room for it before it is dropped for it."""
        deadline = time.monotonic() + self._config.linger
        self._pub.setsockopt(zmq.XPUB_NODROP, 1)  # a full queue refuses the message instead of losing it
        try:
            while not self._send_status("closed", retry=True):
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
            else:
                return
        finally:
            self._pub.setsockopt(zmq.XPUB_NODROP, 0)
        self._send_status("closed")

    def _status_subscribed(self) -> bool:
        """Read XPUB subscription messages; True when one will receive `status`."""
        wanted = False
        while True:
            try:
                msg = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return wanted
            wanted |= msg[:1] == b"\1" and Topic.STATUS.encode().startswith(msg[1:])

    def _serve_snapshots(self) -> None:
        while True:
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if b"" not in frames or frames[frames.index(b"") + 1:] != [SNAPSHOT_REQUEST]:
                self._malformed.note(len(frames))
                continue
            envelope = frames[:frames.index(b"") + 1]
            with self._lock:  # then the owner's lock, in `snapshot()`; no one takes them the other way
                seq = self._seq[Topic.FREQ]
                sites = self._sites.snapshot()
                counters = self._counters
            body = {"counters": counters, "sites": encode_columns(site_columns(sites), FREQ_COLUMNS)}
            header = stamp(SNAPSHOT_REQUEST.decode(), self.run_id, seq)
            self._router.send_multipart([*envelope, SNAPSHOT_REQUEST, header, pack(body)], flags=zmq.NOBLOCK)

    # -- set-up and tear-down --------------------------------------------------

    def _bind(self, kind: int, endpoints: tuple[str, ...]) -> tuple[zmq.Socket | None, tuple[str, ...]]:
        if not endpoints:
            return None, ()
        sock = self._ctx.socket(kind)
        self._sockets.append(sock)
        sock.linger = round(self._config.linger * 1000)
        if kind == zmq.XPUB:
            sock.sndhwm = self._config.sndhwm
            sock.xpub_verbose = True
        if self._config.curve is not None:
            make_server(sock, self._config.curve)
        bound = []
        for endpoint in endpoints:
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot bind {endpoint}: {exc}") from exc
            bound.append(sock.last_endpoint.decode())
        return sock, tuple(bound)

    def _release(self) -> None:
        for sock in self._sockets:
            sock.close()  # no-op when the sending thread already closed it
        if self._auth is not None:
            self._auth.stop()
        if self._own_context:
            self._ctx.term()
        self._wake_r.close()
        self._wake_w.close()
