"""The result stream's faults: a subscriber that reads only after the publisher has gone still learns
exactly what it missed; a snapshot request nobody answers ends in a clear error; malformed snapshot
requests cannot fill the log."""

from __future__ import annotations

import logging
import time

import pytest
import zmq

from streamer.publish.client import Calls, Gap, SnapshotUnanswered, Status, Subscriber
from streamer.publish import Publisher

from streams import call_batch, local_config, next_of


def test_a_subscriber_reading_after_the_publisher_exited_counts_what_it_missed():
    """The publisher drops messages it cannot queue (a send queue of a few KiB); the subscriber reads
    nothing until the publisher has closed, then counts exactly the call messages it did not get."""
    total = 40
    with Publisher(local_config(queue_bytes=1 << 14, linger=2.0)) as pub:
        sub = Subscriber(pub.endpoints[0], ["meth.call", "status"], snapshot=False)
        try:
            next_of(sub, Status)  # subscribed: from here on it reads nothing until the publisher is gone
            for i in range(total):
                pub.publish_calls(call_batch(500, first=i))
            pub.close()
            dropped = pub.stats.dropped
            got, gaps, closed = 0, 0, None
            for msg in sub:
                if isinstance(msg, Calls):
                    got += 1
                elif isinstance(msg, Gap) and msg.topic == "meth.call":
                    gaps += msg.missed
                elif isinstance(msg, Status):
                    closed = msg
        finally:
            sub.close()
    assert closed is not None and closed.state == "closed" and closed.last_seq["meth.call"] == total
    assert 0 < dropped < total  # the case under test: some lost, some not
    assert sub.missed.get("meth.call") == gaps == total - got == dropped


def test_a_snapshot_request_never_answered_ends_in_a_clear_error():
    with zmq.Context() as ctx:
        silent = ctx.socket(zmq.ROUTER)  # takes requests, never answers
        silent.bind("tcp://127.0.0.1:*")
        try:
            endpoint = silent.last_endpoint.decode()
            with Publisher(local_config(snapshot_endpoint=None)) as pub, \
                    Subscriber(pub.endpoints[0], ["meth.freq"], snapshot_endpoint=endpoint,
                               heartbeat_interval=0.2) as sub:
                t0 = time.monotonic()
                with pytest.raises(SnapshotUnanswered, match=f"snapshot request to {endpoint} was not answered "
                                                             r"within 0.6 s \(3 heartbeat intervals\)"):
                    for _ in sub:
                        pass
                assert time.monotonic() - t0 < 5
        finally:
            silent.close(linger=0)


def test_malformed_snapshot_requests_are_warned_about_once_a_minute(caplog):
    caplog.set_level(logging.WARNING, logger="streamer.publish")
    with Publisher(local_config()) as pub, zmq.Context() as ctx:
        bad = ctx.socket(zmq.DEALER)
        bad.connect(pub.snapshot_endpoint)
        try:
            for _ in range(200):
                bad.send_multipart([b"", b"garbage"])
            good = ctx.socket(zmq.REQ)
            good.connect(pub.snapshot_endpoint)
            good.send(b"snapshot")  # answered after the 200 bad ones: all of them were read
            assert good.poll(5000) and good.recv_multipart()[0] == b"snapshot"
            good.close(linger=0)
        finally:
            bad.close(linger=0)
    warnings = [r for r in caplog.records if "malformed snapshot request" in r.getMessage()]
    assert len(warnings) == 1
