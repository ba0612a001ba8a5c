"""What parsing a BAM costs the thread that wants its records: parsed there, or in a reader process
(`streamer.pipeline.parsing`) and handed back pickled. Both of its uses: the daemon's basecall files
(`read_basecall_file`, one file a call) and `streamer call`'s alignment records (`iter_alignments`, streamed).

Reported per alignment record, best of --repeat: the calling thread's CPU time and the wall time; and the
CPU time of unpickling the file's reads (what the pool's result thread then takes of the process's GIL).
Make a BAM with `python benchmarks/bench_call.py --copies 4` (bench-work/ecoli_x4/reads.bam):

    python benchmarks/bench_parsing.py --bam bench-work/ecoli_x4/reads.bam
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

from streamer.daemon.basecall_cache import read_basecall_file
from streamer.io.alignments import AlignmentFilter, iter_alignments
from streamer.pipeline.parsing import ParseProcess


def best(fn, repeat: int) -> tuple[float, float]:
    """The least thread CPU and wall seconds of `repeat` calls."""
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
    n = sum(1 for _ in iter_alignments(args.bam, filt))
    parser = ParseProcess(processes=True)
    try:
        parser.run(read_basecall_file, args.bam, "bam", filt)  # the process started, its imports done
        rows = {
            "basecall file, in the calling thread": lambda: read_basecall_file(args.bam, "bam", filt),
            "basecall file, in a reader process": lambda: parser.run(read_basecall_file, args.bam, "bam", filt),
            "alignment records, in the calling thread": lambda: list(iter_alignments(args.bam, filt)),
            "alignment records, in a reader process": lambda: list(parser.records(args.bam, filt)),
        }
        timed = {label: best(fn, args.repeat) for label, fn in rows.items()}
    finally:
        parser.close()
    print(f"{args.bam}: {n} records")
    for label, (cpu, wall) in timed.items():
        print(f"{label}: the thread's CPU {1e6 * cpu / n:.1f} us a record, wall {1e6 * wall / n:.1f}")
    for label, data in (("basecall file", pickle.dumps(read_basecall_file(args.bam, "bam", filt))),
                        ("alignment records", pickle.dumps(list(iter_alignments(args.bam, filt))))):  # fmt: skip
        print(f"{label}: unpickling {1e6 * best(lambda: pickle.loads(data), args.repeat)[0] / n:.1f} us a record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
