"""Chaining on the GPU against the CPU's, printed as JSON for tests/test_gpu_chain.py; on a GPU, timed.

    python tests/gpu_chain_cases.py [--small] [--reads 2000] [--genome-mb 20] [--cpu-threads 2]

Run in a subprocess: numba's CUDA simulator is chosen by NUMBA_ENABLE_CUDASIM before numba is imported.
`--small` (what the tests run, under the simulator too): a few simulated reads on a 200 kb synthetic
genome seeded by brute force (tests/align_seeder.py), crafted anchors (the programme's rules, ties in a
tandem array) and tight settings that end rounds in every way. Without it, also each profile's `--reads`
simulated reads on a `--genome-mb` synthetic genome, seeded on the GPU's FM-index, chained on
`--cpu-threads` CPU threads and on the GPU, timed after a first call that compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT), str(ROOT / "tests")]

import numba  # noqa: E402

from align_seeder import KmerSeeder  # noqa: E402
from streamer.align.anchors import Seeds  # noqa: E402
from streamer.align.chain import ChainParams, chain  # noqa: E402
from streamer.align.genome import synth_genome  # noqa: E402
from streamer.align.simulate import PROFILES, simulate_reads  # noqa: E402
from streamer_gpu.chain import CudaChainer, chainer_for  # noqa: E402
from streamer_gpu.target import SIMULATED  # noqa: E402

# predecessors searched by the rounds ending at every turn: max_gap, max_lookback (not a multiple of a round)
# and the skip rule
TIGHT = ChainParams(max_gap=150, bandwidth=8, max_lookback=11, max_skip=1, min_score=20)


def compare(seeds: Seeds, lengths: np.ndarray, offsets: np.ndarray, params: ChainParams = ChainParams()) -> dict:
    cpu = chain(seeds, lengths, offsets, params)
    gpu = chain(seeds, lengths, offsets, params, target="gpu")
    same = all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(cpu.__dict__.values(),
                                                                           gpu.__dict__.values()))  # fmt: skip
    return {"same": same, "n_seeds": len(seeds), "n_chains": len(cpu), "anchors": int(len(cpu.anchors))}


def seeds_of(rows) -> Seeds:
    read, qpos, rpos, length, rc = (np.array(x) for x in zip(*rows))
    order = np.lexsort((qpos, rpos - qpos, rc, read))
    return Seeds(read[order].astype(np.int32), qpos[order].astype(np.int32), rpos[order].astype(np.int64),
                 length[order].astype(np.int32), rc[order].astype(bool))  # fmt: skip


def crafted() -> dict:
    """tests/test_align_chain.py's rules (contigs, the band, strands), a tandem array: every read position
    matching seven unit copies, whose chains tie on score all along, and anchors ending together on the
    reference (ordered by their end on the read)."""
    rows = [(0, 0, 1000, 30, False), (0, 100, 1100, 30, False), (0, 200, 1205, 30, False), (0, 300, 5000, 20, False),
            (0, 400, 9_970, 25, False), (0, 450, 10_020, 25, False), (1, 50, 3000, 25, True),
            (1, 150, 3100, 25, True), (1, 250, 3200, 25, True)]  # fmt: skip
    rows += [(2, q, 40_000 + q + 7 * u, 15, False) for q in range(0, 900, 9) for u in range(-3, 4)]
    rows += [(3, 11 * k, 70_000 + 10 * (k // 2), 20, k % 3 == 0) for k in range(60)]  # pairs ending together
    return compare(seeds_of(rows), np.array([600, 400, 1000, 700]), np.array([0, 10_000, 100_000]),
                   ChainParams(min_score=40, bandwidth=100))  # fmt: skip


def small() -> dict:
    genome = synth_genome(200_000, seed=5, contigs=2)
    seeder = KmerSeeder.of(genome, k=15)
    reads = simulate_reads(genome, 6, PROFILES["r9"], mean_length=1500, chimeras=0.3, seed=2)
    seeds = seeder(reads.codes, reads.offsets)
    lengths = np.diff(reads.offsets)
    return {"reads": compare(seeds, lengths, seeder.contig_offsets),
            "tight": compare(seeds, lengths, seeder.contig_offsets, TIGHT)}  # fmt: skip


def fault() -> dict:
    os.environ["STREAMER_CUDA_FAULT"] = "chain:1"
    rows = [(0, 0, 1000, 30, False), (0, 100, 1100, 30, False), (0, 200, 1205, 30, False)]
    seeds = seeds_of(rows)
    failing = CudaChainer()
    del os.environ["STREAMER_CUDA_FAULT"]
    got = failing.chain_groups(seeds.qpos, seeds.rpos, seeds.length, np.array([0, 3]), np.array([0, 5000]),
                               ChainParams())  # fmt: skip
    return {"same": int(got.c_n[0]) == 1 and int(got.c_score[0]) == 90 - 2 and list(got.anchor_out) == [0, 1, 2]}


def best_of(runs: int, fn, steps: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The fastest of runs calls of fn, and the steps it timed (into `steps`) in that call."""
    times = []
    for _ in range(runs):
        steps.clear()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t, {k: round(v, 4) for k, v in steps.items()}))
    return min(times, key=lambda x: x[0])


def timed(n_reads: int, genome_mb: float, cpu_threads: int) -> dict:
    """Each profile's reads chained on the CPU and the GPU (the best of 3 runs, after one that compiles),
    seeded on the GPU's FM-index (the CPU's under the simulator)."""
    from streamer.align import fmindex as F
    from streamer.align.bases import LETTERS
    from streamer.align.seeds import find_seeds
    from streamer_gpu import build_fmindex

    genome = synth_genome(int(genome_mb * 1_000_000), seed=7)
    text = F.reference_text((name, LETTERS[codes]) for name, codes in genome)
    index = (None if SIMULATED else build_fmindex(text, F.BUILD_BYTES)) or F.build_index(text)
    numba.set_num_threads(min(cpu_threads, numba.config.NUMBA_NUM_THREADS))
    out = {}
    for profile in ("r9", "r10"):
        reads = simulate_reads(genome, n_reads, PROFILES[profile], seed=3)
        lengths, offsets = np.diff(reads.offsets), index.contig_offsets
        seeds = find_seeds(index, reads.codes, reads.offsets, target="cpu" if SIMULATED else "gpu")
        case = compare(seeds, lengths, offsets)  # compiles both
        bases = int(lengths.sum())
        cpu_s, _ = best_of(3, lambda: chain(seeds, lengths, offsets), {})
        gpu_s, steps = best_of(3, lambda: chain(seeds, lengths, offsets, target="gpu"), chainer_for().seconds)
        out[f"timed_{profile}"] = case | {
            "bases": bases, "cpu_threads": numba.get_num_threads(), "cpu_s": round(cpu_s, 4),
            "gpu_s": round(gpu_s, 4), "cpu_mbases_s": round(bases / cpu_s / 1e6, 1),
            "gpu_mbases_s": round(bases / gpu_s / 1e6, 1), "gpu_steps_s": steps,
            "host_s": round(gpu_s - sum(steps.values()), 4)}  # fmt: skip
    return out


def one_shared_array_a_block() -> None:
    """numba's CUDA simulator gives a block's threads each static shared array by the kernel line asking for it,
    found in a dict and, when missing, made and stored: a thread handed the GIL between the two makes its own, and
    neither sees the other's writes (a sort's garbage scatter index, chains unlike the CPU's, in about 1 run in 4 of
    this script under load). Here the array is made first and stored with the dict's one atomic step: every thread
    gets the one that is kept, as on a GPU. (The chaining kernels use no dynamic shared memory.)"""
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    def array(self, shape, dtype):
        line = sys._getframe(1)
        made = np.empty(shape, dtype)
        return self._allocations.setdefault((line.f_code.co_filename, line.f_lineno), made)

    FakeCUDAShared.array = array


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--genome-mb", type=float, default=20)
    parser.add_argument("--cpu-threads", type=int, default=2)
    args = parser.parse_args()
    if SIMULATED:
        sys.setswitchinterval(1e-5)  # a simulated thread waiting at a barrier hands the GIL on sooner: 7x faster
        one_shared_array_a_block()  # which threads switched that often race for
    empty = Seeds(*(np.zeros(0, t) for t in (np.int32, np.int32, np.int64, np.int32, bool)))
    cases = {"crafted": crafted(), **small(), "fault": fault(),
             "no_seeds": compare(empty, np.array([100]), np.array([0, 1000]))}
    if not args.small:
        cases |= timed(args.reads, args.genome_mb, args.cpu_threads)
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
