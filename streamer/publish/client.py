"""Subscribe to a streamer publisher: typed messages, gaps counted, frequencies kept in sync.

    with Subscriber("tcp://127.0.0.1:5556", topics=["meth"]) as sub:
        for msg in sub:
            match msg:
                case Calls(calls=calls): ...
                case Gap(topic=topic, missed=n): ...

A subscriber counts exactly what it missed: sequence numbers are per topic,
and every heartbeat carries the last number sent on each topic, so losses at
the tail of a burst show as soon as the next heartbeat arrives. When it follows
`meth.freq` it fetches a snapshot on joining (and again after any gap) and
keeps `frequencies` equal to the publisher's table. If nothing arrives for
`lost_after` heartbeat intervals it raises `PublisherLost`, and if a snapshot
request goes unanswered as long, or the publisher closes with one unanswered,
`SnapshotUnanswered`; when the publisher closes cleanly, iteration simply ends.

The decisions live in `_Session`, which sees frames and times but no sockets;
`Subscriber` and `AsyncSubscriber` only move bytes.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from streamer.errors import StreamerError
from streamer.publish.frequencies import FrequencyTable
from streamer.publish.messages import (
    CallBatch,
    Calls,
    EventAlign,
    FreqUpdate,
    Gap,
    Message,
    RunEvent,
    SiteFrequencies,
    Snapshot,
    Status,
    Tuning,
    decode_message,
    decode_snapshot,
)
from streamer.publish.protocol import SNAPSHOT_REQUEST, Header, ProtocolError, Topic
from streamer.publish.security import CurveClient, make_client

__all__ = [
    "AsyncSubscriber", "CallBatch", "Calls", "EventAlign", "FreqUpdate", "Gap", "Header", "Message",
    "ProtocolError", "PublisherLost", "RunEvent", "SiteFrequencies", "Snapshot", "SnapshotUnanswered", "Status",
    "Subscriber",
    "Topic", "Tuning",
]

log = logging.getLogger(__name__)

_RECV_BATCH = 64  # messages taken per wake-up, so a busy stream still hands messages out
_TOPICS = {t.encode() for t in Topic}


class PublisherLost(StreamerError):
    """No message, not even a heartbeat, for `lost_after` heartbeat intervals."""


class SnapshotUnanswered(StreamerError):
    """A snapshot request got no answer: the frequencies cannot be brought in sync."""


class _Session:
    """The subscriber's decisions: sequence gaps, liveness, snapshot then updates."""

    def __init__(self, endpoint: str, topics: tuple[str, ...], follow_sites: bool, snapshot_endpoint: str | None,
                 heartbeat_interval: float, lost_after: int, now: float):
        self.endpoint = endpoint
        self.topics = topics
        self.missed: dict[str, int] = {}
        self.frequencies = FrequencyTable() if follow_sites else None
        self.interval = heartbeat_interval
        self.lost_after = lost_after
        self.last_seen = now
        self.finished = False
        self._run: str | None = None
        self._last: dict[str, int] = {}
        self._snapshot_endpoint = snapshot_endpoint
        # "waiting" for a first status -> "requested" -> "synced"; a gap re-requests; a new run waits again
        self._sync = "waiting" if follow_sites else "synced"
        self._buffer: list[FreqUpdate] = []  # updates held back until the snapshot arrives
        self._request: str | None = None
        self._asked: tuple[str, float] | None = None  # the snapshot request in flight: endpoint, when

    @property
    def deadline(self) -> float:
        return self.last_seen + self.lost_after * self.interval

    def take_request(self) -> str | None:
        """The endpoint to ask for a snapshot, once (asked when the message that called for it came)."""
        request, self._request = self._request, None
        if request is not None:
            self._asked = (request, self.last_seen)
        return request

    def check_snapshot(self, now: float) -> None:
        """Raise if the request in flight has waited `lost_after` heartbeat intervals, or can no longer be answered."""
        if self._asked is None or self._sync != "requested":
            return
        endpoint, at = self._asked
        limit = self.lost_after * self.interval
        if self.finished:
            raise SnapshotUnanswered(f"{self.endpoint} closed before answering the snapshot request to {endpoint}: "
                                     f"{len(self._buffer)} frequency updates could not be applied")
        if now - at >= limit:
            raise SnapshotUnanswered(f"the snapshot request to {endpoint} was not answered within {limit:g} s "
                                     f"({self.lost_after} heartbeat intervals)")

    def on_message(self, frames: list, now: float) -> list[Message]:
        self.last_seen = now
        if bytes(frames[0]) not in _TOPICS:
            return []  # a topic added after this client was written
        msg = decode_message(frames)
        if msg.header.run_id != self._run:
            self._new_run(msg.header.run_id)
        match msg:
            case Status():
                return self._on_status(msg)
            case FreqUpdate() if self.frequencies is not None:
                return self._on_sites(msg)
        return self._in_order(msg)

    def on_snapshot(self, frames: list, now: float) -> list[Message]:
        snap = decode_snapshot(frames)
        self.last_seen = now
        if self._sync != "requested" or snap.header.run_id != self._run:
            return []  # an answer to a request made before a gap or a new run
        self.frequencies.clear()
        self.frequencies.apply(snap.sites.columns())
        self._last[str(Topic.FREQ)] = snap.header.seq
        self._sync, self._asked = "synced", None
        return [snap, *self._replay()]

    def _replay(self) -> list[Message]:
        held, self._buffer = self._buffer, []
        return [out for update in held for out in self._on_sites(update)]

    def _new_run(self, run_id: str) -> None:
        if self._run is not None:
            log.info("publisher %s moved from run %s to run %s", self.endpoint, self._run, run_id)
        self._run = run_id
        self._last.clear()
        if self.frequencies is not None:
            self.frequencies.clear()
            self._buffer.clear()
            self._sync = "waiting"

    def _wants(self, topic: str) -> bool:
        return any(topic.startswith(prefix) for prefix in self.topics)

    def _check(self, topic: str, seq: int) -> tuple[Gap | None, bool]:
        """(the gap before `seq`, whether `seq` was already seen)."""
        last = self._last.get(topic)
        if last is not None and seq <= last:
            return None, True
        self._last[topic] = seq
        if last is None or seq == last + 1:
            return None, False
        gap = Gap(topic, last + 1, seq - last - 1)
        self.missed[topic] = self.missed.get(topic, 0) + gap.missed
        return gap, False

    def _in_order(self, msg: Message) -> list[Message]:
        gap, seen = self._check(msg.header.topic, msg.header.seq)
        if seen:
            return []
        return [gap, msg] if gap else [msg]

    def _on_sites(self, msg: FreqUpdate) -> list[Message]:
        if self._sync != "synced":
            self._buffer.append(msg)
            return []
        gap, seen = self._check(msg.header.topic, msg.header.seq)
        if seen:
            return []
        if gap:
            self._resync()
        if self._sync != "synced":
            self._buffer.append(msg)
            return [gap]
        self.frequencies.apply(msg.sites.columns())
        return [gap, msg] if gap else [msg]

    def _resync(self) -> None:
        """After a lost update the table is wrong until a fresh snapshot (if the publisher serves them)."""
        if self._snapshot_endpoint:
            self._sync, self._request = "requested", self._snapshot_endpoint

    def _on_status(self, msg: Status) -> list[Message]:
        self.interval = msg.heartbeat_interval
        out: list[Message] = []
        gap, seen = self._check(msg.header.topic, msg.header.seq)
        if seen:
            return out
        if gap and self._wants(Topic.STATUS):
            out.append(gap)
        if self._sync == "waiting":
            out += self._first_sync(msg)
        for topic, seq in msg.last_seq.items():
            if not self._wants(topic) or (topic == Topic.FREQ and self._sync != "synced"):
                continue
            last = self._last.get(topic)
            if last is not None and last < seq:  # sent before this status, never arrived: dropped
                out.append(Gap(topic, last + 1, seq - last))
                self.missed[topic] = self.missed.get(topic, 0) + seq - last
                if topic == Topic.FREQ and self.frequencies is not None:
                    self._resync()
            if last is None or last < seq:
                self._last[topic] = seq
        if self._wants(Topic.STATUS):
            out.append(msg)
        self.finished = msg.state == "closed"
        return out

    def _first_sync(self, msg: Status) -> list[Message]:
        """Ask for a snapshot once a status proves our subscription is live."""
        if self._snapshot_endpoint is None and msg.snapshot:
            self._snapshot_endpoint = _reachable(msg.snapshot, self.endpoint)
        if self._snapshot_endpoint:
            self._sync, self._request = "requested", self._snapshot_endpoint
            return []
        log.warning("%s serves no snapshots: frequencies hold only the updates seen from now", self.endpoint)
        self._sync = "synced"
        return self._replay()


def _reachable(bound: str, via: str) -> str:
    """A bound endpoint as a subscriber can connect to it: a wildcard host becomes the host we used."""
    bound_url, via_url = urlsplit(bound), urlsplit(via)
    if bound_url.scheme != "tcp" or via_url.scheme != "tcp" or bound_url.hostname not in ("*", "0.0.0.0", "::"):
        return bound
    return f"tcp://{via_url.netloc.rpartition(':')[0]}:{bound_url.port}"


class _SubscriberBase:
    _context_class: type[zmq.Context] = zmq.Context
    _poller_class: type[zmq.Poller] = zmq.Poller

    def __init__(self, endpoint: str, topics: Iterable[str] = (), *, snapshot: bool = True,
                 snapshot_endpoint: str | None = None, heartbeat_interval: float = 2.0, lost_after: int = 3,
                 curve: CurveClient | None = None, rcvhwm: int = 1000, context: zmq.Context | None = None):
        prefixes = tuple(topics) or ("",)
        follow_sites = snapshot and any(Topic.FREQ.startswith(p) for p in prefixes)
        self._session = _Session(endpoint, prefixes, follow_sites, snapshot_endpoint, heartbeat_interval,
                                 lost_after, time.monotonic())
        self._curve = curve
        self._ctx = context or self._context_class()
        self._own_context = context is None
        self._pending: deque[Message] = deque()
        self._dealer: zmq.Socket | None = None
        self._dealer_endpoint: str | None = None
        self._closed = False
        self._sub = self._socket(zmq.SUB)
        self._sub.rcvhwm = rcvhwm
        self._sub.connect(endpoint)
        for prefix in (*prefixes, Topic.STATUS):  # status last: once it flows, the rest is subscribed too
            self._sub.subscribe(prefix)
        self._poller = self._poller_class()
        self._poller.register(self._sub, zmq.POLLIN)

    @property
    def missed(self) -> dict[str, int]:
        """Messages missed so far, per topic."""
        return dict(self._session.missed)

    @property
    def frequencies(self) -> FrequencyTable | None:
        """The publisher's per-site table as of the last update (None unless following meth.freq)."""
        return self._session.frequencies

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)
        if self._own_context:
            self._ctx.term()

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._ctx.socket(kind)
        if self._curve is not None:
            make_client(sock, self._curve)
        return sock

    def _timeout_ms(self) -> int:
        """How long to wait for the next message; 0 once overdue (then only what is already there counts)."""
        return max(0, math.ceil((self._session.deadline - time.monotonic()) * 1000))

    def _check_alive(self, ready: dict) -> None:
        self._session.check_snapshot(time.monotonic())
        if not ready and time.monotonic() >= self._session.deadline:
            raise PublisherLost(f"nothing from {self._session.endpoint} for {self._session.lost_after} heartbeat "
                                f"intervals ({self._session.lost_after * self._session.interval:g} s)")

    def _request_snapshot(self) -> None:
        """Send the snapshot request the session asked for, if any."""
        endpoint = self._session.take_request()
        if endpoint is None:
            return
        if endpoint != self._dealer_endpoint:
            if self._dealer is not None:
                self._poller.unregister(self._dealer)
                self._dealer.close(linger=0)
            self._dealer, self._dealer_endpoint = self._socket(zmq.DEALER), endpoint
            self._dealer.connect(endpoint)
            self._poller.register(self._dealer, zmq.POLLIN)
        self._dealer.send_multipart([b"", SNAPSHOT_REQUEST], flags=zmq.NOBLOCK)

    def _accept(self, frames: list, snapshot: bool) -> None:
        buffers = [f.buffer for f in frames]
        now = time.monotonic()
        if snapshot:
            self._pending.extend(self._session.on_snapshot(buffers[1:], now))
        else:
            self._pending.extend(self._session.on_message(buffers, now))


class Subscriber(_SubscriberBase):
    """Blocking iterator over typed messages; a context manager that closes its sockets."""

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Subscriber:
        return self

    def __next__(self) -> Message:
        while not self._pending:
            if self._session.finished:
                self._session.check_snapshot(time.monotonic())
                raise StopIteration
            self._pump()
        return self._pending.popleft()

    def _pump(self) -> None:
        ready = dict(self._poller.poll(self._timeout_ms()))
        self._check_alive(ready)
        for sock, snapshot in ((self._sub, False), (self._dealer, True)):
            for _ in range(_RECV_BATCH if sock in ready else 0):
                try:
                    self._accept(sock.recv_multipart(zmq.NOBLOCK, copy=False), snapshot)
                except zmq.Again:
                    break
        self._request_snapshot()


class AsyncSubscriber(_SubscriberBase):
    """`Subscriber` for asyncio: `async with`, `async for`."""

    _context_class = zmq.asyncio.Context
    _poller_class = zmq.asyncio.Poller

    async def __aenter__(self) -> AsyncSubscriber:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncSubscriber:
        return self

    async def __anext__(self) -> Message:
        while not self._pending:
            if self._session.finished:
                self._session.check_snapshot(time.monotonic())
                raise StopAsyncIteration
            await self._pump()
        return self._pending.popleft()

    async def _pump(self) -> None:
        ready = dict(await self._poller.poll(self._timeout_ms()))
        self._check_alive(ready)
        for sock, snapshot in ((self._sub, False), (self._dealer, True)):
            for _ in range(_RECV_BATCH if sock in ready else 0):
                try:
                    self._accept(await sock.recv_multipart(zmq.NOBLOCK, copy=False), snapshot)
                except zmq.Again:
                    break
        self._request_snapshot()
