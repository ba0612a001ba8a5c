"""How much a subscriber that cannot keep up slows the pipeline that publishes to it.

A stand-in pipeline (a fixed amount of numpy work per batch, then `publish_calls`
of a batch of calls) runs alternately with no subscriber and with one in another
process that reads one batch per `--pause` seconds. Reported: best-of-N wall
time and CPU time of the publishing process for each, their ratio, and what the
slow subscriber received and counted missed (the two add up to every batch).
Run it on a quiet machine; on a shared one the wall times carry others' load.

    python benchmarks/zmq_slow_subscriber.py [--batches 200] [--calls 1000] [--work-ms 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import zmq

from zmq_throughput import make_batch

from streamer.publish.client import Calls, Gap, Status, Subscriber
from streamer.publish import Publisher, PublisherConfig
from streamer.publish.records import call_columns

SOCKET_BUFFER = 1 << 16  # small kernel buffers: the subscriber overflows after a few batches, not megabytes


def slow_subscriber(endpoint: str, total: int, pause: float, ready, results) -> None:
    with zmq.Context() as ctx:
        ctx.setsockopt(zmq.RCVBUF, SOCKET_BUFFER)
        with Subscriber(endpoint, ["meth.call", "status"], rcvhwm=4, context=ctx) as sub:
            received = gaps = 0
            for msg in sub:
                if isinstance(msg, Status):
                    ready.set()
                    if msg.last_seq.get("meth.call") == total:
                        break
                elif isinstance(msg, Gap):
                    gaps += msg.missed if msg.topic == "meth.call" else 0
                elif isinstance(msg, Calls):
                    received += 1
                    time.sleep(pause)
            results.put((received, sub.missed.get("meth.call", 0), gaps))


def pipeline(pub: Publisher, batch: dict, batches: int, work_s: float) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        end = time.perf_counter() + work_s
        while time.perf_counter() < end:  # the pipeline's own work, on this thread
            pass
        pub.publish_calls(batch)
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--calls", type=int, default=1000, help="calls per batch (default 1000)")
    parser.add_argument("--work-ms", type=float, default=3.0, help="pipeline work per batch (default 3 ms)")
    parser.add_argument("--pause", type=float, default=0.02, help="subscriber's seconds per batch (default 0.02)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    batch = call_columns(*make_batch(args.calls, np.random.default_rng(1)))
    config = PublisherConfig(endpoints=("tcp://127.0.0.1:*",), snapshot_endpoint=None, sndhwm=4,
                             heartbeat_interval=0.5, linger=0)
    mpc = mp.get_context("spawn")
    alone, slow, counts = [], [], []
    for _ in range(args.rounds):
        with Publisher(config) as pub:
            alone.append(pipeline(pub, batch, args.batches, args.work_ms / 1e3))
        with zmq.Context() as ctx:
            ctx.setsockopt(zmq.SNDBUF, SOCKET_BUFFER)
            with Publisher(config, context=ctx) as pub:
                ready, results = mpc.Event(), mpc.Queue()
                child = mpc.Process(target=slow_subscriber,
                                    args=(pub.endpoints[0], args.batches, args.pause, ready, results))
                child.start()
                ready.wait(30)
                slow.append(pipeline(pub, batch, args.batches, args.work_ms / 1e3))
                pub.publish_status({})  # tells the subscriber the last seq without waiting for a heartbeat
                counts.append(results.get(timeout=60))
                child.join()
    (wall_a, cpu_a), (wall_s, cpu_s) = np.min(alone, axis=0), np.min(slow, axis=0)
    print(f"{args.batches} batches of {args.calls} calls, {args.work_ms:g} ms of work each, best of {args.rounds}:")
    print(f"  no subscriber:   wall {wall_a:.4f} s, CPU {cpu_a:.4f} s")
    print(f"  slow subscriber: wall {wall_s:.4f} s, CPU {cpu_s:.4f} s")
    print(f"  slowdown: wall {100 * (wall_s / wall_a - 1):+.2f}%, CPU {100 * (cpu_s / cpu_a - 1):+.2f}%")
    print(f"  slow subscriber (received, missed, sum of gaps) per round: {counts}")


if __name__ == "__main__":
    main()
