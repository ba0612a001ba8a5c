"""The methylation profile HMM on the GPU: its kernel and `CudaHmm`, the launcher with the CPU's answers.

The kernel lives with the CpG plugin, not in `streamer_gpu`, so that dependencies run one way
(core <- gpu <- plugins): the HMM is the plugin's science, and `streamer_gpu` offers the
device as a compile target and the device buffers, knowing nothing of methylation motifs. One thread scores one
(read, window) job under one hypothesis: threads 2j and 2j+1 take job order[j] unmethylated
and methylated, so the two threads of a pair run the same number of rows and blocks in step.
Each runs `streamer_plugins.cpg.hmm_cells`' one-window forward pass (the block update that the CPU
runs in SIMD lanes) compiled for the device, with its row of the forward matrix and the window's
scaled levels in local memory, which the hardware interleaves across the lanes of a warp (lanes
at the same block touch adjacent words). log is
never evaluated on the device: the host passes each read's transition log probabilities and
the clip flanks, computed by the CPU helpers themselves.

`CudaHmm` owns the HMM's device state on one GPU: the pore model and log-sum table (copied
once), device buffers that grow with the largest batch seen, a stream (of the priority asked for:
`streamer_gpu.streams`), and the compiled kernel.
Per batch it packs the jobs, sends the windows too large for the kernel's local arrays to CPU
threads while the kernel runs, copies the batch's reference spans and events in, launches one
thread per (job, hypothesis), and copies the two log-likelihoods per job back. A CUDA error or
device out-of-memory in a batch scores that batch on the CPU and is logged and recorded, never lost.

The kernel's twenty-one arguments are device arrays and scalars, as CUDA kernels need; `score` takes
the two records (`HmmJobs`, `HmmInputs`) and unpacks them once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import numpy as np
from numba import cuda

from streamer.pipeline.gpu import HmmBatchStats
from streamer_gpu.buffers import DeviceBuffers, to_host
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.streams import open_stream
from streamer_gpu.target import CUDA_ERRORS, DEVICE
from streamer_plugins.cpg import hmm as cpu_hmm
from streamer_plugins.cpg.hmm import HmmInputs, HmmJobs
from streamer_plugins.cpg.hmm_cells import hmm_cells
from streamer_plugins.cpg.hmm_model import SLOTS, flank_table, read_transitions
from streamer_plugins.cpg.hmm_jobs import DEFAULT_MAX_KMERS, launch_order, pack_jobs

log = logging.getLogger(__name__)


@functools.cache
def forward_kernel(max_kmers: int, levels: str = "float32"):
    """The forward kernel for windows of up to max_kmers k-mers (the size of its local arrays), its model and
    scalings of dtype `levels`: float32 (f5c's) or float64 (nanopolish's)."""
    CELLS = SLOTS * max_kmers  # a constant of the kernel: local arrays need one
    forward = hmm_cells(DEVICE).forward

    @cuda.jit(
        "void(uint8[::1], float32[::1], int32[::1], int32[::1], int64[::1], int32[::1], int64[::1], int64[::1], "
        f"uint8[::1], {levels}[:, ::1], boolean, float32[:, ::1], int64, {levels}[:, ::1], uint8[:, ::1], int64[::1], "
        "float32[::1], float32[::1], int64, float32[::1], float32[::1])",
        cache=True,
    )
    def kernel(ref_seq, ev_mean, order, job_read, job_w0, job_len, job_e1, job_e2, rc, scalings, nanopolish, trans, k,
               model, sites, marks, table, flank, n_jobs, ll_u, ll_m):  # fmt: skip
        t = cuda.grid(1)
        if t >= 2 * n_jobs:
            return
        j = order[t >> 1]
        methylated = (t & 1) == 1
        r = job_read[j]
        cell = cuda.local.array(CELLS, np.float32)
        lp = forward(ref_seq, job_w0[j], np.int64(job_len[j]), rc[r] != 0, methylated, sites, marks, ev_mean,
                     job_e1[j], job_e2[j], k, model, scalings, nanopolish, trans, r, flank, table, cell)  # fmt: skip
        if methylated:
            ll_m[j] = lp
        else:
            ll_u[j] = lp

    return kernel


class CudaHmm:
    """One GPU's methylation HMM: `score` scores a batch's jobs as the CPU `score_windows` does."""

    def __init__(self, dev_id: int = 0, max_kmers: int = DEFAULT_MAX_KMERS, block: int = 128,
                 by_cost: bool = True, stream_priority: str = "normal"):  # fmt: skip
        cuda.select_device(dev_id)
        self.max_kmers = max_kmers
        self.block = block
        self.by_cost = by_cost
        self.stream = open_stream(stream_priority).stream
        self._buffers = DeviceBuffers()
        self._constants: dict[str, tuple[np.ndarray, cuda.devicearray.DeviceNDArray]] = {}
        self._faults = fault_plan()

    def _kernel(self, levels: str):
        """The kernel for a model and scalings of dtype `levels` (compiled at its first use)."""
        return forward_kernel(self.max_kmers, levels)

    def _constant(self, name: str, host: np.ndarray) -> cuda.devicearray.DeviceNDArray:
        """A read-only array (pore model, motif, log-sum table) on the device, copied again only if it changes."""
        held = self._constants.get(name)
        if held is None or held[0] is not host and not np.array_equal(held[0], host):
            held = (host, cuda.to_device(np.ascontiguousarray(host), stream=self.stream))
            self._constants[name] = held
        return held[1]

    def score(self, jobs: HmmJobs, inputs: HmmInputs) -> tuple[np.ndarray, np.ndarray, HmmBatchStats]:
        """`score_jobs` on the GPU (and CPU threads for windows over max_kmers), plus the batch's measurements."""
        self._faults.check("hmm")
        t0 = time.perf_counter()
        read, w0, length, e1, e2, cells, fits = pack_jobs(*jobs, inputs.ref_seq_off, inputs.ev_off, inputs.k,
                                                          self.max_kmers)  # fmt: skip
        n = len(read)
        ll_u = np.empty(n, np.float32)
        ll_m = np.empty(n, np.float32)
        on_cpu = np.flatnonzero(~fits)
        order = launch_order(np.flatnonzero(fits), cells, self.by_cost)
        t_pack = time.perf_counter() - t0

        def score_on_cpu(idx: np.ndarray) -> float:
            t = time.perf_counter()
            if len(idx):
                ll_u[idx], ll_m[idx] = cpu_hmm.score_jobs(HmmJobs(*(a[idx] for a in jobs)), inputs)
            return time.perf_counter() - t

        t_cpu: list[float] = []
        worker = threading.Thread(target=lambda: t_cpu.append(score_on_cpu(on_cpu)), name="hmm-cpu")
        worker.start()
        times = [0.0, 0.0, 0.0]
        fallback = ""
        got = None
        try:
            got, times = self._run_gpu(order, (read, w0, length, e1, e2), inputs)
        except CUDA_ERRORS as exc:
            fallback = f"{type(exc).__name__}: {exc}"
            log.warning("GPU HMM failed on a batch of %d windows (%s); its %d GPU windows are scored on the CPU",
                        n, fallback, len(order))  # fmt: skip
        worker.join()
        t_late = 0.0
        if got is not None:
            ll_u[order] = got[0][order]
            ll_m[order] = got[1][order]
        elif fallback:
            t_late = score_on_cpu(order)
        stats = HmmBatchStats(
            n_jobs=n,
            n_gpu=0 if fallback else len(order),
            n_cpu=len(on_cpu) + (len(order) if fallback else 0),
            cells=2 * int(cells[order].sum()) if not fallback else 0,
            t_pack=t_pack,
            t_h2d=times[0],
            t_kernel=times[1],
            t_d2h=times[2],
            t_cpu=t_cpu[0] + t_late,
            fallback=fallback,
        )
        return ll_u, ll_m, stats

    def _run_gpu(self, order: np.ndarray, placed: tuple[np.ndarray, ...],
                 inputs: HmmInputs) -> tuple[tuple[np.ndarray, np.ndarray] | None, list[float]]:  # fmt: skip
        """Both log-likelihoods of every job (valid at the jobs in `order`) and the h2d, kernel, d2h seconds;
        `placed` is `pack_jobs`' (read, w0, length, e1, e2), in batch coordinates."""
        n_gpu = len(order)
        if n_gpu == 0:
            return None, [0.0, 0.0, 0.0]
        read, w0, length, e1, e2 = placed
        ref_seq, _, rc, ev_mean, _, scalings, events_per_base, k, model, sites, marks, params, table, nanopolish = (
            inputs)
        s, b = self.stream, self._buffers
        t0 = time.perf_counter()
        trans = read_transitions(read[order], events_per_base, params)
        flank = flank_table(int(np.abs(e2[order] - e1[order]).max()) + 1, params)
        args = (
            b.put("ref_seq", ref_seq, s), b.put("ev_mean", ev_mean, s), b.put("order", order, s), b.put("read", read, s),
            b.put("w0", w0, s), b.put("length", length, s), b.put("e1", e1, s), b.put("e2", e2, s),
            b.put("rc", rc.view(np.uint8), s), b.put("scalings", scalings, s), nanopolish, b.put("trans", trans, s), k,
            self._constant("model", model), self._constant("sites", sites), self._constant("marks", marks),
            self._constant("table", table), b.put("flank", flank, s), n_gpu,
        )  # fmt: skip
        n = len(read)
        dev_u = b.get("ll_u", (n,), np.float32)
        dev_m = b.get("ll_m", (n,), np.float32)
        s.synchronize()
        t1 = time.perf_counter()
        threads = 2 * n_gpu
        self._kernel(model.dtype.name)[(threads + self.block - 1) // self.block, self.block, s](*args, dev_u, dev_m)
        s.synchronize()
        t2 = time.perf_counter()
        got = (to_host(dev_u, n, s), to_host(dev_m, n, s))
        s.synchronize()
        return got, [t1 - t0, t2 - t1, time.perf_counter() - t2]
