"""The host side of the methylation caller: `call_methylation` less its HMM, then `format_calls`.

Runs the CPU pipeline once over the reads (the shared 112 E. coli reads when present, else the
fixture reads in tests/data), keeping the batch as the caller stage gets it and the HMM's scores;
then times `call_methylation` with those scores handed back (so only the planning, the reference
lookups and the calls' context sequences are timed), `format_calls` on its calls, and the frequency
tables' `add_calls`, `--repeat` times each, reporting the fastest and median wall seconds, the fastest
CPU seconds, and microseconds per call. Meant for before/after comparisons in one session on one
machine (NUMBA_NUM_THREADS=1 gives the steadiest figures on a shared machine).

    NUMBA_NUM_THREADS=1 python benchmarks/bench_calls_host.py [--repeat 21] [--fixture]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    sys.path.insert(0, str(_root))

import numpy as np  # noqa: E402

from bench_cpu_kernels import cpu_pipeline, fixture_batch, reads_source, timed  # noqa: E402
from streamer_plugins.cpg.caller import CpgCaller  # noqa: E402
from streamer_plugins.cpg.calls import call_methylation, format_calls  # noqa: E402
from streamer_plugins.cpg.hmm import score_jobs  # noqa: E402
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
    a = ap.parse_args()
    src = reads_source(a.fixture)
    c = capture(*src)
    batch = c.batch

    def call():
        batch.status[:] = c.status
        return call_methylation(batch, c.pipeline.kmer_model, c.meth_model, batch.post.event_map,
                                log_var=c.log_var, scorer=lambda jobs, inputs: c.scores)

    calls = call()
    text = format_calls(calls, batch.read_ids, batch.ref_names)
    n = len(calls)
    report = {"reads": batch.n, "calls": n, "tsv_sha1": hashlib.sha1(text.encode()).hexdigest()}
    cases = {
        "call_methylation (HMM scores handed back)": call,
        "format_calls": lambda: format_calls(calls, batch.read_ids, batch.ref_names),
        "MethFreq.add_calls": lambda: MethFreq().add_calls(calls, batch.ref_names),
        "BedMethyl.add_calls": lambda: BedMethyl().add_calls(calls, batch.ref_names),
    }
    for name, fn in cases.items():
        t = timed(fn, a.repeat)
        report[name] = {**t, "us_per_call": round(t["min_s"] / n * 1e6, 3)}
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
