"""Daemon latency and throughput against `streamer call` on the same reads.

Two measurements, each with a fresh daemon watching an empty folder that `streamer replay`
fills:

- throughput: the whole run replayed at once (`--speed 0`); the daemon's sustained rate is the
  bases called divided by the time from the first file landing to the last batch committed,
  compared with `streamer call`'s rate (its own "wall time" line, which counts its file reading
  and batching too) on the same reads. Overhead = call rate / daemon rate - 1.
- latency: batch files landing every `--interval` seconds; for every batch file, the time from
  it landing (the later of its signal and basecall files; their modification time, which the
  move into place keeps) to the commit of the last of its reads, read back from the ledger.

With `--without-read-ahead` every repetition also times a daemon that reads each batch's
signal only once the batch is picked (`--no-read-ahead`), so both daemons meet the same load.

Usage (from the repository root; the shared 112-read data set is used when present):
    python benchmarks/daemon_latency.py [--source DIR] [--copies 4] [--batch-size 16] [--interval 2] [--repeat 3]
                                        [--without-read-ahead]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import h5py
import numpy as np
import pysam
from common import streamer

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "ecoli_2kb_region"
REFERENCE = ROOT / "tests" / "data" / "ecoli_k12_mg1655.fa.gz"


def finished_run(work: Path, source: Path | None, copies: int) -> Path:
    """A folder `streamer replay` and `streamer call` both read (fast5/, reads.fasta, reads.bam),
    holding `copies` copies of every read under new read ids, for a run long enough to time."""
    if source is None:
        source = SHARED if SHARED.is_dir() else ROOT / "tests" / "data" / "ecoli"
    fast5_dir = source / "fast5_files" if (source / "fast5_files").is_dir() else source / "fast5"
    bam = next(source.glob("*.bam"))
    run = work / "finished"
    (run / "fast5").mkdir(parents=True)
    rename = [lambda rid: rid] + [lambda rid, k=k: str(uuid.uuid5(uuid.NAMESPACE_OID, f"{k}:{rid}"))
                                  for k in range(1, copies)]
    for k, new_id in enumerate(rename):
        for f5 in sorted(fast5_dir.glob("*.fast5")):
            with h5py.File(f5) as src, h5py.File(run / "fast5" / f"{k}_{f5.name}", "w") as dst:
                for name in src:
                    src.copy(src[name], dst, name)
                for key, value in src.attrs.items():
                    dst.attrs[key] = value
                for read in dst["Raw/Reads"].values():
                    read.attrs["read_id"] = np.bytes_(new_id(read.attrs["read_id"].decode()))
    with pysam.FastxFile(str(source / "reads.fasta")) as fin, open(run / "reads.fasta", "w") as fout:
        reads = [(r.name, r.sequence) for r in fin]
        fout.writelines(f">{new_id(rid)}\n{seq}\n" for new_id in rename for rid, seq in reads)
    with pysam.AlignmentFile(str(bam)) as fin:
        records = [(rec.query_name, rec) for rec in fin]
        with pysam.AlignmentFile(str(run / "reads.bam"), "wb", template=fin) as fout:
            for new_id in rename:
                for rid, rec in records:
                    rec.query_name = new_id(rid)
                    fout.write(rec)
    return run


def call_rate(run: Path, out: Path, threads: int, *flags: str) -> dict:
    res = subprocess.run(streamer("call", "-r", run / "reads.fasta", "-b", run / "reads.bam", "-g", REFERENCE,
                                  "--signal", run / "fast5", "-o", out, "-t", threads, *flags),
                         capture_output=True, text=True, check=True)
    bases = int(re.search(r"bases processed:\s+(\d+)", res.stderr).group(1))
    wall = float(re.search(r"wall time:\s+([\d.]+) s", res.stderr).group(1))
    stages = sum(float(s) for s in re.findall(r"\w+ ([\d.]+)s \(", res.stderr))
    return {"bases": bases, "wall_s": wall, "stages_s": stages, "bases_per_s": bases / wall}


def daemon_run(run: Path, work: Path, threads: int, replay_args: list[str], *flags: str) -> dict:
    live, out = work / "live", work / "out"
    live.mkdir()
    log = open(work / "daemon.log", "w")
    daemon = subprocess.Popen(streamer("run", "--watch", live, "-g", REFERENCE, "-o", out, "-t", threads,
                                       "--grace", "1", "--settle", "1", "--max-wait", "1", *flags),
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        while not (out / "summary.json").exists():  # written once the daemon is watching
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited early: see {work / 'daemon.log'}")
            time.sleep(0.1)
        subprocess.run(streamer("replay", run, live, *replay_args), check=True, capture_output=True)
        if daemon.wait(600) != 0:
            raise SystemExit(f"daemon failed: see {work / 'daemon.log'}")
    finally:
        if daemon.poll() is None:
            daemon.kill()
        log.close()
    return measure(out)


def measure(out: Path) -> dict:
    """Per batch file: landing (mtime) to the commit of its last read, from the ledger."""
    db = sqlite3.connect(out / ".streamer" / "ledger.sqlite")
    files = {fid: (path, mtime / 1e9) for fid, path, mtime in db.execute("SELECT id, path, mtime_ns FROM files")}
    commits = dict(db.execute("SELECT id, at FROM batches"))
    per_signal_file: dict[str, float] = {}
    landed_first, committed_last = float("inf"), 0.0
    for sig, bc, batch in db.execute("SELECT signal_file, basecall_file, batch FROM reads WHERE batch IS NOT NULL"):
        landed = max(files[sig][1], files[bc][1])
        done = commits[batch]
        name = Path(files[sig][0]).name
        per_signal_file[name] = max(per_signal_file.get(name, 0.0), done - landed)
        landed_first, committed_last = min(landed_first, landed), max(committed_last, done)
    summary = json.loads((out / "summary.json").read_text())
    latencies = sorted(per_signal_file.values())
    span = committed_last - landed_first
    return {
        "bases": summary["bases"],
        "calls": summary["calls"],
        "batch_files": len(latencies),
        "latency_s": {"median": statistics.median(latencies), "max": latencies[-1], "min": latencies[0]},
        "first_landing_to_last_commit_s": span,
        "bases_per_s": summary["bases"] / span if span > 0 else float("nan"),
        "busy_s": summary["throughput"]["busy_s"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, help="finished run (fast5/ or fast5_files/, reads.fasta, one BAM)")
    p.add_argument("--copies", type=int, default=4, help="copies of every read, under new ids [4]")
    p.add_argument("--batch-size", type=int, default=16, help="reads per replayed batch file [16]")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between batch files for latency [2]")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeat", type=int, default=3, help="throughput repetitions (the best is kept) [3]")
    p.add_argument("--without-read-ahead", action="store_true",
                   help="also time the daemon with --no-read-ahead, alternating with the rest")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="streamer-bench-") as tmp:
        work = Path(tmp)
        run = finished_run(work, args.source, args.copies)
        calls, small_calls, daemons, plain = [], [], [], []
        for i in range(args.repeat):
            calls.append(call_rate(run, work / f"call{i}.tsv", args.threads))
            small_calls.append(call_rate(run, work / f"call{i}.tsv", args.threads, "-K", str(args.batch_size)))
            d = work / f"throughput{i}"
            d.mkdir()
            daemons.append(daemon_run(run, d, args.threads, ["--speed", "0", "--batch-size", str(args.batch_size)]))
            if args.without_read_ahead:
                d = work / f"throughput-plain{i}"
                d.mkdir()
                plain.append(daemon_run(run, d, args.threads, ["--speed", "0", "--batch-size", str(args.batch_size)],
                                        "--no-read-ahead"))
        lat_dir = work / "latency"
        lat_dir.mkdir()
        latency = daemon_run(run, lat_dir, args.threads, ["--interval", str(args.interval),
                                                          "--batch-size", str(args.batch_size)])
    best_call = max(calls, key=lambda c: c["bases_per_s"])
    best_small = max(small_calls, key=lambda c: c["bases_per_s"])
    best_daemon = max(daemons, key=lambda d: d["bases_per_s"])
    report = {
        "source": str(args.source or (SHARED if SHARED.is_dir() else "tests/data/ecoli")),
        "copies": args.copies,
        "threads": args.threads,
        "call": best_call,
        "call_daemon_sized_batches": best_small,
        "daemon_full_speed": best_daemon,
        # < 0: the daemon, warm before the files land, is faster than call, which also starts up
        "overhead_vs_call_wall": best_call["bases_per_s"] / best_daemon["bases_per_s"] - 1,
        "overhead_vs_call_wall_same_batches": best_small["bases_per_s"] / best_daemon["bases_per_s"] - 1,
        # the daemon's time in batches (signal reading, assembly, stages, writing, commit) over
        # call's time in the stages alone: what the daemon adds per batch, as an upper bound
        "overhead_busy_vs_call_stages": best_daemon["busy_s"] / best_call["stages_s"] - 1,
        "daemon_paced": latency,
        # every repetition, in order: the spread shows how much the machine's load moved them
        "bases_per_s_each": {"call": [round(c["bases_per_s"]) for c in calls],
                             "call_daemon_sized_batches": [round(c["bases_per_s"]) for c in small_calls],
                             "daemon": [round(d["bases_per_s"]) for d in daemons],
                             "daemon_without_read_ahead": [round(d["bases_per_s"]) for d in plain]},
    }
    if plain:
        best_plain = max(plain, key=lambda d: d["bases_per_s"])
        report["daemon_full_speed_without_read_ahead"] = best_plain
        report["overhead_vs_call_wall_without_read_ahead"] = best_call["bases_per_s"] / best_plain["bases_per_s"] - 1
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
