"""The stages in order, over one batch: the single entry point of `streamer call` and `streamer run`.

events -> method-of-moments scaling -> ABEA -> recalibration and QC -> CpG HMM.
Each stage is a numba kernel over the batch's flat arrays that releases the GIL and
runs in parallel over reads; reads a stage fails carry their `Skip` code onwards.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numba
import numpy as np

from streamer.abea import align_batch
from streamer.batch import CIGAR_M, ReadBatch, ReadInput, pack
from streamer.events import detect_events
from streamer.gpu_api import AbeaBatchStats, CudaOptions, HmmBatchStats, gpu_module
from streamer_plugins.cpg.calls import CALLS_HEADER, MethCalls, call_methylation, format_calls
from streamer_plugins.cpg.hmm_gpu import open_gpu_hmm
from streamer.poremodel import PoreModel, load_default_models, load_kmer_model
from streamer.postalign import PostAlign, recalibrate_batch
from streamer.scaling import estimate_scalings
from streamer.skips import Skip, Skipped


@dataclass(frozen=True)
class PipelineOptions:
    threads: int = os.cpu_count() or 1
    kmer_model: Path | None = None
    meth_model: Path | None = None
    cuda: CudaOptions = CudaOptions()


@dataclass
class BatchResult:
    """What one batch produced: calls, the reads that produced none and why, and stage times."""

    read_ids: list[str]
    ref_names: list[str]
    calls: MethCalls
    skipped: list[Skipped]
    n_bases: int
    timings: dict[str, float]
    gpu_stats: AbeaBatchStats | None = None  # the GPU ABEA stage's measurements, when it ran
    hmm_stats: HmmBatchStats | None = None  # the GPU HMM's measurements, when it ran
    extra: Any = None  # what the pipeline's `extra` stage made of the batch, when it has one

    @property
    def n_reads(self) -> int:
        return len(self.read_ids)

    @property
    def n_calls(self) -> int:
        return len(self.calls)

    def tsv_rows(self) -> list[str]:
        text = format_calls(self.calls, self.read_ids, self.ref_names)
        return text.splitlines(keepends=True)


class ExtraStage(Protocol):
    """A further output made from the aligned, recalibrated batch (the daemon's eventalign rows).

    It runs before the HMM, which fails the reads it finds no CpG in, so it sees every read
    that passed post-alignment QC.
    """

    name: str  # its key in the batch's stage timings

    def __call__(self, batch: ReadBatch, post: PostAlign, kmer_model: PoreModel) -> Any: ...


class Pipeline:
    """Models loaded and kernels compiled once; then `process` batch after batch.

    Batches may run on several threads at once (`streamer call` overlaps them); the GPU
    stages, whose device buffers serve one batch at a time, take turns.
    """

    TSV_HEADER = CALLS_HEADER
    calls_methylation = True  # False for pipelines without the CpG HMM: they need no methylation model

    def __init__(self, options: PipelineOptions = PipelineOptions(), extra: ExtraStage | None = None):
        self.options = options
        self.extra = extra  # before the warm-up batch, which compiles its kernels too
        self.meth_model: PoreModel | None = None
        if self.calls_methylation:
            self.kmer_model, self.meth_model = load_default_models(options.kmer_model, options.meth_model)
        else:  # any nucleotide model of any k: eventalign needs no CpG model
            self.kmer_model = load_kmer_model(options.kmer_model)
        numba.set_num_threads(max(1, min(options.threads, numba.config.NUMBA_NUM_THREADS)))
        self.gpu = gpu_module("").open_gpu(options.cuda)
        self.gpu_hmm = open_gpu_hmm(options.cuda) if self.gpu is not None else None
        self._gpu_lock = threading.Lock()
        self._warm_up()

    def process(self, reads: list[ReadInput]) -> BatchResult:
        return self.run_batch(pack(reads))

    def run_batch(self, batch: ReadBatch) -> BatchResult:
        timings: dict[str, float] = {}

        @contextmanager
        def stage(name, chunk=1):
            # Reads differ in length by orders of magnitude: hand them out a few at a time
            # (numba's default splits the range evenly, leaving one thread with the long reads).
            t0 = time.perf_counter()
            with numba.parallel_chunksize(chunk):
                yield
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0

        kmer = self.kmer_model
        with stage("events"):
            batch.ev_off, batch.ev_start, batch.ev_length, batch.ev_mean, batch.ev_stdv = detect_events(
                batch.signal, batch.signal_off
            )
        with stage("scaling"):
            batch.shift, batch.scale, batch.var = estimate_scalings(
                batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, kmer
            )
        gpu_stats = None
        with stage("abea"):
            args = (batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.status, batch.shift, batch.scale, kmer)
            if self.gpu is None:
                aln = align_batch(*args)
            else:
                with self._gpu_lock:
                    aln, gpu_stats = self.gpu.align(*args)
            batch.aln_off, batch.aln_kmer, batch.aln_event = aln.aln_off, aln.aln_kmer, aln.aln_event
        with stage("postalign"):
            post = recalibrate_batch(
                batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer, batch.aln_event,
                batch.aln_off, batch.status, batch.shift, batch.scale, batch.var, kmer,
            )  # fmt: skip
            batch.shift, batch.scale, batch.var = post.shift, post.scale, post.var
        extra = None
        if self.extra is not None:
            with stage(self.extra.name):
                extra = self.extra(batch, post, kmer)
        hmm_stats: list[HmmBatchStats] = []

        def score_on_gpu(*args):
            with self._gpu_lock:
                ll_u, ll_m, st = self.gpu_hmm.score(*args)
            hmm_stats.append(st)
            return ll_u, ll_m

        with stage("hmm", chunk=8):
            # f5c takes log var from the double var (NaN for reads not recalibrated, which are not scored)
            with np.errstate(divide="ignore", invalid="ignore"):
                log_var = np.log(post.exact[:, 2])
            args = (batch, kmer, self.meth_model, post.events_per_base)
            if self.gpu_hmm is None:
                calls = call_methylation(*args, log_var=log_var)
            else:
                calls = call_methylation(*args, log_var=log_var, scorer=score_on_gpu)
        skipped = [
            Skipped(batch.read_ids[i], Skip(int(batch.status[i])), f"signal from {batch.signal_paths[i]}")
            for i in np.flatnonzero(batch.status != Skip.OK).tolist()
        ]
        return BatchResult(batch.read_ids, batch.ref_names, calls, skipped, batch.n_bases, timings, gpu_stats,
                           hmm_stats[0] if hmm_stats else None, extra)  # fmt: skip

    def _warm_up(self) -> None:
        """Compile (or load from cache) every kernel on a synthetic read before real data arrives."""
        self.run_batch(pack([synthetic_read(self.kmer_model)]))


def synthetic_read(model: PoreModel, n_bases: int = 600, samples_per_kmer: int = 9, seed: int = 7) -> ReadInput:
    """A read whose signal follows the model exactly (plus noise), aligned end to end to itself."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(list("ACGT"), n_bases))
    ranks = [int(seq[i : i + model.k].translate(str.maketrans("ACGT", "0123")), 4) for i in range(n_bases - model.k + 1)]
    levels = np.repeat(model.level_mean[ranks], samples_per_kmer)
    signal = (levels + rng.normal(0, 1.0, len(levels))).astype(np.float32)
    return ReadInput(
        read_id="warm-up",
        seq=seq,
        signal_pa=signal,
        sample_rate=4000.0,
        ref_name="synthetic",
        ref_start=0,
        ref_end=n_bases,
        rc=False,
        cigar=np.array([[CIGAR_M, n_bases]], dtype=np.int32),
        ref_seq=seq,
    )
