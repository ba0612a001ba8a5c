"""CpG calls per second through the publisher to a subscriber, over loopback TCP.

The publisher (this process) encodes batches of calls as the pipeline hands
them over (`records.call_columns` of a `MethCalls`) as fast as the stream
takes them (it waits only while more than 32 MiB are queued, so the figure is
what the stream sustains, with nothing dropped); a subscriber in a second
process decodes them into `Calls` messages. The figure is calls received per
second, from the first batch's publish time to the last batch's arrival. The
stream must never be what limits a run: target >= 1e6 calls/s.

    python benchmarks/zmq_throughput.py [--batch 4096] [--batches 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np

from streamer.publish.client import Calls, RunEvent, Subscriber
from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.texts import Texts
from streamer.publish import Publisher, PublisherConfig
from streamer.publish.records import call_columns

CALLS_PER_READ = 100
BACKLOG_BYTES = 32 << 20


def make_batch(n: int, rng: np.random.Generator) -> tuple[MethCalls, list[str], list[str]]:
    """A batch of n calls on n / CALLS_PER_READ reads, sequences drawn from a pool (sites repeat)."""
    n_reads = max(1, n // CALLS_PER_READ)
    pool = ["".join(rng.choice(list("ACGT"), 5)) + "CG" + "".join(rng.choice(list("ACGT"), 5)) for _ in range(5000)]
    start = np.sort(rng.integers(0, 5_000_000, n))
    llr = rng.normal(0, 5, n)
    calls = MethCalls(
        read=np.repeat(np.arange(n_reads), -(-n // n_reads))[:n],
        start=start,
        end=start + rng.integers(0, 20, n),
        strand=rng.choice(np.array([1, -1], dtype=np.int8), n),
        llr=llr,
        ll_meth=llr - 100.0,
        ll_unmeth=np.full(n, -100.0),
        num_motifs=rng.integers(1, 4, n).astype(np.int32),
        sequence=Texts.of([pool[i] for i in rng.integers(0, len(pool), n)]),
    )
    read_ids = [f"{i:08x}-0a1b-4c2d-8e3f-{i:012x}" for i in range(n_reads)]
    return calls, read_ids, ["chr1"] * n_reads


def subscribe(endpoint: str, ready, results) -> None:
    """Count calls until the run ends; report (calls, messages, missed, first publish ns, last arrival ns)."""
    calls = messages = 0
    first = None
    with Subscriber(endpoint, ["meth.call", "run", "status"], snapshot=False, rcvhwm=100_000) as sub:
        for msg in sub:
            if ready is not None:
                ready.set()
                ready = None
            if isinstance(msg, Calls):
                first = first or msg.header.time_ns
                calls += len(msg.calls)
                messages += 1
                last = time.time_ns()
            elif isinstance(msg, RunEvent) and msg.event == "end":
                break
        results.put((calls, messages, sub.missed.get("meth.call", 0), first, last))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4096, help="calls per message (default 4096)")
    parser.add_argument("--batches", type=int, default=2000, help="messages to send (default 2000)")
    args = parser.parse_args()
    batch = call_columns(*make_batch(args.batch, np.random.default_rng(1)))
    mpc = mp.get_context("spawn")
    ready, results = mpc.Event(), mpc.Queue()
    config = PublisherConfig(endpoints=("tcp://127.0.0.1:*",), snapshot_endpoint=None, sndhwm=100_000,
                             heartbeat_interval=1.0)
    with Publisher(config) as pub:
        child = mpc.Process(target=subscribe, args=(pub.endpoints[0], ready, results))
        child.start()
        ready.wait(30)
        t0 = time.perf_counter()
        for _ in range(args.batches):
            while pub.stats.queued_bytes > BACKLOG_BYTES:  # the stream is saturated: let it drain
                time.sleep(0.001)
            pub.publish_calls(batch)
        publish_s = time.perf_counter() - t0
        pub.publish_run("end", {})
        calls, messages, missed, first, last = results.get(timeout=300)
        child.join()
    seconds = (last - first) / 1e9
    print(f"batch {args.batch} calls, {messages}/{args.batches} messages received ({missed} missed): "
          f"{calls / seconds:,.0f} calls/s end to end (publisher side {args.batch * args.batches / publish_s:,.0f} "
          f"calls/s)")


if __name__ == "__main__":
    main()
