"""The methylation caller as a stage of the chain (`streamer.analyses` entry point `cpg`).

It runs after recalibration on the reads still going, scores every group of the pipeline's motif
(`PipelineOptions.motif`: CpG by default, or GpC, dam, dcm) with the profile HMM (on the GPU when
ABEA runs on one and `--disable-cuda-hmm` is not given) and keeps the calls, a `MethCalls`, in
`batch.products["calls"]`. Reads without a site it can score are failed.
Made with `calls=False` (the daemon on R10.4.1 data without the CpG model) it scores nothing and
keeps empty calls, so the outputs made from calls stay as they are and the others go on.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from streamer.pipeline.batch import ReadBatch
from streamer.pipeline.stages import Pipeline
from streamer.pore.model import PoreModel, load_default_models
from streamer_plugins.cpg.calls import MethCalls, call_methylation
from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs
from streamer_plugins.cpg.hmm_gpu import open_gpu_hmm
from streamer_plugins.cpg.sites import batch_sites
from streamer_plugins.texts import Texts

CALLS = "calls"  # its key in `batch.products`
SITES = "hmm.sites"  # the reads' sites found ahead (`CpgCaller.prepare`), until the stage takes them


class CpgCaller:
    name = "hmm"  # its key in the stage timings
    chunk = 8

    def __init__(self, calls: bool = True) -> None:
        self.calls = calls
        self.meth_model: PoreModel | None = None
        self.gpu = None  # a scorer set from outside (tests, benchmarks), used in place of the devices' GPU HMMs

    def open(self, pipeline: Pipeline) -> None:
        if not self.calls:
            return
        _, self.meth_model = load_default_models(pipeline.options.kmer_model, pipeline.options.meth_model)
        for device in pipeline.devices:
            device.parts[self.name] = open_gpu_hmm(replace(pipeline.options.cuda, dev_id=device.dev_id))

    def prepare(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        """The reads' motif sites, which need the reference alone: found on the front thread, ahead of the batch's
        ABEA, so that its compute thread only places them on the events (`Stage.prepare`)."""
        if self.calls:
            sites = pipeline.options.motif.table()
            batch.products[SITES] = batch_sites(batch.ref_seq, batch.ref_seq_off, batch.ref_next, sites)

    def __call__(self, batch: ReadBatch, pipeline: Pipeline) -> None:
        if not self.calls:
            batch.products[CALLS] = no_calls()
            return
        post = batch.post
        # f5c takes log var from the double var (NaN for reads not recalibrated, which are not scored)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_var = np.log(post.exact[:, 2])
        args = (batch, pipeline.kmer_model, self.meth_model, post.event_map)
        motif = pipeline.options.motif
        found = batch.products.pop(SITES, None)
        device = pipeline.device
        gpu = self.gpu if self.gpu is not None else device.parts.get(self.name) if device is not None else None
        if gpu is None:
            batch.products[CALLS] = call_methylation(*args, motif=motif, log_var=log_var, found=found)
            return

        def score_on_gpu(jobs: HmmJobs, inputs: HmmInputs):
            with device.lock if device is not None else pipeline.gpu_lock:
                ll_u, ll_m, stats = gpu.score(jobs, inputs)
            batch.stats.setdefault(self.name, stats)
            return ll_u, ll_m

        batch.products[CALLS] = call_methylation(*args, motif=motif, log_var=log_var, scorer=score_on_gpu, found=found)


def no_calls() -> MethCalls:
    empty = np.zeros(0, np.int64)
    return MethCalls(read=empty, start=empty, end=empty, strand=np.zeros(0, np.int8), llr=np.zeros(0),
                     ll_meth=np.zeros(0), ll_unmeth=np.zeros(0), num_motifs=np.zeros(0, np.int32),
                     sequence=Texts.of([]))
