"""Signal reading throughput for FAST5, POD5 and BLOW5 copies of the same reads.

Replicates the shared E. coli reads (new read ids, same signal and calibration) to
`--reads` reads, written in files of `--per-file` reads as
  FAST5  multi-read, VBZ (what MinKNOW wrote from 2020 until POD5),
  POD5   the official `pod5` writer (VBZ),
  BLOW5  pyslow5's writer (zlib records, svb-zd signal, slow5tools' default),
under `bench-work/signal/` (git-ignored; reused while the parameters match). Then, per
format, from the page cache (decoding cost, not disk):
  list ids   `signal_read_ids` over all files (BLOW5: includes building its index),
  iterate    `iter_signal` + `to_pa` over all files, in 1 process and in P processes
             (one file per task; processes because h5py serialises threads on one lock),
  random     `read_signal` by id in shuffled order, one process (what `call` does today),
  grouped    the same reads through `read_signals`, one call per file (one open each),
  tasks      every read as `streamer call`'s reader tasks (`load_chunk`, 32 reads each) on P
             threads, as a small memory budget runs them: reads/s and the CPU seconds the
             process spent (threads scale where decoding leaves the GIL),
reporting reads/s and MB/s of signal (int16 samples, 2 bytes each), best of `--repeat`.

    python benchmarks/bench_signal_read.py --reads 3000 --per-file 500 -p 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from streamer.io.fast5 import iter_fast5
from streamer.io.pod5 import write_pod5
from streamer.io.signal import iter_signal, read_signal, read_signals, signal_read_ids
from streamer.io.signal_record import SignalRecord
from streamer.io.slow5 import write_blow5
from streamer.io.signal_chunks import load_chunk
from streamer.pipeline.signal_pool import READS_PER_TASK, read_tasks

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "ecoli_2kb_region" / "fast5_files"
FORMATS = {"fast5": ".fast5", "pod5": ".pod5", "blow5": ".blow5"}
_VBZ = {"compression": 32020, "compression_opts": (0, 2, 1, 1)}  # as ont-fast5-api writes VBZ


def replicated(src: Path, n_reads: int) -> Iterator[SignalRecord]:
    """`n_reads` reads cycling over the source reads, each with a fresh UUID read id."""
    base = [rec for path in sorted(src.glob("*.fast5")) for rec in iter_fast5(path)]
    for i in range(n_reads):
        rec = base[i % len(base)]
        new_id = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{rec.read_id}/{i // len(base)}"))
        yield SignalRecord(new_id, rec.raw, rec.digitisation, rec.offset, rec.range, rec.sample_rate)


def write_fast5(path: Path, records: list[SignalRecord]) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["file_version"] = "2.2"
        f.attrs["file_type"] = "multi-read"
        for rec in records:
            group = f.create_group(f"read_{rec.read_id}")
            raw = group.create_group("Raw")
            raw.attrs["read_id"] = rec.read_id
            raw.create_dataset("Signal", data=rec.raw, chunks=(len(rec.raw),), **_VBZ)
            channel = group.create_group("channel_id")
            for key, value in (("digitisation", rec.digitisation), ("offset", rec.offset),
                               ("range", rec.range), ("sampling_rate", rec.sample_rate)):  # fmt: skip
                channel.attrs[key] = np.float64(value)


WRITERS: dict[str, Callable[[Path, list[SignalRecord]], object]] = {
    "fast5": write_fast5, "pod5": write_pod5, "blow5": write_blow5,
}  # fmt: skip


def build(work: Path, n_reads: int, per_file: int) -> dict[str, list[Path]]:
    params = {"reads": n_reads, "per_file": per_file, "source": str(SHARED)}
    manifest = work / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()) == params:
        return {fmt: sorted((work / fmt).glob(f"*{ext}")) for fmt, ext in FORMATS.items()}
    shutil.rmtree(work, ignore_errors=True)
    reads = list(replicated(SHARED, n_reads))
    for fmt, ext in FORMATS.items():
        (work / fmt).mkdir(parents=True)
        t0 = time.perf_counter()
        for k in range(0, n_reads, per_file):
            WRITERS[fmt](work / fmt / f"batch{k // per_file:04d}{ext}", reads[k : k + per_file])
        print(f"wrote {fmt} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    manifest.write_text(json.dumps(params))
    return build(work, n_reads, per_file)


def read_file(path: Path) -> tuple[int, int]:
    """(reads, samples) of one file, converting to pA as the pipeline does."""
    reads = samples = 0
    for rec in iter_signal(path):
        samples += len(rec.to_pa())
        reads += 1
    return reads, samples


def _warm(_: int) -> None:
    time.sleep(0.3)


def best(repeat: int, fn: Callable[[], tuple[int, int]]) -> tuple[float, int, int]:
    times, out = [], (0, 0)
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), *out


def measure(files: list[Path], procs: int, n_random: int, repeat: int, pool: ProcessPoolExecutor) -> dict:
    t0 = time.perf_counter()
    ids = {path: signal_read_ids(path) for path in files}
    list_s = time.perf_counter() - t0

    def serial() -> tuple[int, int]:
        parts = [read_file(p) for p in files]
        return sum(r for r, _ in parts), sum(s for _, s in parts)

    def parallel() -> tuple[int, int]:
        parts = list(pool.map(read_file, files))
        return sum(r for r, _ in parts), sum(s for _, s in parts)

    pairs = [(path, rid) for path, rids in ids.items() for rid in rids]
    picks = random.Random(1).sample(pairs, min(n_random, len(pairs)))

    def random_access() -> tuple[int, int]:
        return len(picks), sum(len(read_signal(path, rid).raw) for path, rid in picks)

    by_file: dict[Path, list[str]] = {}
    for path, rid in picks:
        by_file.setdefault(path, []).append(rid)

    def grouped_access() -> tuple[int, int]:
        got = [len(rec.raw) for path, rids in by_file.items() for rec in read_signals(path, rids)]
        return len(got), sum(got)

    tasks = read_tasks(ids, READS_PER_TASK)
    cpu = []

    def threaded_tasks() -> tuple[int, int]:
        c0 = time.process_time()
        with ThreadPoolExecutor(procs) as threads:
            chunks = list(threads.map(load_chunk, tasks))
        cpu.append(time.process_time() - c0)
        return sum(len(c.read_ids) for c in chunks), sum(len(c.raw) for c in chunks)

    result = {"files": len(files), "disk_mb": sum(p.stat().st_size for p in files) / 1e6, "list_s": list_s}
    for name, fn in (("iter1", serial), (f"iter{procs}", parallel), ("random", random_access),
                     ("grouped", grouped_access), ("tasks", threaded_tasks)):
        seconds, reads, samples = best(repeat, fn)
        mb = 2 * samples / 1e6
        result[name] = {"s": seconds, "reads": reads, "mb": mb, "reads_s": reads / seconds, "mb_s": mb / seconds}
    result["tasks"]["cpu_s"] = min(cpu)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=3000, help="reads per format (default 3000)")
    ap.add_argument("--per-file", type=int, default=500, help="reads per file (default 500)")
    ap.add_argument("-p", "--procs", type=int, default=os.cpu_count() or 1, help="worker processes for the parallel pass")
    ap.add_argument("--random", type=int, default=500, help="reads fetched by id in the random-access pass")
    ap.add_argument("--repeat", type=int, default=3, help="take the best of this many passes")
    ap.add_argument("--work", type=Path, default=ROOT / "bench-work" / "signal")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if not SHARED.is_dir():
        print(f"source reads not found: {SHARED}", file=sys.stderr)
        return 2
    files = build(args.work, args.reads, args.per_file)
    index_dir = args.work / "slow5-index"
    shutil.rmtree(index_dir, ignore_errors=True)  # BLOW5's first listing builds its index
    os.environ["STREAMER_SLOW5_INDEX_DIR"] = str(index_dir)
    results = {}
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        list(pool.map(_warm, range(args.procs)))  # start the workers before timing
        for fmt in FORMATS:
            results[fmt] = measure(files[fmt], args.procs, args.random, args.repeat, pool)
    p = args.procs
    print(f"{args.reads} reads in files of {args.per_file}; {os.cpu_count()} cores; best of {args.repeat}; page cache warm\n")
    print(f"| format | files | on disk MB | signal MB | list ids s | iterate 1 proc reads/s | MB/s "
          f"| iterate {p} procs reads/s | MB/s | random by id reads/s | MB/s | grouped by file reads/s | MB/s "
          f"| tasks on {p} threads reads/s | CPU s |")
    print("| --- |" + " ---: |" * 14)
    for fmt, r in results.items():
        print(f"| {fmt.upper()} | {r['files']} | {r['disk_mb']:.0f} | {r['iter1']['mb']:.0f} | {r['list_s']:.2f} "
              f"| {r['iter1']['reads_s']:.0f} | {r['iter1']['mb_s']:.0f} | {r[f'iter{p}']['reads_s']:.0f} "
              f"| {r[f'iter{p}']['mb_s']:.0f} | {r['random']['reads_s']:.0f} | {r['random']['mb_s']:.0f} "
              f"| {r['grouped']['reads_s']:.0f} | {r['grouped']['mb_s']:.0f} "
              f"| {r['tasks']['reads_s']:.0f} | {r['tasks']['cpu_s']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
