"""The subscriber: its decisions without sockets, then end to end over loopback."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from streams import HEARTBEAT, call_batch, freq_batch, local_config, next_of, no_leaks  # noqa: F401 (fixture)

from streamer.publish.client import (
    AsyncSubscriber,
    Calls,
    FreqUpdate,
    Gap,
    PublisherLost,
    RunEvent,
    Snapshot,
    Status,
    Subscriber,
    _Session,
)
from streamer.commands import keys, subscribe
from streamer.errors import ConfigError
from streamer.publish import CALL_COLUMNS, FREQ_COLUMNS, Publisher
from streamer.publish.protocol import SCHEMA_VERSION, encode_columns, pack
from streamer.publish.security import CurveClient, CurveServer, KeyPair, load_public_keys, load_secret_keys

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


# -- the session's decisions, fed hand-made frames --------------------------------------------

def _frames(topic: str, seq: int, body: dict, run: str = "r1") -> list[bytes]:
    return [topic.encode(), msgpack.packb({"v": SCHEMA_VERSION, "run": run, "seq": seq, "t": 0}), pack(body)]


def _calls(seq: int, run: str = "r1") -> list[bytes]:
    return _frames("meth.call", seq, encode_columns(call_batch(2), CALL_COLUMNS), run)


def _freq(seq: int, starts, called: int) -> list[bytes]:
    return _frames("meth.freq", seq, encode_columns(freq_batch(starts, called, 0), FREQ_COLUMNS))


def _snapshot(seq: int, starts, called: int) -> list[bytes]:
    body = {"counters": {}, "sites": encode_columns(freq_batch(starts, called, 0), FREQ_COLUMNS)}
    return [b"snapshot", *_frames("snapshot", seq, body)[1:]]


def _status(seq: int, last_seq: dict | None = None, state: str = "running",
            snapshot: str | None = "tcp://127.0.0.1:9") -> list[bytes]:
    body = {"state": state, "heartbeat_interval": 0.5, "snapshot": snapshot, "counters": {},
            "publisher": {"sent": 0, "dropped": 0, "queued_bytes": 0}, "last_seq": last_seq or {}}
    return _frames("status", seq, body)


def _session(topics=("meth.call",), follow_sites=False, snapshot_endpoint=None, endpoint="tcp://127.0.0.1:8"):
    return _Session(endpoint, topics, follow_sites, snapshot_endpoint, 2.0, 3, now=0.0)


def _kinds(messages) -> list[str]:
    return [type(m).__name__ for m in messages]


def test_gaps_are_counted_exactly_and_repeats_ignored():
    s = _session()
    assert _kinds(s.on_message(_calls(5), 1.0)) == ["Calls"]  # the first message sets the baseline
    assert _kinds(s.on_message(_calls(6), 1.0)) == ["Calls"]
    out = s.on_message(_calls(9), 1.0)
    assert out[0] == Gap("meth.call", first_missing=7, missed=2) and _kinds(out) == ["Gap", "Calls"]
    assert s.on_message(_calls(9), 1.0) == []
    assert _kinds(s.on_message(_calls(10), 1.0)) == ["Calls"]
    assert s.missed == {"meth.call": 2}


def test_a_heartbeat_reveals_losses_at_the_tail_of_a_burst():
    s = _session()
    s.on_message(_calls(1), 1.0)
    assert s.on_message(_status(1, {"meth.call": 4, "tuning": 9}), 1.0) == [Gap("meth.call", 2, 3)]
    assert _kinds(s.on_message(_calls(5), 1.0)) == ["Calls"]
    assert s.missed == {"meth.call": 3}  # tuning is not followed, so not counted


def test_a_joiner_counts_only_what_it_missed_after_joining():
    s = _session()
    assert s.on_message(_status(40, {"meth.call": 7}), 1.0) == []
    assert _kinds(s.on_message(_calls(8), 1.0)) == ["Calls"]
    assert _kinds(s.on_message(_calls(10), 1.0)) == ["Gap", "Calls"]
    assert s.missed == {"meth.call": 1}


def test_unknown_topics_are_ignored_but_prove_liveness():
    s = _session(topics=("",))
    assert s.on_message(_frames("meth.hydroxy", 1, {"anything": 1}), 4.0) == []
    assert s.last_seen == 4.0


def test_a_new_run_starts_the_sequences_again():
    s = _session()
    s.on_message(_calls(50, run="r1"), 1.0)
    assert _kinds(s.on_message(_calls(1, run="r2"), 1.0)) == ["Calls"]
    assert s.missed == {}


def test_liveness_follows_the_publishers_heartbeat_interval_and_close():
    s = _session(topics=("status",))
    assert s.deadline == 6.0  # 3 x the assumed 2 s until the publisher says otherwise
    assert _kinds(s.on_message(_status(1), 10.0)) == ["Status"]
    assert s.deadline == 11.5 and not s.finished
    s.on_message(_status(2, state="closed"), 10.2)
    assert s.finished


def test_snapshot_then_updates_then_resync_after_a_gap():
    s = _session(topics=("meth.freq",), follow_sites=True)
    assert s.on_message(_freq(3, [1], called=1), 0.1) == []  # held until the snapshot
    assert s.take_request() is None  # no status yet: our subscription may not be live
    s.on_message(_status(1), 0.1)
    assert s.take_request() == "tcp://127.0.0.1:9" and s.take_request() is None
    s.on_message(_freq(4, [2], called=4), 0.2)
    out = s.on_snapshot(_snapshot(3, [1, 2], called=3), 0.3)
    assert _kinds(out) == ["Snapshot", "FreqUpdate"] and out[1].header.seq == 4  # update 3 is in the snapshot
    assert s.frequencies.sites() == {("hmm", "chr1", 1, 2, ".", "m"): (1, 3, 0, "ACGT", 3, 0, 0, 0, 0, 0),
                                      ("hmm", "chr1", 2, 3, ".", "m"): (1, 4, 0, "ACGT", 4, 0, 0, 0, 0, 0)}
    assert s.on_message(_freq(6, [1], called=9), 0.4) == [Gap("meth.freq", 5, 1)]
    assert s.take_request() == "tcp://127.0.0.1:9"
    s.on_message(_freq(7, [5], called=1), 0.4)
    out = s.on_snapshot(_snapshot(6, [1], called=9), 0.5)  # holds update 6 already
    assert _kinds(out) == ["Snapshot", "FreqUpdate"] and out[1].header.seq == 7
    assert s.frequencies.sites() == {("hmm", "chr1", 1, 2, ".", "m"): (1, 9, 0, "ACGT", 9, 0, 0, 0, 0, 0),
                                      ("hmm", "chr1", 5, 6, ".", "m"): (1, 1, 0, "ACGT", 1, 0, 0, 0, 0, 0)}


def test_without_a_snapshot_server_held_updates_apply_at_the_first_status():
    s = _session(topics=("meth.freq",), follow_sites=True)
    s.on_message(_freq(3, [1], called=1), 0.1)
    assert _kinds(s.on_message(_status(1, snapshot=None), 0.2)) == ["FreqUpdate"]
    assert s.take_request() is None and len(s.frequencies) == 1


def test_a_wildcard_snapshot_address_is_reached_through_the_subscribed_host():
    s = _session(topics=("meth.freq",), follow_sites=True, endpoint="tcp://10.1.2.3:5556")
    s.on_message(_status(1, snapshot="tcp://0.0.0.0:5557"), 0.1)
    assert s.take_request() == "tcp://10.1.2.3:5557"
    s = _session(topics=("meth.freq",), follow_sites=True, snapshot_endpoint="ipc:///run/snap")
    s.on_message(_status(1, snapshot="tcp://0.0.0.0:5557"), 0.1)
    assert s.take_request() == "ipc:///run/snap"


# -- end to end over loopback --------------------------------------------------------------------

def test_every_call_arrives_in_order_and_unchanged():
    batches = [call_batch(100, first=i) for i in range(200)]
    with Publisher(local_config()) as pub, Subscriber(pub.endpoints[0], ["meth.call", "status"]) as sub:
        next_of(sub, Status)
        for batch in batches:
            pub.publish_calls(batch)
        received = [next_of(sub, Calls) for _ in batches]
        assert sub.missed == {}
    assert [m.header.seq for m in received] == list(range(1, 201))
    for sent, got in zip(batches, received):
        assert np.array_equal(got.calls.start, sent["start"])
        assert np.array_equal(got.calls.log_lik_ratio, sent["log_lik_ratio"])
        assert got.calls.sequence.tolist() == sent["sequence"]
        assert got.calls.read_name.tolist() == [sent["read_name"].values[c] for c in sent["read_name"].codes]


def _sites_at(sub: Subscriber, seq: int) -> dict:
    """The subscriber's table once it has applied meth.freq update `seq`."""
    for msg in sub:
        if isinstance(msg, (FreqUpdate, Snapshot)) and msg.header.seq >= seq:
            return sub.frequencies.sites()
    raise AssertionError("stream ended")


def test_a_late_joiner_ends_with_the_same_frequencies():
    rng = np.random.default_rng(7)
    updates = [freq_batch(rng.choice(200, 20, replace=False), called=i, methylated=i // 2) for i in range(1, 31)]
    with Publisher(local_config()) as pub, Subscriber(pub.endpoints[0], ["meth.freq"]) as early:
        next_of(early, Snapshot)
        for update in updates[:15]:
            pub.publish_freq(update)
        with Subscriber(pub.endpoints[0], ["meth.freq"]) as late:
            assert next_of(late, Snapshot).header.seq == 15  # joined mid-run
            for update in updates[15:]:
                pub.publish_freq(update)
            assert _sites_at(late, 30) == _sites_at(early, 30)
            assert len(late.frequencies) > 150 and late.missed == early.missed == {}


_STALLED_READER = """
import sys
import zmq
from streamer.publish.client import Calls, Gap, Status, Subscriber
total = int(sys.argv[1])
endpoint = sys.stdin.readline().strip()
with zmq.Context() as ctx:
    ctx.setsockopt(zmq.RCVBUF, 1 << 16)
    with Subscriber(endpoint, ["meth.call", "status"], rcvhwm=4, context=ctx) as sub:
        for msg in sub:  # connected once a heartbeat comes through
            if isinstance(msg, Status):
                break
        print("ready", flush=True)
        sys.stdin.readline()  # stalled while the pipeline publishes everything
        received = gaps = 0
        for msg in sub:
            if isinstance(msg, Status):
                if msg.last_seq.get("meth.call") == total:
                    break  # every batch was either received or is counted missed
            elif isinstance(msg, Gap):
                gaps += msg.missed if msg.topic == "meth.call" else 0
            else:
                received += 1
        print(received, sub.missed.get("meth.call", 0), gaps, flush=True)
"""


def test_a_stalled_subscriber_does_not_hold_the_pipeline_and_knows_what_it_missed():
    """A subscriber process (as a dashboard would be) that reads nothing while the pipeline
    publishes 40 batches: publishing must not wait for it (the loop ends while the subscriber
    is stalled; waiting would never end), and once it reads again it counts exactly what it
    missed. Small socket buffers make 40 batches of 1000 calls overflow for certain, whatever
    the machine's load; the cost in wall time of a slow subscriber is measured by
    benchmarks/zmq_slow_subscriber.py."""
    batches = [call_batch(1000, first=i) for i in range(40)]
    reader = subprocess.Popen([sys.executable, "-c", _STALLED_READER, str(len(batches))], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        with zmq.Context() as ctx:
            ctx.setsockopt(zmq.SNDBUF, 1 << 16)
            with Publisher(local_config(sndhwm=4, heartbeat_interval=0.05), context=ctx) as pub:
                reader.stdin.write(pub.endpoints[0] + "\n")
                reader.stdin.flush()
                assert reader.stdout.readline() == "ready\n"
                t0 = time.monotonic()
                for batch in batches:
                    pub.publish_calls(batch)
                assert time.monotonic() - t0 < 60  # done while nobody read
                reader.stdin.write("go\n")
                reader.stdin.flush()
                line = reader.stdout.readline()  # heartbeats carry the last sequence number to it
        received, missed, gaps = map(int, line.split())
        assert received + missed == len(batches)  # exact: nothing lost without being counted
        assert missed == gaps > 0
    finally:
        reader.kill()
        reader.wait()
        reader.stdin.close()
        reader.stdout.close()


_CHILD = """
import sys, time
from streamer.publish import Publisher, PublisherConfig
pub = Publisher(PublisherConfig(endpoints=("tcp://127.0.0.1:*",), snapshot_endpoint=None,
                                heartbeat_interval=float(sys.argv[1])))
print(pub.endpoints[0], flush=True)
time.sleep(60)
"""


def test_a_killed_publisher_is_lost_within_three_heartbeats():
    interval = 0.2
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(interval)], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = child.stdout.readline().strip()
        with Subscriber(endpoint, ["status"], heartbeat_interval=5) as sub:
            next_of(sub, Status)
            time.sleep(interval / 2)  # die between heartbeats
            child.kill()
            killed = time.monotonic()
            with pytest.raises(PublisherLost, match="3 heartbeat intervals"):
                for _ in sub:
                    pass
            lost_after = time.monotonic() - killed
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert 1.5 * interval <= lost_after <= 3 * interval + 0.05  # 50 ms of scheduling slack


def test_a_closing_publisher_ends_the_iteration():
    with Publisher(local_config()) as pub, Subscriber(pub.endpoints[0], ["run", "status"]) as sub:
        next_of(sub, Status)
        pub.publish_run("end", {"reads": 3})
        pub.close()
        rest = list(sub)
    assert [(m.event, m.info) for m in rest if isinstance(m, RunEvent)] == [("end", {"reads": 3})]
    assert rest[-1].state == "closed"


def test_curve_admits_only_allowed_keys_even_on_a_public_address():
    server, alice, mallory = (KeyPair(*zmq.curve_keypair()) for _ in range(3))
    config = local_config(endpoints=("tcp://0.0.0.0:*",), snapshot_endpoint="tcp://0.0.0.0:*",
                          curve=CurveServer(server, frozenset({alice.public})))
    with Publisher(config) as pub:
        endpoint = pub.endpoints[0].replace("0.0.0.0", "127.0.0.1")
        pub.publish_freq(freq_batch([1, 2], called=2, methylated=1))
        for stranger in (CurveClient(mallory, server.public), None):
            with Subscriber(endpoint, curve=stranger, heartbeat_interval=0.1) as sub:
                with pytest.raises(PublisherLost):  # not one message, not even a heartbeat
                    next(sub)
        with Subscriber(endpoint, ["meth", "status"], curve=CurveClient(alice, server.public)) as sub:
            assert len(next_of(sub, Snapshot).sites) == 2  # the snapshot endpoint is guarded and reachable
            pub.publish_calls(call_batch(3))
            assert len(next_of(sub, Calls).calls) == 3


def test_the_asyncio_subscriber_joins_and_follows():
    async def follow(pub: Publisher) -> tuple[Snapshot, Calls]:
        async with AsyncSubscriber(pub.endpoints[0], ["meth", "status"], heartbeat_interval=HEARTBEAT) as sub:
            async for msg in sub:
                if isinstance(msg, Snapshot):
                    snapshot = msg
                    pub.publish_calls(call_batch(4))
                elif isinstance(msg, Calls):
                    return snapshot, msg

    with Publisher(local_config()) as pub:
        pub.publish_freq(freq_batch([7], called=1, methylated=1))
        snapshot, calls = asyncio.run(follow(pub))
    assert snapshot.sites.start.tolist() == [7] and snapshot.sites.methylated_frequency.tolist() == [1.0]
    assert len(calls.calls) == 4


def _parse(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def test_subscribe_prints_json_lines_until_the_publisher_closes(capsys):
    with Publisher(local_config()) as pub:
        def drive() -> None:
            for i in range(15):
                pub.publish_calls(call_batch(2, first=i))
                time.sleep(0.02)
            pub.close()

        driver = threading.Thread(target=drive)
        driver.start()
        args = _parse(subscribe, [pub.endpoints[0], "--topic", "meth.call", "--heartbeat-interval", "0.1"])
        assert subscribe.run(args) == 0
        driver.join()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines and {line["topic"] for line in lines} == {"meth.call"}
    assert lines[-1]["seq"] == 15 and [line["seq"] for line in lines] == sorted(line["seq"] for line in lines)
    assert lines[-1]["calls"]["read_name"] == ["read14a", "read14b"]


def test_keys_are_generated_listed_and_never_overwritten(tmp_path, capsys):
    for name in ("server", "alice"):
        assert keys.run(_parse(keys, ["--dir", str(tmp_path), "generate", name])) == 0
    assert os.stat(tmp_path / "server.key_secret").st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="already exists"):
        keys.run(_parse(keys, ["--dir", str(tmp_path), "generate", "alice"]))
    capsys.readouterr()
    keys.run(_parse(keys, ["--dir", str(tmp_path), "list"]))
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(name, kind) for name, _, kind in listed] == [("alice", "secret"), ("server", "secret")]
    assert load_secret_keys(tmp_path / "server.key_secret").public.decode() == listed[1][1]
    assert load_public_keys([tmp_path]) == {listed[0][1].encode(), listed[1][1].encode()}
