"""Memory and update cost of the per-site frequency table(s) behind meth-freq.tsv and snapshots.

Feeds synthetic meth.tsv rows (CpG sites every 100 bp over 22 contigs, `--depth` calls a
site) through the daemon's table and the publisher's snapshot state the way the daemon does
(the `methfreq` sink's `on_batch`, then `PublishSink.publish_sites` -> `Publisher.publish_freq`), and reports bytes
per site held by the tables and seconds per million calls for the update path. Group sequences
come from 1024 contexts; a genome has up to ~1 M (5 bases each side of the CG), which the
table holds once each (~0.1 GB) however many sites share them.

    python benchmarks/bench_site_table.py --sites 1000000 --depth 4
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc

from streamer.publish import Publisher, PublisherConfig
from streamer.publish.sink import PublishSink
from streamer_plugins.cpg.calls import CALLS_HEADER
from streamer_plugins.outputs.calls_tsv import read_calls
from streamer_plugins.outputs.sinks import MethFreqTable


def call_rows(n_sites: int, depth: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    contigs = [f"chr{i}" for i in range(1, 23)]
    per = -(-n_sites // len(contigs))
    rows = []
    for _ in range(depth):
        for i in range(n_sites):
            chrom, pos = contigs[i // per], 10_000 + 100 * (i % per)
            seq = "".join(rng.choice("ACGT") for _ in range(5))
            llr = rng.uniform(-8, 8)
            rows.append(f"{chrom}\t+\t{pos}\t{pos}\tr{i}\t{llr:.2f}\t-1.0\t-2.0\t1\t1\t{seq}CG{seq[::-1]}\n")
    return rows


class _Stub:
    """The daemon's table and publishing, as the daemon wires them."""

    def __init__(self, publisher):
        self.table = MethFreqTable(track_changes=True)
        self.freq = self.table.table
        self.publish = PublishSink(publisher, self.freq, self.table.changed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, default=1_000_000)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=20_000, help="calls per batch")
    ap.add_argument("--memory", action="store_true", help="trace allocations (slows the updates: time without)")
    args = ap.parse_args()
    rows = call_rows(args.sites, args.depth)
    config = PublisherConfig(endpoints=("tcp://127.0.0.1:*",), snapshot_endpoint="tcp://127.0.0.1:*",
                             queue_bytes=1 << 40)
    with Publisher(config) as pub:
        gc.collect()
        if args.memory:
            tracemalloc.start()
        stub = _Stub(pub)
        t_add = t_pub = 0.0
        for i in range(0, len(rows), args.batch):
            block = rows[i:i + args.batch]
            t0 = time.perf_counter()
            stub.table.on_batch(next(read_calls([CALLS_HEADER, *block], block=len(block))))
            t1 = time.perf_counter()
            stub.publish.publish_sites()
            t_pub += time.perf_counter() - t1
            t_add += t1 - t0
        while pub.stats.queued_bytes:
            time.sleep(0.05)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        t0 = time.perf_counter()
        snap = stub.freq.snapshot()
        t_snap = time.perf_counter() - t0
    n, calls = len(stub.freq.sites), len(rows)
    print(f"sites {n}, calls {calls}, batches of {args.batch}")
    if args.memory:
        per_site = held / n
        print(f"tables held: {held / 2**20:.0f} MiB = {per_site:.0f} bytes/site "
              f"({per_site * 28e6 / 2**30:.1f} GiB at 28 M sites)")
        return
    print(f"daemon table update: {t_add / calls * 1e6:.2f} s per M calls")
    print(f"freq update + publish: {t_pub / calls * 1e6:.2f} s per M calls")
    print(f"snapshot(): {t_snap / n * 1e6:.2f} s per M sites ({len(snap)} sites)")


if __name__ == "__main__":
    main()
