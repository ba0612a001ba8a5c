"""The host side of the methylation caller: `call_methylation` less its HMM, then `format_calls`.

Runs the CPU pipeline once over the reads (the shared 112 E. coli reads when present, else the
fixture reads in tests/data), keeping the batch as the caller stage gets it and the HMM's scores;
then times `call_methylation` with those scores handed back (so only the planning, the reference
lookups and the calls' context sequences are timed), `format_calls` on its calls, and the frequency
tables' `add_calls`, `--repeat` times each, reporting the fastest and median wall seconds, the fastest
CPU seconds, and microseconds per call. Meant for before/after comparisons in one session on one
machine (NUMBA_NUM_THREADS=1 gives the steadiest figures on a shared machine).

`--copies N` makes the batch the reads N times over (7: about the 4 M bases of a GPU box's batch);
`--threads T` times on T of numba's threads; `--beside-events` times the caller's planning kernel
(`_plan_jobs`, given the reads' sites) alone and again while another thread detects events on the batch's
signal without a pause, as a GPU box's front thread does beside its compute threads, and the finding of the
sites (`batch_sites`), which a GPU box's front thread does ahead.

    NUMBA_NUM_THREADS=1 python benchmarks/bench_calls_host.py [--repeat 21] [--fixture]
    python benchmarks/bench_calls_host.py --copies 7 --threads 16 --beside-events
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    sys.path.insert(0, str(_root))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from bench_cpu_kernels import cpu_pipeline, fixture_batch, reads_source, timed  # noqa: E402
from streamer.pipeline.events import DNA_PARAMS, detect_events  # noqa: E402
from streamer_plugins.cpg import calls as calls_module  # noqa: E402
from streamer_plugins.cpg.caller import CpgCaller  # noqa: E402
from streamer_plugins.cpg.calls import call_methylation, format_calls  # noqa: E402
from streamer_plugins.cpg.hmm import score_jobs  # noqa: E402
from streamer_plugins.cpg.sites import batch_sites  # noqa: E402
from streamer_plugins.outputs.bedmethyl import BedMethyl  # noqa: E402
from streamer_plugins.outputs.methfreq import MethFreq  # noqa: E402


class _Capture(CpgCaller):
    """The caller stage, keeping its batch (status as it came), the HMM's jobs, inputs and scores."""

    def __call__(self, batch, pipeline):
        self.batch, self.pipeline, self.status = batch, pipeline, batch.status.copy()

        def scorer(jobs, inputs):
            self.jobs, self.inputs = jobs, inputs
            self.scores = score_jobs(jobs, inputs)
            return self.scores

        with np.errstate(divide="ignore", invalid="ignore"):
            self.log_var = np.log(batch.post.exact[:, 2])
        batch.products["calls"] = call_methylation(batch, pipeline.kmer_model, self.meth_model,
                                                   batch.post.event_map, log_var=self.log_var, scorer=scorer)


def capture(reads: Path, bam: Path, signal: Path, copies: int = 1) -> _Capture:
    stage = _Capture()
    cpu_pipeline([stage]).run_batch(fixture_batch(reads, bam, signal, copies))
    return stage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--fixture", action="store_true", help="the fixture reads even when ../shared is present")
    ap.add_argument("--copies", type=int, default=1, help="the reads this many times over, as one batch [1]")
    ap.add_argument("--threads", type=int, default=1, help="numba threads for the timed calls [1]")
    ap.add_argument("--beside-events", action="store_true",
                    help="also time the planning kernel while another thread detects events without a pause")
    a = ap.parse_args()
    src = reads_source(a.fixture)
    c = capture(*src, copies=a.copies)
    batch = c.batch
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))

    def call():
        batch.status[:] = c.status
        return call_methylation(batch, c.pipeline.kmer_model, c.meth_model, batch.post.event_map,
                                log_var=c.log_var, scorer=lambda jobs, inputs: c.scores)

    planned = []
    plan_jobs = calls_module._plan_jobs
    calls_module._plan_jobs = lambda *args: planned.append(args) or plan_jobs(*args)
    calls = call()
    calls_module._plan_jobs = plan_jobs
    text = format_calls(calls, batch.read_ids, batch.ref_names)
    n = len(calls)
    report = {"reads": batch.n, "bases": int(batch.ref_seq_off[-1]), "calls": n, "threads": numba.get_num_threads(),
              "tsv_sha1": hashlib.sha1(text.encode()).hexdigest()}
    cases = {
        "call_methylation (HMM scores handed back)": call,
        "format_calls": lambda: format_calls(calls, batch.read_ids, batch.ref_names),
        "MethFreq.add_calls": lambda: MethFreq().add_calls(calls, batch.ref_names),
        "BedMethyl.add_calls": lambda: BedMethyl().add_calls(calls, batch.ref_names),
    }
    if a.beside_events:
        cases["the plan (`_plan_jobs`)"] = lambda: plan_jobs(*planned[0])
        table = c.pipeline.options.motif.table()
        cases["the reads' sites (`batch_sites`: on a GPU box, ahead on the front thread)"] = \
            lambda: batch_sites(batch.ref_seq, batch.ref_seq_off, batch.ref_next, table)
    for name, fn in cases.items():
        t = timed(fn, a.repeat)
        report[name] = {**t, "us_per_call": round(t["min_s"] / n * 1e6, 3)}
    if a.beside_events:
        report["the plan beside events"] = beside_events(lambda: plan_jobs(*planned[0]), batch, a.threads, a.repeat)
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


def beside_events(fn, batch, threads: int, repeat: int) -> dict:
    """`timed(fn)` while another thread, on `threads` of numba's threads, detects the batch's events over and over."""
    stop = threading.Event()

    def events() -> None:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))  # numba's count is per thread
        while not stop.is_set():
            detect_events(batch.signal, batch.signal_off, DNA_PARAMS)

    other = threading.Thread(target=events, daemon=True)
    other.start()
    try:
        return timed(fn, repeat)
    finally:
        stop.set()
        other.join()


if __name__ == "__main__":
    raise SystemExit(main())
