"""What handing the reader processes' samples back costs the owner: every read of a replicated folder
through `streamer call`'s reader pool (`signal_readers`, processes) as reader tasks (`load_chunk`,
--reads-per-task reads each, --ahead tasks in flight), while a stand-in compute thread runs short
nogil numba calls and measures how long each return waits for the GIL. Reports the wall, the CPU
seconds of the pool's result thread (where results are received and unpickled), of the owner
(less the compute thread's) and of the readers, the tasks whose samples came mapped from
/dev/shm, and the compute thread's GIL waits; best of --repeat. It uses only APIs both trees
have, so that two checkouts compare (run it with each tree first on PYTHONPATH).

    python benchmarks/bench_reader_handback.py --rep bench-work/e2e/x8 --format pod5 -p 2

`--rep` is a folder `bench_end_to_end.py --copies N` replicated (reads.fasta, pod5/, fast5/).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import threading
import time
from collections import deque
from pathlib import Path

import numba
import numpy as np

from streamer.io.index import open_index
from streamer.io.signal_chunks import load_chunk
from streamer.pipeline.signal_pool import signal_readers


@numba.njit(nogil=True, cache=True)
def _busy(n: int) -> float:
    acc = 0.0
    for i in range(n):
        acc += np.sqrt(i)
    return acc


class Compute(threading.Thread):
    """Calls `_busy` (about `ms` milliseconds each, GIL released) until stopped; the time past the call's
    own is its wait to take the GIL back (and for a core)."""

    def __init__(self, ms: float):
        super().__init__(name="compute", daemon=True)
        _busy(1000)
        n, t0 = 1 << 20, time.perf_counter()
        for _ in range(5):
            _busy(n)
        self.n = max(1, int(n * ms / 1e3 / ((time.perf_counter() - t0) / 5)))
        self.alone = min(self._one() for _ in range(20))
        self.stop, self.waits, self.cpu = threading.Event(), [], 0.0

    def _one(self) -> float:
        t0 = time.perf_counter()
        _busy(self.n)
        return time.perf_counter() - t0

    def run(self) -> None:
        c0 = time.thread_time()
        while not self.stop.is_set():
            self.waits.append(self._one() - self.alone)
        self.cpu = time.thread_time() - c0


def thread_cpu(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def readers_cpu(pool) -> float:
    """CPU seconds of the pool's reader processes so far (Linux)."""
    total = 0
    for pid in list(pool._processes):
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def one_pass(pool, tasks: list, ahead: int, compute_ms: float) -> dict:
    compute = Compute(compute_ms)
    t0, c0, w0 = time.perf_counter(), time.process_time(), readers_cpu(pool)
    compute.start()
    manager, r0, samples, mapped = None, 0.0, 0, 0
    pending: deque = deque()

    def take() -> None:
        nonlocal samples, mapped
        raw = pending.popleft().result().raw
        samples += int(raw.size)
        mapped += isinstance(raw.base, memoryview) and isinstance(raw.base.obj, mmap.mmap)

    for task in tasks:
        pending.append(pool.submit(load_chunk, task))
        if manager is None:
            manager = pool._executor_manager_thread
            r0 = thread_cpu(manager)
        if len(pending) >= ahead:
            take()
    while pending:
        take()
    result_cpu, wall = thread_cpu(manager) - r0, time.perf_counter() - t0
    compute.stop.set()
    compute.join()
    waits = np.array(compute.waits)
    return {"wall_s": wall, "owner_cpu_s": time.process_time() - c0 - compute.cpu, "result_thread_cpu_s": result_cpu,
            "readers_cpu_s": readers_cpu(pool) - w0,
            "samples": samples, "mapped_tasks": mapped, "compute_calls": len(waits),
            "compute_call_ms": compute.alone * 1e3,
            "gil_wait_ms_mean": float(waits.mean() * 1e3), "gil_wait_ms_p99": float(np.percentile(waits, 99) * 1e3),
            "gil_wait_s_total": float(waits.sum())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rep", type=Path, required=True, help="a replicated folder of bench_end_to_end.py")
    ap.add_argument("--format", choices=("pod5", "fast5"), default="pod5")
    ap.add_argument("-p", "--workers", type=int, default=2, help="reader processes [%(default)s]")
    ap.add_argument("--reads-per-task", type=int, default=32, help="[%(default)s]")
    ap.add_argument("--ahead", type=int, default=16, help="tasks in flight [%(default)s]")
    ap.add_argument("--compute-ms", type=float, default=1.0, help="length of a compute call [%(default)s]")
    ap.add_argument("--repeat", type=int, default=3, help="passes; the best (least wall) is kept [%(default)s]")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    reads = args.rep / "reads.fasta"
    index = open_index(reads, [args.rep / args.format])
    wanted: dict[Path, list[str]] = {}
    for rid, path in index.paths.items():
        wanted.setdefault(path, []).append(rid)
    k = args.reads_per_task  # tasks of k reads as `read_tasks` makes them of a batch spread over many files
    tasks, task, n = [], {}, 0
    for path, ids in wanted.items():
        for i in range(0, len(ids), k):
            task[path] = ids[i : i + k]
            n += len(task[path])
            if n >= k:
                tasks.append(task)
                task, n = {}, 0
    tasks += [task] if task else []
    pool = signal_readers([f".{args.format}"], args.workers, "processes")
    try:
        for f in [pool.submit(time.sleep, 0.2) for _ in range(args.workers)]:
            f.result()
        passes = [one_pass(pool, tasks, args.ahead, args.compute_ms) for _ in range(args.repeat)]
    finally:
        pool.shutdown()
    best = min(passes, key=lambda r: r["wall_s"])
    best.update(tasks=len(tasks), reads=len(index.paths), workers=args.workers, format=args.format,
                walls=[round(r["wall_s"], 3) for r in passes],
                result_thread_cpus=[round(r["result_thread_cpu_s"], 3) for r in passes],
                readers_cpus=[round(r["readers_cpu_s"], 3) for r in passes])  # fmt: skip
    print(json.dumps(best, indent=1))
    if args.json:
        args.json.write_text(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
