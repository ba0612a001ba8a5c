"""The FM-index and seeding: build time and size, seeding throughput, CPU against GPU.

For the E. coli reference (--reference) and, with --synthetic-mb, a random genome with repeats of
that size (diverged copies of 1-10 kb stretches, tandem arrays, N runs, four contigs): the index
is built on the CPU (numba, -t threads) and, with --target gpu, on the GPU (the first build
includes compiling the kernels; the second is timed apart), and the two are compared byte for byte.
Reads are then seeded (both strands, --min-len, --max-occ): the shared E. coli reads (--reads,
tiled --copies times) and simulated reads of the synthetic genome (both strands, --error split
into substitutions, insertions and deletions 2:1:1), in Mbases of read a second, best of
--repeat after a warm-up; a read counts as placed when a seed on its true strand falls in its
true span (for the shared reads: minimap2's in --bam). Exits 1 when the GPU's index or seeds differ
from the CPU's. Runs from a checkout without installing it:

    PYTHONPATH=$PWD:$PWD/gpu python benchmarks/bench_fmindex.py -t 2 --synthetic-mb 30
    PYTHONPATH=$PWD:$PWD/gpu python benchmarks/bench_fmindex.py -t 16 --synthetic-mb 50 --target gpu
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pysam

from streamer.align import fmindex as F
from streamer.align.seeds import MAX_OCC, MIN_LEN, find_seeds
from streamer.align.suffixes import bucket_counts, plan_pieces

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "ecoli_2kb_region"
LETTERS = np.frombuffer(b"ACGT", np.uint8)


def synthetic(size: int, seed: int) -> list[tuple[str, bytes]]:
    """Random bases with 5% of the genome in diverged copies (2% substitutions) of 1-10 kb stretches and
    2% in tandem arrays (units of 2-100 bases, 1% substitutions), cut into four contigs with N runs."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 4, size).astype(np.uint8)
    for share, make in ((0.05, lambda: g[(a := int(rng.integers(0, size - 10_000))) : a + int(rng.integers(1000, 10_000))]),
                        (0.02, lambda: np.resize(rng.integers(0, 4, int(rng.integers(2, 100))).astype(np.uint8),
                                                 int(rng.integers(500, 5000))))):  # fmt: skip
        done = 0
        while done < share * size:
            piece = make().copy()
            flip = rng.random(len(piece)) < (0.02 if share == 0.05 else 0.01)
            piece[flip] = rng.integers(0, 4, int(flip.sum()))
            at = int(rng.integers(0, size - len(piece)))
            g[at : at + len(piece)] = piece
            done += len(piece)
    seq = bytearray(LETTERS[g].tobytes())
    for at in rng.integers(0, size - 1000, 20):
        run = int(rng.integers(10, 1000))
        seq[at : at + run] = b"N" * run
    cuts = np.linspace(0, size, 5).astype(int)
    return [(f"chr{i + 1}", bytes(seq[cuts[i] : cuts[i + 1]])) for i in range(4)]


def simulate(contigs, n: int, length: int, error: float, seed: int):
    """n reads of about `length` bases from either strand with `error` per base; and their truths
    (start and end in the contigs end to end, reverse strand)."""
    rng = np.random.default_rng(seed)
    genome = b"".join(s for _, s in contigs)
    comp = bytes.maketrans(b"ACGTN", b"TGCAN")
    reads, truth = [], []
    for _ in range(n):
        m = int(rng.integers(length // 2, 2 * length))
        a = int(rng.integers(0, len(genome) - m))
        src = np.frombuffer(genome[a : a + m], np.uint8)
        kind = rng.choice(4, m, p=[1 - error, error / 2, error / 4, error / 4])  # keep, substitute, insert, delete
        count = np.array([1, 1, 2, 0])[kind]  # an insertion: a random base, then the base
        out = np.repeat(np.where(kind == 1, LETTERS[rng.integers(0, 4, m)], src), count)
        first = (np.cumsum(count) - count)[kind == 2]
        out[first] = LETTERS[rng.integers(0, 4, len(first))]
        rc = bool(rng.random() < 0.5)
        reads.append(out.tobytes()[::-1].translate(comp) if rc else out.tobytes())
        truth.append((a, a + m, rc))
    return reads, truth


def packed(reads: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(reads) + 1, np.int64)
    np.cumsum([len(r) for r in reads], out=offsets[1:])
    return F.encode(b"".join(reads)), offsets


def placed(seeds, truth) -> float:
    """The share of the reads with a truth (a strand) that have a seed on that strand inside their span."""
    hit = np.zeros(len(truth), bool)
    for r, p, rc in zip(seeds.read.tolist(), seeds.rpos.tolist(), seeds.rc.tolist()):
        a, b, t_rc = truth[r]
        hit[r] |= rc == t_rc and a - 100 <= p <= b
    known = np.array([t[2] is not None for t in truth])
    return float(hit[known].mean())


def timed(fn, repeat: int, after_warmup=lambda: None):
    out = fn()  # warm-up: compiles the kernels, copies the index to the GPU
    after_warmup()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench(name: str, contigs, reads, truth, args) -> dict:
    t0 = time.perf_counter()
    text = F.reference_text(contigs)
    res = {"name": name, "bases": int(text.contig_offsets[-1]), "segments": len(text.seg_text),
           "t_text": time.perf_counter() - t0}  # fmt: skip
    budget = args.budget_mb << 20
    res["pieces"] = len(list(plan_pieces(bucket_counts(text.codes, len(text.codes)), F.max_piece_for(budget))))
    t0 = time.perf_counter()
    index = F.build_index(text, budget=budget)
    res |= {"t_build_cpu": time.perf_counter() - t0, "index_mb": index.nbytes / 1e6, "kmer_len": index.kmer_len,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}
    codes, offsets = packed(reads)
    res |= {"reads": len(reads), "read_mb": int(offsets[-1]) / 1e6}
    seed = lambda target: find_seeds(index, codes, offsets, min_len=args.min_len, max_occ=args.max_occ, target=target)  # noqa: E731
    t, seeds = timed(lambda: seed("cpu"), args.repeat)
    res |= {"t_seed_cpu": t, "seed_mbps_cpu": res["read_mb"] / t, "seeds": len(seeds), "placed": placed(seeds, truth)}
    if args.target == "gpu":
        from streamer.pipeline.gpu import gpu_package

        builds = []
        for _ in range(2):
            t0 = time.perf_counter()
            on_gpu = gpu_package().build_fmindex(text, budget)
            builds.append(time.perf_counter() - t0)
        res |= {"t_build_gpu_first": builds[0], "t_build_gpu": builds[1], "same_index": on_gpu.same_as(index)}
        seconds = gpu_package().fm_seeder(index).seconds  # the phases' times, summed over the timed runs
        t, gpu_seeds = timed(lambda: seed("gpu"), args.repeat, seconds.clear)
        same = all(np.array_equal(a, b) for a, b in zip(seeds.__dict__.values(), gpu_seeds.__dict__.values()))
        res |= {"t_seed_gpu": t, "seed_mbps_gpu": res["read_mb"] / t, "same_seeds": same}
        res |= {f"t_gpu_{k}": v / args.repeat for k, v in seconds.items()}
    return res


def shared_reads(path: Path, bam: Path, copies: int):
    reads = [r.sequence.encode() for r in pysam.FastxFile(str(path))]
    where = {}
    with pysam.AlignmentFile(str(bam)) as fh:
        for rec in fh:
            if not (rec.is_secondary or rec.is_supplementary or rec.is_unmapped) and rec.mapping_quality >= 20:
                where[rec.query_name] = (rec.reference_start, rec.reference_end, rec.is_reverse)
    names = [r.name for r in pysam.FastxFile(str(path))]
    truth = [where.get(n, (-1, -1, None)) for n in names]
    return reads * copies, truth * copies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz")
    ap.add_argument("--reads", type=Path, default=SHARED / "reads.fasta")
    ap.add_argument("--bam", type=Path, default=SHARED / "reads.mg1655.sorted.bam")
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--synthetic-mb", type=int, default=0)
    ap.add_argument("--sim-reads", type=int, default=2000)
    ap.add_argument("--sim-length", type=int, default=5000)
    ap.add_argument("--error", type=float, default=0.06)
    ap.add_argument("--target", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--min-len", type=int, default=MIN_LEN)
    ap.add_argument("--max-occ", type=int, default=MAX_OCC)
    ap.add_argument("--budget-mb", type=int, default=F.BUILD_BYTES >> 20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    results = []
    contigs = [(r.name, r.sequence.encode()) for r in pysam.FastxFile(str(args.reference))]
    if args.reads.is_file() and args.bam.is_file():
        reads, truth = shared_reads(args.reads, args.bam, args.copies)
    else:
        reads, truth = simulate(contigs, args.sim_reads, args.sim_length, args.error, 1)
    results.append(bench(args.reference.name, contigs, reads, truth, args))
    if args.synthetic_mb:
        contigs = synthetic(args.synthetic_mb * 1_000_000, 2)
        reads, truth = simulate(contigs, args.sim_reads, args.sim_length, args.error, 3)
        results.append(bench(f"synthetic {args.synthetic_mb} Mb", contigs, reads, truth, args))
    for r in results:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r.get("same_index") is False or r.get("same_seeds") is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
