"""Base-level extension's DP on the GPU: the CPU's jobs (`streamer.align.extend.plan_jobs`) through the
same cells (`streamer.align.extend_cells`) compiled for the device, so the runs, scores and NM are the
CPU's.

A thread aligns one job. The jobs between anchors are small (tens of bases, a band of tens of
diagonals), many (one per 60-150 read bases) and nearly alike, so a thread each keeps every lane busy
with no synchronisation, where a block per job would idle most of its threads in a band this narrow.
Jobs go to threads largest first, so a warp's 32 jobs are of a size, and a warp's traceback bytes
and scratch rows are interleaved (job `lane` at base + lane, stride 32): lanes at the same cell touch
one memory segment. Jobs whose traceback exceeds `max_job_bytes` (long unaligned read ends, which a
lone thread would take long over) are aligned on the CPU's threads meanwhile; the rest go in launches
whose traceback, scratch and runs fit `budget` bytes. Each launch's runs are packed on the device
(their counts' running sums, `streamer_gpu.scan`) before the copy back. A CUDA error aligns the
launch's jobs, and those after it, on the CPU, said in one line.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import cuda

from streamer.align.extend import JobResults, align_jobs, gathered, job_sizes
from streamer.align.extend_cells import N_RUNS, RESULT, extend_cells
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.scan import running_sums
from streamer_gpu.target import CUDA_ERRORS, DEVICE, SIMULATED

log = logging.getLogger(__name__)

WARP = 32
BLOCK = 32 if SIMULATED else 128
BUDGET = 1 << 30  # device bytes of one launch's traceback, scratch and runs
MAX_JOB_BYTES = 1 << 16  # traceback bytes of the largest job a GPU thread takes (about 160 rows of an end's band)


def grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


@functools.cache
def kernels():
    """The DP's kernels, compiled on first use so that importing this module needs no GPU."""
    align_job = extend_cells(DEVICE).align_job

    @cuda.jit
    def align(q, genome, jobs, order, count, sc, tb, tb_at, h, f1, f2, s_at, runs, run_at, res):
        """Thread t aligns job order[t]: its results in res[t], its runs from runs[run_at[t]]."""
        t = cuda.grid(1)
        if t < count:
            lane, warp = t % WARP, t // WARP
            align_job(q, genome, jobs, order[t], sc, tb, tb_at[warp] + lane, h, f1, f2, s_at[warp] + lane, WARP,
                      runs, run_at[t], res, t)  # fmt: skip

    @cuda.jit
    def run_counts(res, count, counts):
        t = cuda.grid(1)
        if t < count:
            counts[t] = res[t, N_RUNS]

    @cuda.jit
    def pack(runs, run_at, counts, count, at, out):
        """Each thread's runs moved to at[t], one after another."""
        t = cuda.grid(1)
        if t < count:
            for u in range(counts[t]):
                out[at[t] + u] = runs[run_at[t] + u]

    return align, run_counts, pack


def launches(tb: np.ndarray, scratch: np.ndarray, cap: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Runs [a, b) of warps (jobs sorted largest first) whose device bytes fit budget (a warp at least)."""
    n_warps = (len(tb) + WARP - 1) // WARP
    first = np.arange(n_warps) * WARP
    per_warp = (WARP * (np.maximum.reduceat(tb, first) + 12 * np.maximum.reduceat(scratch, first))
                + 4 * np.add.reduceat(cap, first)) if len(tb) else np.zeros(0, np.int64)  # fmt: skip
    out, a, used = [], 0, 0
    for w in range(n_warps):
        if w > a and used + per_warp[w] > budget:
            out.append((a, w))
            a, used = w, 0
        used += per_warp[w]
    if n_warps > a:
        out.append((a, n_warps))
    return out


class CudaExtender:
    """The DP's jobs against one genome on one GPU: `streamer.align.extend.align_jobs`' results."""

    def __init__(self, genome: np.ndarray, budget: int = BUDGET, max_job_bytes: int = MAX_JOB_BYTES):
        self.genome = genome
        self._d_genome = cuda.to_device(genome)
        self.budget, self.max_job_bytes = budget, max_job_bytes
        self._kernels = kernels()
        self._faults = fault_plan()
        self.seconds: dict[str, float] = {}  # wall seconds of copies in, the DP, packing and copies out;
        # "cpu": the CPU's share, run alongside
        self.jobs = self.jobs_on_cpu = self.launches = 0  # jobs seen, those aligned on the CPU, kernel launches

    def align_jobs(self, q: np.ndarray, jobs: np.ndarray, sc: np.ndarray, threads: int) -> JobResults:
        tb, scratch, cap = job_sizes(jobs)
        big = tb > self.max_job_bytes
        on_cpu = np.flatnonzero(big)
        small = np.flatnonzero(~big)
        order = small[np.argsort(-tb[small], kind="stable")]
        self.jobs += len(jobs)
        self.jobs_on_cpu += len(on_cpu)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="extend-cpu") as pool:
            cpu = pool.submit(self._on_cpu, q, jobs, sc, threads, on_cpu)
            parts = self._on_gpu(q, jobs, sc, threads, order, tb[order], scratch[order], cap[order])
            return gathered(len(jobs), parts + [cpu.result()])

    def _on_cpu(self, q, jobs, sc, threads, ids) -> tuple[np.ndarray, ...]:
        t0 = time.perf_counter()
        done = align_jobs(q, self.genome, jobs, sc, threads, ids)
        self.seconds["cpu"] = self.seconds.get("cpu", 0.0) + time.perf_counter() - t0
        return ids, done.res[ids], done.runs, done.start[ids]

    def _on_gpu(self, q, jobs, sc, threads, order, tb, scratch, cap) -> list[tuple[np.ndarray, ...]]:
        parts: list[tuple[np.ndarray, ...]] = []
        if not len(order):
            return parts
        spans = launches(tb, scratch, cap, self.budget)
        try:
            self._faults.check("extend")
            t0 = time.perf_counter()
            d_q, d_jobs, d_sc = cuda.to_device(q), cuda.to_device(jobs), cuda.to_device(sc)
            self._add("h2d", t0)
            for a, b in spans:
                j0, j1 = a * WARP, min(b * WARP, len(order))
                parts.append(self._launch(d_q, d_jobs, d_sc, order[j0:j1], tb[j0:j1], scratch[j0:j1], cap[j0:j1]))
        except CUDA_ERRORS as exc:
            rest = order[sum(len(p[0]) for p in parts):]
            log.warning("GPU extension failed on %d jobs (%s: %s): they are aligned on the CPU", len(rest),
                        type(exc).__name__, exc)  # fmt: skip
            parts.append(self._on_cpu(q, jobs, sc, threads, rest))
        return parts

    def _launch(self, d_q, d_jobs, d_sc, order, tb, scratch, cap) -> tuple[np.ndarray, ...]:
        align, run_counts, pack = self._kernels
        count = len(order)
        self.launches += 1
        t0 = time.perf_counter()
        first = np.arange(0, count, WARP)
        tb_at = np.concatenate([[0], np.cumsum(WARP * tb[first])])
        s_at = np.concatenate([[0], np.cumsum(WARP * np.maximum.reduceat(scratch, first))])
        run_at = np.concatenate([[0], np.cumsum(cap)])
        d_order, d_tb_at, d_s_at, d_run_at = (cuda.to_device(a) for a in (order, tb_at, s_at, run_at))
        d_tb = cuda.device_array(max(1, int(tb_at[-1])), np.uint8)
        h, f1, f2 = (cuda.device_array(max(1, int(s_at[-1])), np.int32) for _ in range(3))
        d_runs = cuda.device_array(max(1, int(run_at[-1])), np.int32)
        d_res = cuda.device_array((count, RESULT), np.int64)
        cuda.synchronize()
        t1 = self._add("h2d", t0)
        align[grid(count), BLOCK](d_q, self._d_genome, d_jobs, d_order, count, d_sc, d_tb, d_tb_at, h, f1, f2,
                                  d_s_at, d_runs, d_run_at, d_res)  # fmt: skip
        cuda.synchronize()
        t2 = self._add("align", t1)
        counts = cuda.device_array(count, np.int64)
        run_counts[grid(count), BLOCK](d_res, count, counts)
        d_at, total = running_sums(counts)
        d_out = cuda.device_array(max(1, total), np.int32)
        pack[grid(count), BLOCK](d_runs, d_run_at, counts, count, d_at, d_out)
        cuda.synchronize()
        t3 = self._add("pack", t2)
        res, runs, at = d_res.copy_to_host(), d_out.copy_to_host()[:total], d_at.copy_to_host()[:-1]
        self._add("d2h", t3)
        return order, res, runs, at

    def _add(self, key: str, t0: float) -> float:
        t1 = time.perf_counter()
        self.seconds[key] = self.seconds.get(key, 0.0) + t1 - t0
        return t1
