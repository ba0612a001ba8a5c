"""GPU lanes on one batch: ABEA and the methylation HMM of a box-sized batch, step by step, on 1..N lanes at once.

Captures a batch as the CpG caller gets it (the shared 112 E. coli reads, else the fixture reads, packed
`--copies` times: 4 copies, 2.6 Mbases, are about a batch of the GPU box's memory plan), opens `--lanes`
lanes (each an ABEA arena, an HMM and their streams, as `streamer call` opens one per compute thread),
and has each lane's thread run the batch `--repeat` times: `CudaAbea.align`, then `CudaHmm.score`.
Reports per lane count the batches a second and the median milliseconds of each measured step (ABEA's
pack, copies in, kernels, copies back with the steps' decoding, and the whole call; the HMM's the same),
so that a change to a lane's host side or copies shows where it lands. Needs a CUDA GPU.

`--loads` runs each lane count again beside what else a run's process does, to see which of it slows the
lanes: `events` a thread detecting the batch's events on the CPU over and over (the front step's parallel
regions), `gil` a thread of pure Python (the GIL taken from the lanes at every switch interval), `procs` as
many busy processes as there are cores (the signal readers' decoding).

    python benchmarks/bench_gpu_lane.py [--copies 4] [--lanes 1,2,3] [--repeat 8] [-t 16]
                                        [--loads none,events,gil,procs]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _root in (ROOT / "plugins", ROOT / "gpu", ROOT):
    sys.path.insert(0, str(_root))

import numba  # noqa: E402
import numpy as np  # noqa: E402

from bench_calls_host import capture  # noqa: E402
from bench_cpu_kernels import reads_source  # noqa: E402
from streamer.pipeline.abea import AbeaReads, abea_arrays  # noqa: E402
from streamer.pipeline.events import detect_events  # noqa: E402
from streamer.pipeline.gpu import CudaOptions  # noqa: E402
from streamer_gpu.abea import CudaAbea  # noqa: E402
from streamer_plugins.cpg.hmm_cuda import CudaHmm  # noqa: E402

ABEA_STEPS = ("t_pack", "t_h2d", "t_kernels", "t_d2h", "t_wall")
HMM_STEPS = ("t_pack", "t_h2d", "t_kernel", "t_d2h")


def run_lanes(lanes: list[tuple[CudaAbea, CudaHmm]], reads: AbeaReads, model, jobs, inputs, repeat: int) -> dict:
    """Each lane's thread aligns and scores the batch `repeat` times; batches a second and step medians."""
    steps: dict[str, list[float]] = {}
    lock = threading.Lock()
    start = threading.Barrier(len(lanes))

    def lane(abea: CudaAbea, hmm: CudaHmm) -> None:
        mine = reads._replace(status=reads.status.copy())
        start.wait()
        for _ in range(repeat):
            mine.status[:] = reads.status
            t0 = time.perf_counter()
            _, a = abea.align(mine, model)
            t1 = time.perf_counter()
            _, _, h = hmm.score(jobs, inputs)
            t2 = time.perf_counter()
            with lock:
                for name in ABEA_STEPS:
                    steps.setdefault(f"abea {name[2:]}", []).append(getattr(a, name))
                for name in HMM_STEPS:
                    steps.setdefault(f"hmm {name[2:]}", []).append(getattr(h, name))
                steps.setdefault("hmm call", []).append(t2 - t1)
                steps.setdefault("batch", []).append(t2 - t0)

    threads = [threading.Thread(target=lane, args=pair) for pair in lanes]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"batches_per_s": round(len(lanes) * repeat / wall, 2),
            **{name: round(float(np.median(v)) * 1e3, 2) for name, v in steps.items()}}


def _spin(stop) -> None:
    while not stop.is_set():
        sum(range(10_000))


@contextmanager
def load(kind: str, batch) -> Iterator[None]:
    """`kind` of work (see the module's text) running beside the lanes until the block ends."""
    if kind == "none":
        yield
        return
    if kind == "procs":
        ctx = multiprocessing.get_context("spawn")  # not a fork of a process with numba's threads running
        stop = ctx.Event()
        workers = [ctx.Process(target=_spin, args=(stop,)) for _ in range(os.cpu_count() or 1)]
    else:
        stop = threading.Event()
        work: Callable[[], object] = {"events": lambda: detect_events(batch.signal, batch.signal_off),
                                      "gil": lambda: sum(range(10_000))}[kind]  # fmt: skip

        def loop() -> None:
            while not stop.is_set():
                work()

        workers = [threading.Thread(target=loop, daemon=True)]
    for w in workers:
        w.start()
    try:
        yield
    finally:
        stop.set()
        for w in workers:
            w.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--lanes", default="1,2,3")
    ap.add_argument("--repeat", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=16)
    ap.add_argument("--loads", default="none", help="comma-separated: none, events, gil, procs")
    ap.add_argument("--switch-ms", type=float, default=None, help="the interpreter's GIL switch interval [5]")
    ap.add_argument("--fixture", action="store_true", help="the fixture reads even when ../shared is present")
    a = ap.parse_args()
    if a.switch_ms is not None:
        sys.setswitchinterval(a.switch_ms / 1e3)
    c = capture(*reads_source(a.fixture), copies=a.copies)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    batch, model = c.batch, c.pipeline.kmer_model
    batch.status[:] = c.status
    reads = abea_arrays(batch)
    reads = reads._replace(status=reads.status.copy())
    counts = [int(n) for n in a.lanes.split(",")]
    first = CudaAbea(CudaOptions(max_reads=batch.n, max_bases=batch.n_bases))  # an arena sized for the batch
    lanes = [(first, CudaHmm())]
    while len(lanes) < max(counts):
        lanes.append((CudaAbea(first.options, first.arena.bandwidth, first.layout, arena_bytes=first.arena.n_bytes),
                      CudaHmm()))  # fmt: skip
    run_lanes(lanes[:1], reads, model, c.jobs, c.inputs, 2)  # kernels loaded, buffers grown
    report = {"reads": batch.n, "bases": batch.n_bases, "hmm_jobs": len(c.jobs.read),
              "threads": numba.get_num_threads(), "device": first.device_name,
              "switch_ms": sys.getswitchinterval() * 1e3}
    for kind in a.loads.split(","):
        with load(kind, batch):
            for n in counts:
                report[f"{n} lanes, load {kind}"] = run_lanes(lanes[:n], reads, model, c.jobs, c.inputs, a.repeat)
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
