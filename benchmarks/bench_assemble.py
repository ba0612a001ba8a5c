"""The assembler's work alone: `streamer call`'s batches of a replicated set, their signal read once
by the reader tasks (`load_chunk`) in this process, then each batch assembled (`Planned.assemble`:
the join with the reference and the packing into a `ReadBatch`) again and again on one thread,
best of --reps. The same batches for every tree the script runs from, so two checkouts compare.

    python benchmarks/bench_assemble.py --rep bench-work/e2e/x8 --genome bench-work/e2e/ref.fa -K 512 -B 2500000

`--rep` is a folder `bench_end_to_end.py --copies N` replicated (reads.bam, reads.fasta, pod5/, blow5/, fast5/).
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Executor, Future
from pathlib import Path

from streamer.io.alignments import AlignmentFilter, iter_alignments
from streamer.io.bamreads import open_basecalls
from streamer.io.index import open_index
from streamer.io.reference import Reference
from streamer.pipeline.batching import BatchLimits, plan_batches
from streamer.pipeline.planned import Planned, Reading


class _Here(Executor):
    """The reader tasks run at submission, in this thread: their results wait for the assembler."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done: Future = Future()
        done.set_result(fn(*args, **kwargs))
        return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rep", type=Path, required=True, help="a replicated folder of bench_end_to_end.py")
    ap.add_argument("--genome", type=Path, required=True, help="the reference FASTA")
    ap.add_argument("--format", choices=("pod5", "blow5", "fast5"), default="pod5")
    ap.add_argument("-K", type=int, default=512, help="most records a batch [%(default)s]")
    ap.add_argument("-B", type=int, default=2_500_000, help="most bases a batch [%(default)s]")
    ap.add_argument("--reps", type=int, default=5, help="timed passes over every batch [%(default)s]")
    args = ap.parse_args()
    reads = args.rep / "reads.fasta" if args.format == "fast5" else args.rep / args.format / "reads.fasta"
    index = open_index(reads, None)
    with Reference(args.genome) as ref, open_basecalls(reads) as basecalls:
        reading = Reading(ref, _Here())
        jobs = [reading.job(pending, skipped) for pending, skipped in
                plan_batches(iter_alignments(args.rep / "reads.bam", AlignmentFilter()), basecalls, index,
                             BatchLimits(args.K, args.B))]  # fmt: skip
        for job in jobs:
            job.start()
        read = [job.tasks for job in jobs]

        def assemble_all(jobs: list[Planned]) -> float:
            t0 = time.perf_counter()
            for job, tasks in zip(jobs, read):
                job.tasks = list(tasks)
                job.assemble()
            return time.perf_counter() - t0

        assemble_all(jobs)  # the kernels loaded from the cache
        best = min(assemble_all(jobs) for _ in range(args.reps))
    records = sum(len(job.pending) for job in jobs)
    print(f"{args.format}, -K {args.K} -B {args.B}: {len(jobs)} batches, {records} records assembled in {best:.3f} s "
          f"(best of {args.reps}), {best / len(jobs) * 1e3:.2f} ms a batch")


if __name__ == "__main__":
    main()
