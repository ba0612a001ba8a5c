"""streamer's aligner against minimap2 (mappy, map-ont) on simulated (or real) reads: agreement,
wrong placements against the simulator's truth, throughput, index build time, memory.

Agreement: of the reads mappy maps with MAPQ >= 20, the share whose primary from the engine is on the
same contig and strand and overlaps mappy's by >= 90% of the shorter span. Wrong: primaries at
MAPQ >= 20 that overlap none of the read's true slices by half (reads with a truth TSV only).

    python -m streamer.align.simulate genome --size 200M -o g.fa
    python -m streamer.align.simulate reads -g g.fa -n 10000 --profile r9 -o r9.fq
    python benchmarks/bench_align.py -g g.fa -r r9.fq --engine gpu --threads 2 --mappy-threads 16

`--seeder MODULE:FACTORY` seeds with FACTORY(contigs) instead of the FM-index (e.g. the tests'
brute-force `tests.align_seeder:KmerSeeder.of`, for a small reference).
"""

from __future__ import annotations

import argparse
import importlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from streamer.align.engine import SeedAligner, fm_aligner
from streamer.align.genome import read_fasta
from streamer.align.records import agree, primary_of
from streamer.align.simulate import read_truth
from streamer.daemon.aligner import ReadAligner
from streamer.io.alignments import AlignmentFilter
from streamer.io.fastx import iter_fastx


def _span(rec) -> str:
    if rec is None:
        return "unmapped"
    strand = "-" if rec.is_reverse else "+"
    return f"{rec.reference_name}:{rec.reference_start}-{rec.reference_end}{strand} q{rec.mapping_quality}"


def _wrong(rec, rows) -> bool:
    """A confident primary on none of the read's true slices."""
    if rec is None or rec.mapping_quality < 20:
        return False
    return not any(rec.reference_name == ctg and rec.is_reverse == (strand == "-") and
                   min(rec.reference_end, end) - max(rec.reference_start, start) > 0.5 * min(end - start,
                                                                                           rec.reference_length)
                   for _, _, ctg, start, end, strand, _, _ in rows)


def _seeded(spec: str, genome: Path, threads: int) -> SeedAligner:
    module, _, factory = spec.partition(":")
    make = importlib.import_module(module)
    for part in factory.split("."):
        make = getattr(make, part)
    contigs = read_fasta(genome)
    return SeedAligner(contigs, make(contigs), AlignmentFilter(), threads=threads)


def _gpu_mb() -> float | None:
    """Device memory this process holds (nvidia-smi), or None where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    mine = [float(mb) for pid, mb in (line.split(",") for line in out.splitlines() if "," in line)
            if int(pid) == os.getpid()]  # fmt: skip
    return sum(mine) if mine else None


def _timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t


def _in_batches(aligner, reads, size: int):
    return [recs for i in range(0, len(reads), size) for recs in aligner.records_all(reads[i:i + size])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-g", "--genome", type=Path, required=True)
    ap.add_argument("-r", "--reads", type=Path, required=True)
    ap.add_argument("--truth", type=Path, help="the simulator's truth TSV [READS with .truth.tsv, if there]")
    ap.add_argument("--engine", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--seeder", help="MODULE:FACTORY making a seeder from the contigs, instead of the FM-index")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of streamer's engine [2]")
    ap.add_argument("--mappy-threads", type=int, default=16, help="threads of mappy [16]")
    ap.add_argument("--same-as-cpu", action="store_true",
                    help="also align with the cpu engine and count the reads whose SAM records differ")
    ap.add_argument("-K", "--batchsize", type=int, default=4000, help="reads per batch [4000]")
    args = ap.parse_args()
    reads = list(iter_fastx(args.reads))
    truth_path = args.truth or args.reads.with_suffix(".truth.tsv")
    truth = read_truth(truth_path) if truth_path.exists() else None
    bases = sum(len(s) for _, s in reads)

    mm, mm_build = _timed(ReadAligner, args.genome, AlignmentFilter(), threads=args.mappy_threads)
    theirs, mm_time = _timed(_in_batches, mm, reads, args.batchsize)
    rss_mappy = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del mm
    if args.seeder:
        eng, build = _timed(_seeded, args.seeder, args.genome, args.threads)
    else:
        eng, build = _timed(lambda: fm_aligner(args.genome, AlignmentFilter(), target=args.engine,
                                               threads=args.threads))
    _in_batches(eng, reads[:10], args.batchsize)  # compiled before the clock starts
    eng.seconds = dict.fromkeys(eng.seconds, 0.0)
    mine, time_mine = _timed(_in_batches, eng, reads, args.batchsize)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu = _gpu_mb() if args.engine == "gpu" else None

    if args.same_as_cpu:
        cpu = fm_aligner(args.genome, AlignmentFilter(), target="cpu", threads=args.threads)
        theirs_cpu, cpu_time = _timed(_in_batches, cpu, reads, args.batchsize)
        differ_cpu = sum([r.to_string() for r in a] != [r.to_string() for r in b] for a, b in zip(mine, theirs_cpu))
        print(f"cpu engine ({args.threads} threads, {cpu_time:.1f} s): reads whose SAM records differ from the "
              f"{args.engine} engine's: {differ_cpu:,} of {len(reads):,}")
    confident = agreeing = unmapped = 0
    differ = []
    wrong_mine = wrong_theirs = 0
    for (rid, _), a, b in zip(reads, mine, theirs):
        pa, pb = primary_of(a), primary_of(b)
        unmapped += pa is None
        if truth is not None:
            wrong_mine += _wrong(pa, truth.get(rid, []))
            wrong_theirs += _wrong(pb, truth.get(rid, []))
        if pb is not None and pb.mapping_quality >= 20:
            confident += 1
            same = pa is not None and agree(pa, pb)
            agreeing += same
            if not same and len(differ) < 10:
                differ.append((rid, _span(pa), _span(pb), truth.get(rid) if truth is not None else None))
    engine = f"seeder {args.seeder}" if args.seeder else f"{args.engine} engine"
    print(f"reads {len(reads):,} ({bases / 1e6:.2f} Mbases) from {args.reads}; reference {args.genome}")
    print(f"mappy MAPQ >= 20: {confident:,}; {engine} agrees on {agreeing:,} ({agreeing / max(confident, 1):.4f}); "
          f"unmapped by the engine: {unmapped:,}")
    if truth is not None:
        print(f"wrong placements at MAPQ >= 20 (against the truth): mappy {wrong_theirs:,}, {engine} {wrong_mine:,}")
    for rid, ours, theirs, true in differ:
        print(f"  differs: {rid} engine {ours} mappy {theirs} truth {true}")
    print("| aligner | threads | index (s) | align (s) | Mbases/s | peak host memory (MB, process) |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| mappy map-ont | {args.mappy_threads} | {mm_build:.1f} | {mm_time:.1f} | {bases / 1e6 / mm_time:.2f} | "
          f"{rss_mappy:.0f} |")
    print(f"| {engine} | {args.threads} | {build:.1f} | {time_mine:.1f} | {bases / 1e6 / time_mine:.2f} | {rss:.0f} |")
    if gpu is not None:
        print(f"\nGPU memory held by this process after the run: {gpu:.0f} MB")
    steps = ", ".join(f"{step} {dt:.1f} s ({bases / 1e6 / max(dt, 1e-9):.2f} Mbases/s)"
                      for step, dt in eng.seconds.items())
    print(f"\n{engine}, by step: {steps}; outside the steps (records, bases encoded, order): "
          f"{time_mine - sum(eng.seconds.values()):.2f} s")


if __name__ == "__main__":
    sys.exit(main())
