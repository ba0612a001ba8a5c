"""Throughput of `streamer pileup`: calls and read bases aggregated per second.

Builds a large modBAM at run time from the E. coli reads of tests/data/ecoli (real sequences
and alignments): each read gets dorado-style `C+h?` / `C+m?` calls at the CpG Cs of the read as
sequenced (random ML values), and is replicated with new read ids at shifted reference
positions until `--mbases` of reads; the file is coordinate-sorted and indexed. Then it times

- `aggregate`: PileupCounts.add over the records (tag parsing, calls, per-site tallies), the
  part the daemon would run per batch;
- `command`: the whole `streamer pileup` command (both passes: threshold estimation from
  10,042 sampled reads, then the pileup and the bedMethyl), default options and with `--cpg`;
- `daemon`: the same reads in random order as MinKNOW's `bam_pass/` batch files of 4,000
  reads, in a finished run folder, taken in by the daemon (each BAM registered in the ledger,
  its calls counted, recorded, `modkit.bed` written at the end), with its default `modcalls`
  options (`--cpg`, threshold estimated from the first BAM); no signal files, so no HMM.

A PromethION flow cell yields about 1 Mbase of reads per second, so four need 4 Mbases/s.

    python benchmarks/bench_pileup.py --mbases 200
"""

from __future__ import annotations

import argparse
import array
import json
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import pysam

from streamer import config
from streamer.cli import main
from streamer.daemon.shell import Daemon
from streamer.io.reference import Reference
from streamer_plugins.modbase.caller import Thresholds
from streamer_plugins.modbase.pileup import CallOptions, PileupCounts

ROOT = Path(__file__).resolve().parents[1]
READS = ROOT / "tests" / "data" / "ecoli" / "reads.bam"
REFERENCE = ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"
_RC = str.maketrans("ACGT", "TGCA")


def mod_tags(rec: pysam.AlignedSegment, rng: random.Random) -> tuple[str, array.array, int]:
    """C+h? and C+m? at every CpG C of the read as sequenced; returns MM, ML and the number of calls."""
    seq = rec.query_sequence
    fwd = seq.translate(_RC)[::-1] if rec.is_reverse else seq
    cs = [i for i, b in enumerate(fwd) if b == "C"]
    called = [k for k, i in enumerate(cs) if fwd[i + 1:i + 2] == "G"]
    deltas = np.diff(np.array([-1] + called)) - 1
    skips = ",".join(map(str, deltas))
    h = [rng.randrange(0, 40) for _ in called]
    m = [rng.randrange(0, 256 - x) for x in h]
    return f"C+h?,{skips};C+m?,{skips};", array.array("B", h + m), 2 * len(called)


def build(path: Path, mbases: float, seed: int = 1) -> tuple[int, int, int]:
    """Write the replicated modBAM; returns (reads, bases, calls)."""
    rng = random.Random(seed)
    with pysam.AlignmentFile(str(READS)) as bam:
        header = bam.header
        originals = [r for r in bam.fetch(until_eof=True) if not (r.is_secondary or r.is_supplementary or r.is_unmapped)]
    genome = header.lengths[0]
    per_round = sum(r.query_length for r in originals)
    rounds = max(1, int(mbases * 1e6 // per_round))
    placed = []
    for k in range(rounds):
        for i, r in enumerate(originals):
            span = r.reference_end - r.reference_start
            placed.append(((r.reference_start + k * 7919) % (genome - span), i, k))
    placed.sort()
    tags = [mod_tags(r, rng) for r in originals]
    n_bases = n_calls = 0
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        for start, i, k in placed:
            r = pysam.AlignedSegment.fromstring(originals[i].to_string(), header)
            r.query_name = f"{r.query_name}_{k}"
            r.reference_start = start
            mm, ml, n = tags[i]
            r.set_tag("MM", mm, value_type="Z")
            r.set_tag("ML", ml)
            out.write(r)
            n_bases += r.query_length
            n_calls += n
    pysam.index(str(path))
    return len(placed), n_bases, n_calls


def time_aggregate(path: Path) -> tuple[float, int]:
    with pysam.AlignmentFile(str(path)) as bam:
        contigs = list(zip(bam.references, bam.lengths))
        records = [(r, str(path)) for r in bam.fetch(until_eof=True)]
    counts = PileupCounts(contigs, CallOptions(Thresholds()))
    counts.add(records[:50])  # compile
    counts = PileupCounts(contigs, CallOptions(Thresholds()))
    t0 = time.perf_counter()
    for i in range(0, len(records), 2000):
        counts.add(records[i:i + 2000])
    return time.perf_counter() - t0, counts.n_calls


def time_command(args: list[str]) -> float:
    t0 = time.perf_counter()
    assert main(args) == 0
    return time.perf_counter() - t0


class _NoPipeline:
    """The daemon's pipeline where no read has signal: never called."""

    def process(self, reads):
        raise AssertionError("no read has signal")


def time_daemon(path: Path, tmp: Path, per_file: int = 4000, seed: int = 2) -> tuple[float, dict]:
    """Wall seconds from the daemon's start to the end of its run over `bam_pass/`, and its modcalls summary."""
    run, out = tmp / "run", tmp / "daemon-out"
    (run / "bam_pass").mkdir(parents=True)
    with pysam.AlignmentFile(str(path)) as bam:
        header = bam.header
        records = list(bam.fetch(until_eof=True))
    random.Random(seed).shuffle(records)
    for i in range(0, len(records), per_file):
        with pysam.AlignmentFile(str(run / "bam_pass" / f"batch_{i // per_file}.bam"), "wb", header=header) as f:
            for r in records[i:i + per_file]:
                f.write(r)
    (run / "final_summary_bench.txt").write_text("bench\n")
    cfg = config.build({"watch.dir": run, "reference.genome": REFERENCE, "output.dir": out, "watch.settle": 0.1,
                        "watch.poll_interval": 0.1, "end.final_summary_grace": 0.1, "output.bedmethyl": False})
    with Reference(REFERENCE) as reference:
        t0 = time.perf_counter()
        daemon = Daemon(cfg, _NoPipeline(), reference)
        assert daemon.run() == 0
        secs = time.perf_counter() - t0
        daemon.close()
    return secs, json.loads((out / "summary.json").read_text())["modcalls"]


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mbases", type=float, default=200.0, help="read bases in the built modBAM [200]")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the modBAM here instead of a temporary folder")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = opts.keep or Path(tmp) / "big.bam"
        t0 = time.perf_counter()
        n_reads, n_bases, n_calls = build(path, opts.mbases)
        print(f"built {path.name}: {n_reads} reads, {n_bases / 1e6:.1f} Mbases, {n_calls / 1e6:.2f} M calls "
              f"({time.perf_counter() - t0:.0f} s); {os.cpu_count()} CPUs visible")
        secs, counted = time_aggregate(path)
        print(f"aggregate: {secs:.1f} s, {counted / secs / 1e6:.2f} M calls/s, {n_bases / secs / 1e6:.1f} Mbases/s")
        bed = Path(tmp) / "out.bed"
        for label, extra in (("command, default options", []),
                             ("command, --cpg --ref", ["--cpg", "--ref", str(REFERENCE)])):
            secs = time_command(["pileup", str(path), "-o", str(bed), *extra])
            print(f"{label}: {secs:.1f} s, {n_calls / secs / 1e6:.2f} M calls/s, {n_bases / secs / 1e6:.1f} Mbases/s")
        secs, summary = time_daemon(path, Path(tmp))
        print(f"daemon, {summary['files']} BAMs of 4,000 reads ({summary['pileup_options']}): {secs:.1f} s, "
              f"{n_calls / secs / 1e6:.2f} M calls/s, {n_bases / secs / 1e6:.1f} Mbases/s "
              f"({summary['calls']} calls passed the threshold)")


if __name__ == "__main__":
    main_()
