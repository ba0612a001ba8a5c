"""The FM-index built and seeded on the GPU against the CPU's, printed as JSON for tests/test_gpu_fmindex.py.

Run in a subprocess: numba's CUDA simulator is chosen by NUMBA_ENABLE_CUDASIM before numba is
imported. Under the simulator (a Python thread per GPU thread) the reference and reads are small; on
a GPU the E. coli reference and its reads are added.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT), str(ROOT / "tests")]

from numba import config  # noqa: E402

from streamer.align import fmindex as F  # noqa: E402
from streamer.align.seeds import both_strands, chunk_seeds, find_seeds  # noqa: E402
from streamer.align.suffixes import PIECE_BYTES, bucket_counts, plan_pieces  # noqa: E402
from streamer_gpu import build_fmindex  # noqa: E402
from streamer_gpu.fmindex import CudaFmSeeder  # noqa: E402
from test_seeds import pack, random_reference, simulated_reads  # noqa: E402

SIMULATED = bool(config.ENABLE_CUDASIM)


def same_seeds(a, b) -> bool:
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a.__dict__.values(), b.__dict__.values()))


def seeding(index, reads, **options) -> dict:
    codes, offsets = pack(reads)
    cpu = find_seeds(index, codes, offsets, **options)
    gpu = find_seeds(index, codes, offsets, target="gpu", **options)
    return {"same": same_seeds(cpu, gpu), "n_seeds": len(gpu)}


def main() -> None:
    rng = np.random.default_rng(4)
    contigs = random_reference(rng, n_contigs=2, length=1000)
    text = F.reference_text(contigs)
    cpu = F.build_index(text, kmer_len=4)
    reads = simulated_reads(rng, contigs, n_reads=10)
    cases = {
        "index": {"same": build_fmindex(text, F.BUILD_BYTES, kmer_len=4).same_as(cpu), "n": cpu.n},
        "index_pieces": {"same": build_fmindex(text, PIECE_BYTES * 700, kmer_len=4).same_as(cpu),
                         "pieces": len(list(plan_pieces(bucket_counts(text.codes, cpu.n), 700)))},
        "seeds": seeding(cpu, reads, min_len=12, max_occ=500),
        "seeds_capped_chunked": seeding(cpu, reads, min_len=9, max_occ=3, chunk_ends=301),
        "no_reads": seeding(cpu, []),
    }
    if not SIMULATED:
        ecoli = F.fasta_text(ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz")
        cpu_ecoli = F.build_index(ecoli)
        cases["ecoli_index"] = {"same": build_fmindex(ecoli, F.BUILD_BYTES).same_as(cpu_ecoli), "n": cpu_ecoli.n}
        genome = ecoli.codes[:-1].tobytes().translate(bytes.maketrans(bytes(range(4)), b"ACGT"))
        cases["ecoli_seeds"] = seeding(cpu_ecoli, simulated_reads(rng, [("e", genome)], n_reads=200))
    os.environ["STREAMER_CUDA_FAULT"] = "seeds:1"
    q, job_off = both_strands(*pack(reads))
    failing = CudaFmSeeder(cpu).chunk_seeds(q, job_off, 0, len(job_off) - 1, 12, 500)
    expected = chunk_seeds(cpu, q, job_off, 0, len(job_off) - 1, 12, 500)
    cases["fault"] = {"same": all(np.array_equal(a, b) for a, b in zip(failing, expected))}
    print(json.dumps(cases))


if __name__ == "__main__":
    main()
