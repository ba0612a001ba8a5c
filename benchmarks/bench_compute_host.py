"""A GPU box's compute thread, its host side timed on the CPU: the steps around the ABEA and HMM kernels.

Captures a batch as the CpG caller gets it (the shared 112 E. coli reads, else the fixture reads, packed
`--copies` times into one batch: 4 copies of the shared reads, 2.6 Mbases, are about a batch of the GPU
box's memory plan), then times each step at `-t` numba threads, launched under the chunk size `--chunk`
(the CpG caller's 8 by default; 1 is the size a thread could keep from another stage before
`streamer.pipeline.chunks`):

  recalibration        `recalibrate_batch`, the Recalibrate stage
  methylation plan     `call_methylation` with the HMM's scores handed back
  GPU HMM job packing  `pack_jobs`, then `launch_order`, as `CudaHmm.score` runs them before its copies
  ABEA packing         `CudaAbea._pack` of every read but each 50th (the gather, where some go to the CPU)
  calls TSV rows       `format_calls`, which the finishing thread runs (at its own size, 0)

reporting the fastest and median milliseconds of `--repeat`. Meant for before/after comparisons in one
session on one machine.

    python benchmarks/bench_compute_host.py [--copies 4] [-t 2] [--chunk 8] [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    sys.path.insert(0, str(_root))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from bench_calls_host import capture  # noqa: E402
from bench_cpu_kernels import reads_source, timed  # noqa: E402
from streamer.pipeline.abea import AbeaParams, abea_arrays  # noqa: E402
from streamer.pipeline.chunks import chunked  # noqa: E402
from streamer.pipeline.postalign import PostalignReads, recalibrate_batch  # noqa: E402
from streamer_gpu.abea import CudaAbea  # noqa: E402
from streamer_plugins.cpg.calls import call_methylation, format_calls  # noqa: E402
from streamer_plugins.cpg.hmm_jobs import DEFAULT_MAX_KMERS, launch_order, pack_jobs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--fixture", action="store_true", help="the fixture reads even when ../shared is present")
    a = ap.parse_args()
    src = reads_source(a.fixture)
    c = capture(*src, copies=a.copies)
    batch, model = c.batch, c.pipeline.kmer_model
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    jobs, inputs = c.jobs, c.inputs

    def recalibrate():
        recalibrate_batch(PostalignReads(batch.seq, batch.seq_off, batch.ev_mean, batch.ev_off, batch.aln_kmer,
                                         batch.aln_event, batch.aln_off, c.status.copy(), *batch.mom_scalings), model)

    def plan():
        batch.status[:] = c.status
        call_methylation(batch, model, c.meth_model, batch.post.event_map, log_var=c.log_var,
                         scorer=lambda jobs, inputs: c.scores)

    def hmm_jobs():
        return pack_jobs(*jobs, inputs.ref_seq_off, inputs.ev_off, inputs.k, DEFAULT_MAX_KMERS)

    packed = hmm_jobs()
    calls = batch.products["calls"]

    reads, some = abea_arrays(batch), np.flatnonzero(np.arange(batch.n) % 50 != 0)
    report = {"reads": batch.n, "bases": batch.n_bases, "hmm_jobs": len(jobs.read), "threads": numba.get_num_threads(),
              "chunk": a.chunk}
    cases = {"recalibration": recalibrate, "methylation plan": plan, "GPU HMM job packing": hmm_jobs,
             "GPU HMM launch order": lambda: launch_order(np.flatnonzero(packed[-1]), packed[-2], True),
             "ABEA packing": lambda: CudaAbea._pack(some, reads, model.k, AbeaParams().skip_prob),
             "calls TSV rows (the finishing thread's)": lambda: format_calls(calls, batch.read_ids, batch.ref_names)}
    with chunked(a.chunk):
        for name, fn in cases.items():
            t = timed(fn, a.repeat)
            report[name] = {"min_ms": round(t["min_s"] * 1e3, 2), "median_ms": round(t["median_s"] * 1e3, 2)}
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
