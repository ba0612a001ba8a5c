"""CPU event detection per core: nanoseconds per sample of `detect_events` on real signal, and a digest
of its events.

The shared reads' signal (every read of the FAST5 files under --data), tiled --copies times in memory
as one batch, is segmented on -t numba threads --repeat times after a warm-up (which compiles or
loads the kernels). Reported: the process's CPU seconds per sample (all threads, page faults
included: what the other work on the machine loses) and wall seconds, the best run of each. The
digest (SHA-256 of the five event arrays' bytes) is the same for every version of the kernel that
gives the same events, so runs of two trees compare bit for bit. Runs from a checkout without
installing it (PYTHONPATH=<tree> runs another tree's kernel under this script):

    PYTHONPATH=$PWD python benchmarks/bench_events.py --data /work/shared/data/ecoli_2kb_region --copies 8 -t 1

With `--callers N`, N Python threads also segment the batch at once, each its own parallel region on
-t threads, as `streamer call`'s front and compute threads run theirs: the wall time of the N, against
N times one caller's, says whether numba's threading layer (`NUMBA_THREADING_LAYER`: omp, tbb) shares
the cores between them or oversubscribes them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import numba
import numpy as np

from bench_gpu_events import load_signals, tiled
from streamer.pipeline.events import DNA_PARAMS, RNA_PARAMS, detect_events


def digest(events) -> str:
    h = hashlib.sha256()
    for a in events:
        h.update(str(a.dtype).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the shared ecoli_2kb_region folder")
    ap.add_argument("--copies", type=int, default=8, help="times the reads are tiled [%(default)s]")
    ap.add_argument("-t", "--threads", type=int, default=1, help="numba threads [%(default)s]")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs [%(default)s]")
    ap.add_argument("--rna", action="store_true", help="direct RNA's settings instead of DNA's")
    ap.add_argument("--callers", type=int, default=1, help="threads segmenting the batch at once, too [%(default)s]")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    signal, off = tiled(load_signals(args.data), args.copies)
    params = RNA_PARAMS if args.rna else DNA_PARAMS
    events = detect_events(signal, off, params)
    wall, cpu = [], []
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        detect_events(signal, off, params)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    n = len(signal)
    result = {
        "reads": len(off) - 1,
        "samples": n,
        "events": int(events[0][-1]),
        "threads": numba.get_num_threads(),
        "cpu_ns_per_sample": round(min(cpu) / n * 1e9, 2),
        "wall_s": [round(w, 4) for w in wall],
        "wall_ns_per_sample": round(min(wall) / n * 1e9, 2),
        "digest": digest(events),
    }
    print(f"{result['reads']} reads, {n / 1e6:.1f} M samples, {result['events']} events, {result['threads']} "
          f"threads: CPU {result['cpu_ns_per_sample']} ns/sample, wall {result['wall_ns_per_sample']} ns/sample "
          f"(best of {args.repeat}); events digest {result['digest']}")  # fmt: skip
    if args.callers > 1:
        result |= at_once(signal, off, params, args.callers, args.repeat, numba.get_num_threads())
        print(f"{args.callers} callers at once ({result['threading_layer']}): wall {result['callers_wall_s']} s, "
              f"{result['callers_vs_serial']}x the time of {args.callers} calls one after another")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def at_once(signal, off, params, callers: int, repeat: int, threads: int) -> dict:
    """The best wall time of `callers` threads each segmenting the batch at once, and its ratio to as many
    calls one after another (1: the regions share the cores as well as taking turns would)."""
    serial = min(_timed(lambda: [detect_events(signal, off, params) for _ in range(callers)]) for _ in range(repeat))

    def one() -> None:
        numba.set_num_threads(threads)  # numba's count is per thread
        detect_events(signal, off, params)

    def together() -> None:
        workers = [threading.Thread(target=one) for _ in range(callers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    best = min(_timed(together) for _ in range(repeat))
    return {"threading_layer": numba.threading_layer(), "callers": callers, "callers_wall_s": round(best, 4),
            "serial_wall_s": round(serial, 4), "callers_vs_serial": round(best / serial, 2)}  # fmt: skip


def _timed(work) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
