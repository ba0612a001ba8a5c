"""The daemon's cost of taking in a basecall BAM: parsed in its own thread, or in a reader process
(`streamer.daemon.basecall_reader`) and handed back pickled.

Reported per alignment record: the calling thread's CPU time and the wall time (best of --repeat), and
the CPU time the process spends unpickling one file's reads (what the pool's result thread takes of the
daemon's GIL). Make a BAM with `python benchmarks/bench_call.py --copies 4` (bench-work/ecoli_x4/reads.bam):

    python benchmarks/bench_basecall_reader.py --bam bench-work/ecoli_x4/reads.bam
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

from streamer.daemon.basecall_cache import read_basecall_file
from streamer.daemon.basecall_reader import BasecallReader
from streamer.io.alignments import AlignmentFilter


def best(fn, repeat: int) -> tuple[float, float]:
    cpu, wall = [], []
    for _ in range(repeat):
        t, w = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(time.thread_time() - t)
        wall.append(time.perf_counter() - w)
    return min(cpu), min(wall)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bam", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    filt = AlignmentFilter()
    reads = read_basecall_file(args.bam, "bam", filt)
    n = sum(len(bc.records or ()) for bc in reads.values())
    reader = BasecallReader(processes=True)
    try:
        reader(args.bam, "bam", filt)  # the process started, its imports done
        here = best(lambda: read_basecall_file(args.bam, "bam", filt), args.repeat)
        there = best(lambda: reader(args.bam, "bam", filt), args.repeat)
    finally:
        reader.close()
    data = pickle.dumps(reads)
    unpickle = best(lambda: pickle.loads(data), args.repeat)[0]
    print(f"{args.bam}: {len(reads)} reads, {n} records")
    print(f"in the daemon's thread: the thread's CPU {1e6 * here[0] / n:.1f} us a record, wall {1e6 * here[1] / n:.1f}")
    print(f"in a reader process: the thread's CPU {1e6 * there[0] / n:.1f} us a record, wall {1e6 * there[1] / n:.1f}; "
          f"unpickling {1e6 * unpickle / n:.1f} us a record (the pool's result thread)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
