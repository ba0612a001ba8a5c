"""Base-level extension on the GPU against the CPU's, printed as JSON for tests/test_gpu_extend.py.

    python tests/gpu_extend_cases.py            # on a GPU: 2,000 R9-like and R10-like reads on a 20 Mb
                                                # genome, identical and timed (2 CPU threads vs the GPU)
    python tests/gpu_extend_cases.py --small    # a few reads on a small genome (runs under the simulator)

Run in a subprocess: numba's CUDA simulator is chosen by NUMBA_ENABLE_CUDASIM before numba is
imported. Seeds come from the FM-index (on the GPU for the large run) and chains from `chain`; each
case aligns the same chains with `extend` on the CPU and with the GPU extender and compares every
field of the two `Alignments`.
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

from numba import config  # noqa: E402

from streamer.align import fmindex as F  # noqa: E402
from streamer.align.bases import decode  # noqa: E402
from streamer.align.chain import chain  # noqa: E402
from streamer.align.extend import Alignments, extend  # noqa: E402
from streamer.align.genome import synth_genome  # noqa: E402
from streamer.align.seeds import find_seeds  # noqa: E402
from streamer.align.simulate import PROFILES, simulate_reads  # noqa: E402
from streamer_gpu import build_fmindex  # noqa: E402
from streamer_gpu.extend import BUDGET, MAX_JOB_BYTES, CudaExtender  # noqa: E402

SIMULATED = bool(config.ENABLE_CUDASIM)


def same(a: Alignments, b: Alignments) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in Alignments.__dataclass_fields__)


class Batch:
    """Simulated reads of one profile, seeded and chained: what `extend` takes."""

    def __init__(self, contigs, index, profile: str, n: int, mean_length: int, seed: int):
        reads = simulate_reads(contigs, n, PROFILES[profile], mean_length=mean_length, min_length=200, seed=seed)
        self.codes, self.offsets = reads.codes, reads.offsets
        self.genome = np.concatenate([c for _, c in contigs])
        self.contig_offsets = np.concatenate([[0], np.cumsum([len(c) for _, c in contigs])]).astype(np.int64)
        target = "cpu" if SIMULATED else "gpu"
        self.seeds = find_seeds(index, self.codes, self.offsets, target=target)
        self.chains = chain(self.seeds, np.diff(self.offsets), self.contig_offsets)

    def extend(self, **kw) -> tuple[Alignments, float]:
        t0 = time.perf_counter()
        al = extend(self.chains, self.seeds, self.codes, self.offsets, self.genome, self.contig_offsets, **kw)
        return al, time.perf_counter() - t0


def compared(batch: Batch, ext: CudaExtender, repeat: int = 1) -> dict:
    """The CPU's alignments (2 threads) and the GPU's, the same or not, and each side's best time."""
    cpu_s, gpu_s = [], []
    for _ in range(repeat):
        cpu, dt = batch.extend(threads=2)
        cpu_s.append(dt)
    ext.seconds.clear()
    ext.jobs = ext.jobs_on_cpu = ext.launches = 0
    for _ in range(repeat):
        gpu, dt = batch.extend(threads=2, gpu=ext)
        gpu_s.append(dt)
    bases = int(batch.offsets[-1])
    return {"same": same(cpu, gpu), "reads": len(batch.offsets) - 1, "chains": len(batch.chains), "bases": bases,
            "cigar_runs": len(cpu.cigar), "cpu_2_threads_s": min(cpu_s), "gpu_s": min(gpu_s),
            "cpu_2_threads_mbases_s": bases / min(cpu_s) / 1e6, "gpu_mbases_s": bases / min(gpu_s) / 1e6,
            "gpu_parts_s": {k: v / repeat for k, v in ext.seconds.items()}, "jobs": ext.jobs // repeat,
            "jobs_on_cpu": ext.jobs_on_cpu // repeat, "launches": ext.launches // repeat}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="a few reads on a small genome (the simulator's size)")
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--genome", type=int, default=20_000_000)
    ap.add_argument("--max-job-bytes", type=int, default=MAX_JOB_BYTES, help="the largest job a GPU thread takes")
    ap.add_argument("--budget", type=int, default=BUDGET, help="device bytes of one launch")
    args = ap.parse_args()
    small = args.small or SIMULATED
    size, n, mean_length = (20_000, 8, 500) if small else (args.genome, args.reads, 6000)
    contigs = synth_genome(size, seed=4, contigs=2)
    text = F.reference_text((name, decode(codes)) for name, codes in contigs)
    index = F.build_index(text, kmer_len=4) if small else build_fmindex(text, F.BUILD_BYTES)
    genome = np.concatenate([c for _, c in contigs])
    cases: dict = {}
    for profile, seed in (("r9", 1), ("r10", 2)):
        batch = Batch(contigs, index, profile, n, mean_length, seed)
        if not small:  # compile both sides on a few reads first
            warm = Batch(contigs, index, profile, 20, 2000, seed + 10)
            compared(warm, CudaExtender(genome))
        ext = CudaExtender(genome, budget=args.budget, max_job_bytes=args.max_job_bytes)
        cases[profile] = compared(batch, ext, repeat=1 if small else 3)
        if profile == "r9":
            # a tiny budget and job cap: several launches, and the largest jobs on the CPU alongside
            split = CudaExtender(genome, budget=1 << 16 if small else 1 << 26, max_job_bytes=4000)
            cases["split"] = compared(batch, split)
    os.environ["STREAMER_CUDA_FAULT"] = "extend:1"
    cases["fault"] = {"same": compared(batch, CudaExtender(genome))["same"]}
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
