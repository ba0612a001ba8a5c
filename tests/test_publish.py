"""The publisher and its wire protocol, over real loopback sockets on ephemeral ports."""

from __future__ import annotations

import threading

import msgpack
import numpy as np
import pytest
import zmq
from streams import (  # noqa: F401 (no_leaks is a fixture)
    HEARTBEAT, call_batch, freq_batch, local_config, next_of, no_leaks, tsv_rows,
)

from streamer.publish.client import Calls, Gap, Status, Subscriber
from streamer.errors import ConfigError
from streamer_plugins.cpg.calls import CALLS_HEADER, MethCalls, format_calls
from streamer_plugins.texts import Texts
from streamer_plugins.outputs.calls_tsv import read_calls
from streamer_plugins.outputs.methfreq import MethFreq
from streamer.publish import CALL_COLUMNS, FREQ_COLUMNS, Categorical, ProtocolError, Publisher
from streamer.publish.messages import CallBatch, SiteFrequencies, decode_message
from streamer.publish.sink import SiteTables
from streamer.publish.protocol import SCHEMA_VERSION, Header, decode_columns, encode_columns, pack, unpack
from streamer.publish.records import call_columns
from streamer.publish.security import CurveServer, KeyPair, is_loopback

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def test_columns_survive_the_wire():
    columns = {
        "n": np.array([1, -2, 3], dtype=np.int16),
        "x": [0.5, 1.5, 2.5],
        "names": np.array(["a", "b", "a"]),
        "reads": Categorical(["r0", "r1"], np.array([1, 1, 0])),
        "empty_ok": ["", "é", ""],
    }
    decoded = decode_columns(unpack(pack(encode_columns(columns, None))), None)
    assert decoded["n"].dtype == np.int16 and decoded["n"].tolist() == [1, -2, 3]
    assert decoded["n"].flags.aligned
    assert decoded["x"].tolist() == [0.5, 1.5, 2.5]
    assert decoded["names"].tolist() == ["a", "b", "a"]
    assert decoded["reads"].tolist() == ["r1", "r1", "r0"]
    assert decoded["empty_ok"].tolist() == ["", "é", ""]


def test_schema_fixes_dtypes_and_names():
    batch = call_batch(5)
    batch["start"] = batch["start"].astype(np.int32)
    decoded = decode_columns(unpack(pack(encode_columns(batch, CALL_COLUMNS))), CALL_COLUMNS)
    assert decoded["start"].dtype == np.int64
    assert [f for f in CallBatch.__dataclass_fields__] == list(CALL_COLUMNS)
    assert [f for f in SiteFrequencies.__dataclass_fields__] == list(FREQ_COLUMNS)
    with pytest.raises(ValueError, match=r"missing \['sequence'\]"):
        encode_columns({k: v for k, v in batch.items() if k != "sequence"}, CALL_COLUMNS)
    with pytest.raises(ValueError, match="differ in length"):
        encode_columns({**batch, "start": batch["start"][:2]}, CALL_COLUMNS)
    with pytest.raises(TypeError, match="1-D numeric"):
        pack({"a": np.zeros((2, 2))})


def test_other_schema_version_is_refused():
    frame = msgpack.packb({"v": 99, "run": "r", "seq": 1, "t": 0})
    with pytest.raises(ProtocolError, match="schema version 99"):
        Header.decode("status", frame)


@pytest.mark.parametrize("endpoint, local", [
    ("tcp://127.0.0.1:5556", True), ("tcp://127.0.0.2:*", True), ("tcp://[::1]:5556", True),
    ("tcp://localhost:5556", True), ("ipc:///tmp/streamer.sock", True), ("inproc://x", True),
    ("tcp://0.0.0.0:5556", False), ("tcp://*:5556", False), ("tcp://eth0:5556", False),
    ("tcp://192.168.1.20:5556", False), ("tcp://[::]:5556", False), ("epgm://eth0;239.1.1.1:5555", False),
])
def test_loopback_is_recognised(endpoint, local):
    assert is_loopback(endpoint) is local


def test_public_bind_needs_curve_or_an_explicit_insecure_bind():
    with pytest.raises(ConfigError, match=r"refusing to bind tcp://0\.0\.0\.0:\*.*CURVE.*--insecure-bind"):
        Publisher(local_config(endpoints=("tcp://127.0.0.1:*", "tcp://0.0.0.0:*")))
    with pytest.raises(ConfigError, match=r"refusing to bind tcp://\*:\*"):
        Publisher(local_config(snapshot_endpoint="tcp://*:*"))
    with pytest.raises(ConfigError, match="allow-list is empty"):
        Publisher(local_config(curve=CurveServer(KeyPair(*zmq.curve_keypair()), frozenset())))
    with Publisher(local_config(endpoints=("tcp://0.0.0.0:*",), insecure_bind=True)) as pub:
        assert pub.endpoints[0].startswith("tcp://0.0.0.0:")


def test_bind_failure_is_a_config_error():
    with Publisher(local_config()) as first:
        with pytest.raises(ConfigError, match=f"cannot bind {first.endpoints[0]}"):
            Publisher(local_config(endpoints=first.endpoints))


def _recv(sock: zmq.Socket, topic: str) -> list[bytes]:
    while True:
        frames = sock.recv_multipart()
        if frames[0] == topic.encode():
            return frames


def test_frames_carry_topic_header_and_per_topic_sequence():
    with Publisher(local_config(), run_id="run-42") as pub, zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
        sub.rcvtimeo, sub.linger = 5000, 0
        sub.connect(pub.endpoints[0])
        sub.subscribe(b"")
        first_status = _recv(sub, "status")  # sent at once to a new subscriber: no waiting a whole interval
        pub.publish_calls(call_batch(4))
        pub.publish_freq(freq_batch([1, 2], 3, 1))
        pub.publish_calls(call_batch(3, first=10))
        pub.publish_tuning({"advice": "more GPU", "batch_reads": 512})
        pub.publish_run("start", {"flowcell": "FAK00001"})
        received = [_recv(sub, t) for t in ("meth.call", "meth.freq", "meth.call", "tuning", "run")]
    assert all(len(frames) == 3 for frames in received)
    headers = [msgpack.unpackb(f[1]) for f in received]
    assert [h["seq"] for h in headers] == [1, 1, 2, 1, 1]
    assert {h["run"] for h in headers} == {"run-42"} and {h["v"] for h in headers} == {SCHEMA_VERSION}
    assert all(isinstance(h["t"], int) for h in headers)
    calls = decode_message(received[2])
    assert isinstance(calls, Calls) and calls.calls.start.tolist() == [100, 110, 120]
    assert decode_message(received[3]).decision == {"advice": "more GPU", "batch_reads": 512}
    assert decode_message(received[4]).info == {"flowcell": "FAK00001"}
    status = decode_message(first_status)
    assert isinstance(status, Status) and status.heartbeat_interval == HEARTBEAT
    assert status.snapshot == pub.snapshot_endpoint


def test_snapshot_endpoint_serves_state_with_its_sequence_number():
    with Publisher(local_config()) as pub, zmq.Context() as ctx, ctx.socket(zmq.REQ) as req:
        pub.publish_freq(freq_batch([10, 20], called=1, methylated=0))
        pub.publish_freq(freq_batch([20, 30], called=2, methylated=2))
        pub.publish_status({"reads": 7})
        req.rcvtimeo, req.linger = 5000, 0
        req.connect(pub.snapshot_endpoint)
        req.send(b"snapshot")
        topic, header, payload = req.recv_multipart()
    assert topic == b"snapshot" and msgpack.unpackb(header)["seq"] == 2
    body = unpack(payload)
    sites = decode_columns(body["sites"], FREQ_COLUMNS)
    assert sites["start"].tolist() == [10, 20, 30]
    assert sites["called_sites"].tolist() == [1, 2, 2]
    assert sites["called_sites_methylated"].tolist() == [0, 2, 2]
    assert body["counters"] == {"reads": 7}


def _ask_snapshot(pub, ctx) -> tuple[int, dict]:
    with ctx.socket(zmq.REQ) as req:
        req.rcvtimeo, req.linger = 5000, 0
        req.connect(pub.snapshot_endpoint)
        req.send(b"snapshot")
        _, header, payload = req.recv_multipart()
    return msgpack.unpackb(header)["seq"], decode_columns(unpack(payload)["sites"], FREQ_COLUMNS)


def add_rows(freq: MethFreq, rows: list[str], changed: set | None = None) -> None:
    """Calls TSV rows into the table, as the daemon's sink adds a block read back."""
    for block in read_calls([CALLS_HEADER, *rows]):
        freq.add_calls(block.products["calls"], block.ref_names, changed)


def test_snapshots_come_from_the_table_the_owner_keeps():
    """With `serve_sites` there is one table: the owner's changes show in the next snapshot, and
    `publish_freq` sends without keeping a copy."""
    freq = MethFreq()
    row = "chr1\t+\t{0}\t{0}\tr\t{1}\t-1\t-2\t1\t1\tAACGT\n"
    with Publisher(local_config()) as pub, zmq.Context() as ctx:
        pub.serve_sites(SiteTables(freq))
        changed = set()
        add_rows(freq, [row.format(10, "3.0"), row.format(20, "-3.0"), row.format(30, "1.0")], changed)
        assert changed == {("chr1", 10, 10), ("chr1", 20, 20)}  # 30 is below the threshold: not a site
        seq, sites = _ask_snapshot(pub, ctx)
        assert seq == 0 and sites["start"].tolist() == [10, 20]  # changed, not yet announced: already served
        pub.publish_freq(freq_batch([10, 40], called=99, methylated=0))  # sent, but the table is the owner's
        add_rows(freq, [row.format(10, "4.0")])
        seq, sites = _ask_snapshot(pub, ctx)
        assert seq == 1 and sites["start"].tolist() == [10, 20]
        assert sites["called_sites"].tolist() == [2, 1] and sites["called_sites_methylated"].tolist() == [2, 0]
        assert sites["group_sequence"].tolist() == ["AACGT", "AACGT"]


def test_a_full_queue_drops_counts_and_shows_as_a_gap(monkeypatch):
    """The sending thread is held on a batch; two more fit the queue; seven are dropped and counted."""
    size = len(pack(encode_columns(call_batch(50), CALL_COLUMNS)))
    with Publisher(local_config(queue_bytes=3 * size + size // 2, heartbeat_interval=30)) as pub:
        with Subscriber(pub.endpoints[0], ["meth.call", "status"], heartbeat_interval=30) as sub:
            assert isinstance(next(sub), Status)  # sent as the subscription arrived: the subscriber is live
            send, entered, gate = pub._send, threading.Event(), threading.Event()

            def held_send(frames):
                entered.set()
                gate.wait(30)
                return send(frames)

            monkeypatch.setattr(pub, "_send", held_send)
            pub.publish_calls(call_batch(50))  # taken by the sending thread, which then waits at the gate
            assert entered.wait(30)
            for i in range(1, 10):
                pub.publish_calls(call_batch(50, first=i))
            assert pub.stats.dropped == 7
            gate.set()
            pub.publish_status({})  # tells the subscriber the last seq sent: the dropped tail shows
            received = []
            while not (received and isinstance(received[-1], Status)):
                msg = next(sub)
                # the publisher greets each subscription it sees (one per topic) with a status: on a
                # busy machine the second may come after the first was read
                if not (isinstance(msg, Status) and msg.dropped == 0 and not received):
                    received.append(msg)
    assert [type(m) for m in received] == [Calls, Calls, Calls, Gap, Status]
    assert [m.header.seq for m in received[:3]] == [1, 2, 3]
    assert received[3] == Gap("meth.call", first_missing=4, missed=7)
    assert received[4].dropped == 7


def test_close_is_idempotent_and_final():
    pub = Publisher(local_config())
    pub.close()
    pub.close()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish_calls(call_batch(1))
    with Publisher(local_config()) as pub, pytest.raises(ValueError, match="run event"):
        pub.publish_run("paused", {})


def test_batch_calls_publish_as_the_tsv_prints_them():
    rng = np.random.default_rng(3)
    n = 40
    start = np.sort(rng.integers(0, 10_000, n))
    calls = MethCalls(read=np.repeat([0, 2], n // 2), start=start, end=start + rng.integers(0, 9, n),
                      strand=np.where(np.arange(n) % 2, 1, -1).astype(np.int8), llr=rng.normal(0, 6, n),
                      ll_meth=rng.normal(-90, 9, n), ll_unmeth=rng.normal(-90, 9, n),
                      num_motifs=rng.integers(1, 4, n).astype(np.int32),
                      sequence=Texts.of([f"AACG{'T' * k}" for k in rng.integers(0, 5, n)]))
    read_ids, ref_names = ["r-a", "r-b", "r-c"], ["chrI", "chrII", "chrIII"]
    with Publisher(local_config()) as pub, Subscriber(pub.endpoints[0], ["meth.call", "status"]) as sub:
        next_of(sub, Status)
        pub.publish_calls(call_columns(calls, read_ids, ref_names))
        batch = next_of(sub, Calls).calls
    assert "".join(tsv_rows(batch)) == format_calls(calls, read_ids, ref_names)


def test_the_daemons_publish_keys_bind_ipc_beside_tcp_with_their_high_water_mark(tmp_path):
    """`publish.extra_endpoints` and `publish.send_hwm` as `streamer run` builds its publisher."""
    from streamer import config
    from streamer.commands.run import publisher_config

    ipc = f"ipc://{tmp_path}/pub.sock"
    cfg = config.build({"publish.endpoint": "tcp://127.0.0.1:*", "publish.extra_endpoints": [ipc],
                        "publish.send_hwm": 7, "publish.heartbeat_interval": HEARTBEAT}, require=())
    with Publisher(publisher_config(cfg.publish)) as pub:
        assert pub.endpoints[0].startswith("tcp://127.0.0.1:") and pub.endpoints[1] == ipc
        assert pub._pub.sndhwm == 7
        with Subscriber(ipc, ["meth.call", "status"], heartbeat_interval=HEARTBEAT) as sub:
            next_of(sub, Status)
            pub.publish_calls(call_batch(4))
            got = next_of(sub, Calls)
    assert got.calls.start.tolist() == [0, 10, 20, 30]
    # beyond loopback without CURVE: refused with the configuration, naming the key
    with pytest.raises(ConfigError, match=r"publish.extra_endpoints: tcp://0.0.0.0:\* is beyond loopback"):
        config.build({"publish.endpoint": "tcp://127.0.0.1:*", "publish.extra_endpoints": ["tcp://0.0.0.0:*"]},
                     require=())
