"""Direct RNA (RNA002, RNA004) eventalign through the whole pipeline, GPU against CPU; run as a script.

tests/test_rna.py starts it with NUMBA_ENABLE_CUDASIM=1 (numba reads that variable when it is first
imported) or, where a GPU is present, without it. The simulated fixture reads of tests/data/rna go
through `Pipeline` with the eventalign stage twice: on the CPU, and with event detection (RNA's
windows) and ABEA on the GPU, the events turned 5'->3' between them. It prints one JSON object: both
TSVs per kit and the GPU's counts. The simulator runs each GPU thread as a Python thread, so it takes
the shortest read of each kit.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pysam

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "plugins"), str(ROOT / "gpu"), str(ROOT)]

from rna_sim import synthetic_rna004_model, write_text_model  # noqa: E402
from streamer.io.fastx import iter_fastx  # noqa: E402
from streamer.io.signal import read_signal  # noqa: E402
from streamer.pipeline.batch import ReadInput  # noqa: E402
from streamer.pipeline.chemistry import CHEMISTRIES, RNA002_KMER_MODEL  # noqa: E402
from streamer.pipeline.gpu import CudaOptions  # noqa: E402
from streamer.pipeline.stages import Pipeline, PipelineOptions  # noqa: E402
from streamer.pore.model import builtin_model_path, load_model  # noqa: E402
from streamer_gpu.target import SIMULATED  # noqa: E402
from streamer_plugins.eventalign import EventalignOptions, EventalignStage, format_tsv  # noqa: E402

DATA = ROOT / "tests" / "data" / "rna"


def fixture_reads(kit: str, n: int) -> list[ReadInput]:
    """The kit's `n` shortest fixture reads, as a source hands them over."""
    work = DATA / kit
    seqs = dict(iter_fastx(work / "reads.fastq"))
    refs = dict(iter_fastx(work / "transcripts.fa"))
    out = []
    with pysam.AlignmentFile(str(work / "reads.bam")) as bam:
        for rec in bam:
            rid = rec.query_name
            out.append(ReadInput(rid, seqs[rid], read_signal(work / "sim.blow5", rid), rec.reference_name,
                                 rec.reference_start, rec.reference_end, rec.is_reverse,
                                 np.array(rec.cigartuples, np.int32),
                                 refs[rec.reference_name][rec.reference_start : rec.reference_end]))  # fmt: skip
    return sorted(out, key=lambda r: len(r.seq))[:n]


def main() -> int:
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the simulator's -inf - -inf
    out: dict = {"simulated": SIMULATED}
    rna002 = load_model(builtin_model_path(RNA002_KMER_MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        models = {"rna002": builtin_model_path(RNA002_KMER_MODEL), "rna004": Path(tmp) / "rna004.model"}
        write_text_model(synthetic_rna004_model(rna002), models["rna004"])
        for kit, model in models.items():
            reads = fixture_reads(kit, 1 if SIMULATED else 4)
            options = EventalignOptions(print_read_names=True, signal_index=True)
            for name, cuda in (("cpu", CudaOptions(disable=True)),
                               ("gpu", CudaOptions(max_reads=8, max_bases=50_000, hmm=False, events=True))):
                pipeline = Pipeline(PipelineOptions(threads=2, kmer_model=model, cuda=cuda, chemistry=CHEMISTRIES[kit]),
                                    [EventalignStage()])  # fmt: skip
                result = pipeline.process(reads)
                out[f"{kit}_{name}"] = format_tsv(result.products["eventalign"], result.batch, result.read_ids, options)
                out[f"{kit}_{name}_abea"] = dataclasses.asdict(result.gpu_stats) if result.gpu_stats else None
                events = result.batch.stats.get("events")
                out[f"{kit}_{name}_events_on_gpu"] = bool(events is not None and events.on_gpu)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
