"""CPU ABEA and CpG HMM kernels alone, on the inputs `streamer call` hands them for real reads.

Runs the CPU pipeline once over the reads (the shared 112 E. coli reads when present, else the
fixture reads in tests/data) to capture the exact arguments of `align_batch` and of the HMM's
`score_windows`, then times each kernel `--repeat` times and reports the fastest and the median
wall seconds and the fastest CPU seconds. Meant for before/after comparisons of kernel code in
one session on one machine (run it with NUMBA_NUM_THREADS=1 for the steadiest figures on a
shared machine).

    python benchmarks/bench_cpu_kernels.py [--repeat 7] [--fixture]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    sys.path.insert(0, str(_root))

import numpy as np  # noqa: E402

from streamer.pipeline import stages as pipeline_module  # noqa: E402
from streamer.pipeline.abea import AbeaReads  # noqa: E402
from streamer.pipeline.batching import BatchLimits, offline_batches  # noqa: E402
from streamer.pipeline.batch import ReadBatch, pack  # noqa: E402
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments  # noqa: E402
from streamer.io.fastx import load_basecalls  # noqa: E402
from streamer.io.index import open_index  # noqa: E402
from streamer.io.reference import Reference  # noqa: E402
from streamer_plugins.cpg.caller import CpgCaller  # noqa: E402
from streamer_plugins.cpg.hmm import score_windows  # noqa: E402

SHARED = ROOT.parent / "shared" / "data" / "ecoli_2kb_region"
FIXTURE = ROOT / "tests" / "data" / "ecoli"
REFERENCE = ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"


def reads_source(fixture: bool) -> tuple[Path, Path, Path]:
    """(basecalls, BAM, signal folder): the shared 112 E. coli reads when present and not `fixture`, else the
    fixture reads in tests/data."""
    if SHARED.is_dir() and not fixture:
        return SHARED / "reads.fasta", SHARED / "reads.mg1655.sorted.bam", SHARED / "fast5_files"
    return FIXTURE / "reads.fasta", FIXTURE / "reads.bam", FIXTURE / "fast5"


def fixture_batch(reads: Path, bam: Path, signal: Path, copies: int = 1) -> ReadBatch:
    """Every alignment record of the reads packed as one batch, `copies` times over (the basecalls read from
    a copy, whose signal index goes with it)."""
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "reads.fasta"
        local.write_text(reads.read_text())
        filt = AlignmentFilter()
        wanted = {a.read_id for a in iter_alignments(bam, filt) if isinstance(a, AlignmentRecord)}
        index = open_index(local, [signal])
        with Reference(REFERENCE) as ref:
            batches = list(offline_batches(iter_alignments(bam, filt), load_basecalls(local, wanted), index, ref,
                                           BatchLimits(), str(local)))  # fmt: skip
    return pack([r for rs, _ in batches for r in rs] * copies)


def cpu_pipeline(analyses: list) -> pipeline_module.Pipeline:
    """A one-thread CPU pipeline with these analyses after the core's stages."""
    options = pipeline_module.PipelineOptions(threads=1, cuda=pipeline_module.CudaOptions(disable=True))
    return pipeline_module.Pipeline(options, analyses)


def capture(reads: Path, bam: Path, signal: Path) -> tuple[tuple, tuple]:
    """(align_batch arguments, score_windows arguments) of one CPU pipeline run over the reads."""
    seen: dict[str, tuple] = {}
    align_batch = pipeline_module.align_batch

    def recording_align(reads, model, *args):
        seen["abea"] = (AbeaReads(*(getattr(reads, name).copy() for name in AbeaReads._fields)), model, *args)
        return align_batch(reads, model, *args)

    class Recorder:
        def score(self, jobs, inputs):
            seen["hmm"] = (*jobs, *inputs)
            return (*score_windows(*jobs, *inputs), None)

    pipeline_module.align_batch = recording_align
    pipe = cpu_pipeline([CpgCaller()])
    pipe.analysis("hmm").gpu = Recorder()
    pipe.run_batch(fixture_batch(reads, bam, signal))
    pipeline_module.align_batch = align_batch
    return seen["abea"], seen["hmm"]


def timed(fn, repeat: int) -> dict:
    """Fastest and median wall seconds, and fastest CPU seconds of this process (less sensitive to
    other work on a shared machine when numba runs one thread)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"min_s": round(min(wall), 4), "median_s": round(statistics.median(wall), 4),
            "min_cpu_s": round(min(cpu), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--fixture", action="store_true", help="the fixture reads even when ../shared is present")
    a = ap.parse_args()
    src = reads_source(a.fixture)
    abea_args, hmm_args = capture(*src)
    status = abea_args[0].status

    def abea():
        pipeline_module.align_batch(abea_args[0]._replace(status=status.copy()), *abea_args[1:])

    ll = score_windows(*hmm_args)
    report = {
        "reads": len(status),
        "bases": int(abea_args[0].seq_off[-1]),
        "windows": len(hmm_args[0]),
        "hmm_checksum": float(np.float64(ll[0]).sum() + np.float64(ll[1]).sum()),
        "abea": timed(abea, a.repeat),
        "hmm": timed(lambda: score_windows(*hmm_args), a.repeat),
    }
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
