"""The stage chain over one batch: the one chain `streamer call`, `eventalign` and `run` drive.

    events -> method-of-moments scaling -> ABEA -> recalibration and QC -> analyses

The first four stages are the core's (`CORE_STAGES`); the analyses after them (the CpG
caller, eventalign) come from plugins through `streamer.registry` and are handed to
`Pipeline`. Each stage is a numba kernel over the batch's flat arrays that releases the GIL
and runs in parallel over reads; it reads the batch record's fields, writes its own, and
sets the `Skip` code of the reads it fails, which later stages pass over. An analysis keeps
what it made in `batch.products[its name]`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numba
import numpy as np

from streamer.abea import align_batch
from streamer.batch import CIGAR_M, ReadBatch, ReadInput, pack
from streamer.events import detect_events
from streamer.gpu_api import AbeaBatchStats, CudaOptions, HmmBatchStats, gpu_module
from streamer.io.fast5 import SignalRecord
from streamer.poremodel import PoreModel, load_kmer_model
from streamer.postalign import recalibrate_batch
from streamer.scaling import estimate_scalings
from streamer.skips import Skip, Skipped


@dataclass(frozen=True)
class PipelineOptions:
    threads: int = os.cpu_count() or 1
    kmer_model: Path | None = None
    meth_model: Path | None = None
    cuda: CudaOptions = CudaOptions()


class Stage(Protocol):
    """One step of the chain. `open` runs once, before the warm-up batch (models, devices)."""

    name: str  # its key in the batch's stage timings (and in `batch.products` for an analysis)
    chunk: int  # reads handed to a thread at a time

    def open(self, pipeline: Pipeline) -> None: ...

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None: ...


class _CoreStage:
    chunk = 1  # reads differ in length by orders of magnitude: hand them out one at a time

    def open(self, pipeline: Pipeline) -> None:
        pass


class DetectEvents(_CoreStage):
    name = "events"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        batch.ev_off, batch.ev_start, batch.ev_length, batch.ev_mean, batch.ev_stdv = detect_events(
            batch.signal, batch.signal_off
        )


class EstimateScalings(_CoreStage):
    name = "scaling"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        batch.shift, batch.scale, batch.var = estimate_scalings(
            batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, pipeline.kmer_model
        )


class AlignEvents(_CoreStage):
    """ABEA, on the GPU when the pipeline has one (its measurements in `batch.stats["abea"]`)."""

    name = "abea"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        args = (batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, batch.shift, batch.scale,
                pipeline.kmer_model)  # fmt: skip
        if pipeline.gpu is None:
            aln = align_batch(*args)
        else:
            with pipeline.gpu_lock:
                aln, batch.stats[self.name] = pipeline.gpu.align(*args)
        batch.aln_off, batch.aln_kmer, batch.aln_event = aln.aln_off, aln.aln_kmer, aln.aln_event


class Recalibrate(_CoreStage):
    """Shift, scale and var from the alignment, and QC; the method-of-moments values are kept."""

    name = "postalign"

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        post = recalibrate_batch(
            batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer, batch.aln_event,
            batch.aln_off, batch.status, batch.shift, batch.scale, batch.var, pipeline.kmer_model,
        )  # fmt: skip
        batch.post = post
        batch.mom_scalings = (batch.shift, batch.scale, batch.var)
        batch.shift, batch.scale, batch.var = post.shift, post.scale, post.var


CORE_STAGES: tuple[type[_CoreStage], ...] = (DetectEvents, EstimateScalings, AlignEvents, Recalibrate)


@dataclass
class BatchResult:
    """One batch after the chain: the batch record (with each analysis's products), the reads that
    gave nothing and why, and stage times."""

    batch: ReadBatch
    skipped: list[Skipped]
    timings: dict[str, float]

    @property
    def read_ids(self) -> list[str]:
        return self.batch.read_ids

    @property
    def ref_names(self) -> list[str]:
        return self.batch.ref_names

    @property
    def n_reads(self) -> int:
        return self.batch.n

    @property
    def n_bases(self) -> int:
        return self.batch.n_bases

    @property
    def products(self) -> dict[str, Any]:
        return self.batch.products

    @property
    def gpu_stats(self) -> AbeaBatchStats | None:
        """The GPU ABEA stage's measurements, when it ran."""
        return self.batch.stats.get("abea")

    @property
    def hmm_stats(self) -> HmmBatchStats | None:
        """The GPU HMM's measurements, when it ran."""
        return self.batch.stats.get("hmm")


class Pipeline:
    """Models loaded and kernels compiled once; then `run_batch` batch after batch.

    `analyses` are the stages after the core's, in order. Batches may run on several threads
    at once (`streamer call` overlaps them); the GPU stages, whose device buffers serve one
    batch at a time, take turns on `gpu_lock`. `gpu` is the GPU ABEA stage, or None; an analysis
    opens its own GPU part only when it is set.
    """

    def __init__(self, options: PipelineOptions = PipelineOptions(), analyses: list[Stage] | tuple[Stage, ...] = ()):
        self.options = options
        self.kmer_model: PoreModel = load_kmer_model(options.kmer_model)  # any k; a caller checks its own model
        self.stages: list[Stage] = [stage() for stage in CORE_STAGES] + list(analyses)
        numba.set_num_threads(max(1, min(options.threads, numba.config.NUMBA_NUM_THREADS)))
        self.gpu = gpu_module("").open_gpu(options.cuda)
        self.gpu_lock = threading.Lock()
        for stage in self.stages:
            stage.open(self)
        self._warm_up()

    def analysis(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def process(self, reads: list[ReadInput]) -> BatchResult:
        return self.run_batch(pack(reads))

    def run_batch(self, batch: ReadBatch) -> BatchResult:
        timings: dict[str, float] = {}
        for stage in self.stages:
            t0 = time.perf_counter()
            with numba.parallel_chunksize(stage.chunk):
                stage(batch, self)
            timings[stage.name] = timings.get(stage.name, 0.0) + time.perf_counter() - t0
        return BatchResult(batch, skipped_of(batch), timings)

    def _warm_up(self) -> None:
        """Compile (or load from cache) every kernel on a synthetic read before real data arrives."""
        self.run_batch(pack([synthetic_read(self.kmer_model)]))


def skipped_of(batch: ReadBatch) -> list[Skipped]:
    """The batch's records the stages failed, with their reasons."""
    return [
        Skipped(batch.read_ids[i], Skip(int(batch.status[i])), f"signal from {batch.signal_paths[i]}")
        for i in np.flatnonzero(batch.status != Skip.OK).tolist()
    ]


def synthetic_read(model: PoreModel, n_bases: int = 600, samples_per_kmer: int = 9, seed: int = 7) -> ReadInput:
    """A read whose signal follows the model exactly (plus noise), aligned end to end to itself."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(list("ACGT"), n_bases))
    ranks = [int(seq[i : i + model.k].translate(str.maketrans("ACGT", "0123")), 4) for i in range(n_bases - model.k + 1)]
    levels = np.repeat(model.level_mean[ranks], samples_per_kmer)
    signal = levels + rng.normal(0, 1.0, len(levels))
    unit = 0.125  # pA per ADC step
    raw = np.round(signal / unit).astype(np.int16)
    return ReadInput(
        read_id="warm-up",
        seq=seq,
        signal=SignalRecord("warm-up", raw, digitisation=8.0, offset=0.0, range=1.0, sample_rate=4000.0),
        ref_name="synthetic",
        ref_start=0,
        ref_end=n_bases,
        rc=False,
        cigar=np.array([[CIGAR_M, n_bases]], dtype=np.int32),
        ref_seq=seq,
    )
