"""GPU CpG HMM against the CPU `score_windows` on the fixture reads' windows; run as a script.

tests/test_gpu_hmm.py starts it with NUMBA_ENABLE_CUDASIM=1 (numba reads that variable when
it is first imported) or, where a GPU is present, without it. It prints one JSON object: per
case, how many log-likelihoods differ from the CPU's bit for bit (0 if all is well) and the
batch's measurements.

The windows are the (read, window) jobs `streamer call` scores on the fixture reads, taken
from the CPU pipeline. The simulator runs each GPU thread as a Python thread, so there the
cases use a selection: the smallest windows of each strand, the windows of most CpGs and a
long one; on a GPU every window of the fixture is scored. A last case scores windows of a
synthetic CpG 9-mer model (tests/cpg_model9.py), and another the fixture's GpC windows, dcm's and
dam's, in nanopolish's double-precision scaling.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from streamer.pipeline.batching import BatchLimits, offline_batches
from streamer.pipeline.batch import pack
from streamer.pipeline.gpu import CudaOptions
from streamer_gpu.target import SIMULATED
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
from streamer.io.fastx import load_basecalls
from streamer.io.index import open_index
from streamer.io.reference import Reference
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer.pore.motifs import CPG, MOTIFS, Motif
from streamer_plugins.cpg.caller import CpgCaller
from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs, score_windows
from streamer_plugins.cpg.hmm_cuda import CudaHmm

from cpg_model9 import cpg_model, synthetic_jobs

ECOLI = Path(__file__).parent / "data" / "ecoli"
REFERENCE = Path(__file__).parent / "data" / "ecoli_k12_mg1655.fa.gz"


class Recorder:
    """Stands in for the GPU HMM in a CPU pipeline: keeps the jobs it is given, answers as the CPU."""

    def __init__(self) -> None:
        self.args: tuple | None = None

    def score(self, jobs: HmmJobs, inputs: HmmInputs):
        self.args = (*jobs, *inputs)
        ll_u, ll_m = score_windows(*self.args)
        return ll_u, ll_m, None


def fixture_jobs(work: Path, motif: Motif = CPG) -> tuple:
    """The arguments `call_methylation` hands its scorer for the fixture reads' `motif` sites, in one batch."""
    reads = work / "reads.fasta"
    reads.write_text((ECOLI / "reads.fasta").read_text())
    filt = AlignmentFilter()
    bam = ECOLI / "reads.bam"
    wanted = {a.read_id for a in iter_alignments(bam, filt) if isinstance(a, AlignmentRecord)}
    index = open_index(reads, [ECOLI / "fast5"])
    with Reference(REFERENCE) as ref:
        batches = list(offline_batches(iter_alignments(bam, filt), load_basecalls(reads, wanted), index, ref,
                                       BatchLimits(), str(reads)))  # fmt: skip
    pipeline = Pipeline(PipelineOptions(threads=2, cuda=CudaOptions(disable=True), motif=motif), [CpgCaller()])
    recorder = Recorder()
    pipeline.analysis("hmm").gpu = recorder
    pipeline.run_batch(pack([r for rs, _ in batches for r in rs]))
    return recorder.args


def select(args: tuple, k: int) -> np.ndarray:
    """Job indices the simulator can run in seconds that still cover both strands and multi-CpG windows."""
    job_read, w0, w1, e1, e2 = args[:5]
    rc = args[7]
    cells = (w1 - w0 - k + 1) * (np.abs(e2 - e1) + 1)
    picks: list[int] = []
    for strand in (False, True):
        idx = np.flatnonzero(rc[job_read] == strand)
        picks += idx[np.argsort(cells[idx], kind="stable")[:5]].tolist()
    kmers = w1 - w0 - k + 1
    picks += np.flatnonzero(kmers == kmers.max())[:1].tolist()
    picks += [int(np.argsort(cells, kind="stable")[len(cells) // 2])]
    return np.unique(np.array(picks, np.int64))


def subset(args: tuple, idx: np.ndarray) -> tuple:
    return (*(a[idx] for a in args[:5]), *args[5:])


def compare(args: tuple, hmm: CudaHmm) -> dict:
    cpu_u, cpu_m = score_windows(*args)
    gpu_u, gpu_m, stats = hmm.score(HmmJobs(*args[:5]), HmmInputs(*args[5:]))
    diff = int(np.count_nonzero(cpu_u.view(np.uint32) != gpu_u.view(np.uint32)))
    diff += int(np.count_nonzero(cpu_m.view(np.uint32) != gpu_m.view(np.uint32)))
    return {"diff": diff, "n": len(cpu_u), "finite": bool(np.isfinite(cpu_u).all() and np.isfinite(cpu_m).all()),
            "stats": dataclasses.asdict(stats)}  # fmt: skip


def main() -> int:
    import tempfile

    # the simulator's numpy scalars warn on -inf - -inf, which the kernel meets by design
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    with tempfile.TemporaryDirectory() as tmp:
        args = fixture_jobs(Path(tmp))
        motifs = {name: fixture_jobs(Path(tmp), MOTIFS[name]) for name in ("gpc", "dam", "dcm")}
    k = int(args[12])
    if SIMULATED:
        args = subset(args, select(args, k))
    kmers = args[2] - args[1] - k + 1
    block = 32 if SIMULATED else 128
    results: dict = {"simulated": SIMULATED, "max_kmers": int(kmers.max()),
                     "rc": sorted(set(args[7][args[0]].tolist()))}  # fmt: skip
    results["windows"] = compare(args, CudaHmm(block=block))
    cheap = np.argsort((args[2] - args[1]) * (np.abs(args[4] - args[3]) + 1), kind="stable")[:6]
    results["in_job_order"] = compare(subset(args, np.sort(cheap)), CudaHmm(block=block, by_cost=False))
    # a kernel whose local arrays hold fewer k-mers than the longest windows: those go to the CPU
    small = int(np.sort(kmers)[len(kmers) // 2])
    results["capacity"] = compare(args, CudaHmm(max_kmers=small, block=block)) | {
        "over": int(np.count_nonzero(kmers > small))
    }

    # a CpG 9-mer model (R10.4.1's k): the same kernel over windows of 9-mers, both strands
    results["k9"] = compare(synthetic_jobs(cpg_model(9), np.random.default_rng(4)), CudaHmm(block=block))

    # the other motifs: their sites on both strands, nanopolish's double model and scalings
    for name, jobs in motifs.items():
        picked = subset(jobs, select(jobs, k)) if SIMULATED else jobs
        results[name] = compare(picked, CudaHmm(block=block)) | {
            "levels": str(jobs[13].dtype), "nanopolish": bool(jobs[18]),
            "rc": sorted(set(picked[7][picked[0]].tolist()))}  # fmt: skip

    class Broken:
        """A launch that fails as a device out of memory would."""

        def __getitem__(self, config):
            def launch(*a):
                from numba.cuda.cudadrv.driver import CudaAPIError

                raise CudaAPIError(2, "CUDA_ERROR_OUT_OF_MEMORY")

            return launch

    broken = CudaHmm(block=block)
    broken._kernel = lambda levels: Broken()
    results["fallback"] = compare(args, broken)
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
