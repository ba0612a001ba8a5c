"""R10.4.1 calls at k = 9 through the whole pipeline, GPU against CPU; run as a script.

tests/test_gpu_hmm.py starts it with NUMBA_ENABLE_CUDASIM=1 (numba reads that variable when it
is first imported) or, where a GPU is present, without it, with the path of the 9-mer table. Short
simulated R10.4.1 reads (both strands, CpGs methylated at random, a synthetic CpG 9-mer model)
go through `Pipeline` twice: on the CPU, and with ABEA and the CpG HMM on the GPU. It prints one
JSON object: both call TSVs and the GPU's counts (reads aligned and windows scored there).
The simulator runs each GPU thread as a Python thread, so the reads are a few hundred bases.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from r10_sim import simulate_methylated, synthetic_cpg_model, write_text_model
from streamer.pipeline.batch import CIGAR_M, ReadInput
from streamer.pipeline.gpu import CudaOptions
from streamer.io.reference import Reference
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.pore.model import load_model
from streamer_gpu.target import SIMULATED
from streamer_plugins.cpg.caller import CALLS, CpgCaller
from streamer_plugins.cpg.calls import format_calls

REFERENCE = Path(__file__).parent / "data" / "ecoli_k12_mg1655.fa.gz"
CONTIG = "NC_000913.3"
# stretches of MG1655 (6 to 14 CpGs in their first 160 bases), one per strand on the simulator, all on a GPU
STARTS = ((1_000_120, False), (2_000_040, True), (150_000, False), (420_000, True), (3_100_000, False))


def reads(kmer, meth, length: int, n: int) -> list[ReadInput]:
    rng = np.random.default_rng(21)
    out = []
    with Reference(REFERENCE) as ref:
        for start, rc in STARTS[:n]:
            stretch = ref.fetch(CONTIG, start, start + length)
            sim = simulate_methylated(kmer, meth, stretch, rc, 0.5, rng, shift=float(rng.normal(0, 4)))
            out.append(ReadInput(sim.read.record.read_id, sim.read.seq, sim.read.record, CONTIG, start,
                                 start + length, rc, np.array([[CIGAR_M, length]], np.int32), stretch))  # fmt: skip
    return out


def main() -> int:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's -inf - -inf
    kmer_path = Path(sys.argv[1])
    kmer = load_model(kmer_path)
    meth = synthetic_cpg_model(kmer)
    # 250 bases: about the shortest simulated reads that pass recalibration's QC
    batch = reads(kmer, meth, 250 if SIMULATED else 3000, 2 if SIMULATED else len(STARTS))
    out: dict = {"simulated": SIMULATED, "k": kmer.k}
    with tempfile.TemporaryDirectory() as tmp:
        meth_path = Path(tmp) / "cpg.model"
        write_text_model(meth, meth_path)
        for name, cuda in (("cpu", CudaOptions(disable=True)), ("gpu", CudaOptions(max_reads=8, max_bases=50_000))):
            pipeline = Pipeline(PipelineOptions(threads=2, kmer_model=kmer_path, meth_model=meth_path, cuda=cuda),
                                [CpgCaller()])  # fmt: skip
            result = pipeline.process(batch)
            out[name] = format_calls(result.products[CALLS], result.read_ids, result.ref_names)
            out[f"{name}_abea"] = dataclasses.asdict(result.gpu_stats) if result.gpu_stats else None
            out[f"{name}_hmm"] = dataclasses.asdict(result.hmm_stats) if result.hmm_stats else None
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
