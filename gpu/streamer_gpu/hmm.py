"""The CpG profile HMM on the GPU: the host launcher and `score_windows` with the CPU signature.

`CudaHmm` owns the HMM's device state on one GPU: the pore model and log-sum table (copied
once), device buffers that grow with the largest batch seen (no allocation per batch once
they have), a stream, and the compiled kernel. Per batch it packs the jobs, sends the
windows too large for the kernel's local arrays to CPU threads while the kernel runs, copies
the batch's reference spans and events in, launches one thread per (job, hypothesis), and
copies the two log-likelihoods per job back. Answers are bit-identical to
`streamer_plugins.cpg.hmm.score_windows`; a CUDA error or device out-of-memory in a batch
scores that batch on the CPU and is logged and recorded, never lost.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from numba import cuda

from streamer_gpu import hmm_kernels
from streamer_gpu.abea import CUDA_ERRORS
from streamer_gpu.hmm_host import flank_table, launch_order, pack_jobs, read_transitions
from streamer_gpu.options import HmmBatchStats
from streamer_plugins.cpg import hmm as cpu_hmm
from streamer_plugins.cpg.sites import MAX_SPAN, MIN_SEPARATION

log = logging.getLogger(__name__)

# the largest default window (MAX_SPAN between its first and last C, MIN_SEPARATION either side)
# has MAX_SPAN + 2 * MIN_SEPARATION + 1 bases; 6-mers of it fit in 224 blocks
DEFAULT_MAX_KMERS = 224
assert MAX_SPAN + 2 * MIN_SEPARATION + 1 - 6 + 1 <= DEFAULT_MAX_KMERS


class _Buffers:
    """Device arrays by name, reallocated only when a batch needs more rows than they hold."""

    def __init__(self) -> None:
        self._arrays: dict[str, cuda.devicearray.DeviceNDArray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype) -> cuda.devicearray.DeviceNDArray:
        a = self._arrays.get(name)
        if a is None or a.shape[0] < shape[0] or a.shape[1:] != shape[1:] or a.dtype != dtype:
            self._arrays.pop(name, None)
            a = cuda.device_array((max(shape[0], 1) * 5 // 4 + 1, *shape[1:]), dtype)
            self._arrays[name] = a
        return a[: shape[0]]

    def put(self, name: str, host: np.ndarray, stream) -> cuda.devicearray.DeviceNDArray:
        dev = self.get(name, host.shape, host.dtype)
        if host.shape[0]:
            dev.copy_to_device(np.ascontiguousarray(host), stream=stream)
        return dev


class CudaHmm:
    """One GPU's CpG HMM: `score` scores a batch's jobs as the CPU `score_windows` does."""

    def __init__(self, dev_id: int = 0, max_kmers: int = DEFAULT_MAX_KMERS, block: int = 128,
                 by_cost: bool = True):  # fmt: skip
        cuda.select_device(dev_id)
        self.max_kmers = max_kmers
        self.block = block
        self.by_cost = by_cost
        self._kernel = hmm_kernels.forward_kernel(max_kmers)
        self._stream = cuda.stream()
        self._buffers = _Buffers()
        self._constants: dict[str, tuple[np.ndarray, cuda.devicearray.DeviceNDArray]] = {}

    def _constant(self, name: str, host: np.ndarray) -> cuda.devicearray.DeviceNDArray:
        """A read-only array (pore model, log-sum table) on the device, copied again only if it changes."""
        held = self._constants.get(name)
        if held is None or held[0] is not host and not np.array_equal(held[0], host):
            held = (host, cuda.to_device(np.ascontiguousarray(host), stream=self._stream))
            self._constants[name] = held
        return held[1]

    def score(self, job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off, scalings,
              events_per_base, k, model, params, table) -> tuple[np.ndarray, np.ndarray, HmmBatchStats]:  # fmt: skip
        """`score_windows` on the GPU (and CPU threads for windows over max_kmers), plus the batch's measurements."""
        t0 = time.perf_counter()
        read, w0, length, e1, e2, cells, fits = pack_jobs(
            job_read, job_w0, job_w1, job_e1, job_e2, ref_seq_off, ev_off, k, self.max_kmers
        )
        n = len(read)
        ll_u = np.empty(n, np.float32)
        ll_m = np.empty(n, np.float32)
        on_cpu = np.flatnonzero(~fits)
        order = launch_order(np.flatnonzero(fits), cells, self.by_cost)
        t_pack = time.perf_counter() - t0
        cpu_args = (ref_seq, ref_seq_off, rc, ev_mean, ev_off, scalings, events_per_base, k, model, params, table)

        def score_on_cpu(idx: np.ndarray) -> float:
            t = time.perf_counter()
            if len(idx):
                sel = (job_read[idx], job_w0[idx], job_w1[idx], job_e1[idx], job_e2[idx])
                ll_u[idx], ll_m[idx] = cpu_hmm.score_windows(*sel, *cpu_args)
            return time.perf_counter() - t

        t_cpu: list[float] = []
        worker = threading.Thread(target=lambda: t_cpu.append(score_on_cpu(on_cpu)), name="hmm-cpu")
        worker.start()
        times = [0.0, 0.0, 0.0]
        fallback = ""
        got = None
        try:
            got, times = self._run_gpu(order, read, w0, length, e1, e2, ref_seq, rc, ev_mean, scalings,
                                       events_per_base, k, model, params, table)  # fmt: skip
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

    def _run_gpu(self, order, read, w0, length, e1, e2, ref_seq, rc, ev_mean, scalings, events_per_base, k, model,
                 params, table) -> tuple[tuple[np.ndarray, np.ndarray] | None, list[float]]:  # fmt: skip
        """Both log-likelihoods of every job (valid at the jobs in `order`) and the h2d, kernel, d2h seconds."""
        n_gpu = len(order)
        if n_gpu == 0:
            return None, [0.0, 0.0, 0.0]
        s, b = self._stream, self._buffers
        t0 = time.perf_counter()
        trans = read_transitions(read[order], events_per_base, params)
        flank = flank_table(int(np.abs(e2[order] - e1[order]).max()) + 1, params)
        args = (
            b.put("ref_seq", ref_seq, s), b.put("ev_mean", ev_mean, s), b.put("order", order, s), b.put("read", read, s),
            b.put("w0", w0, s), b.put("length", length, s), b.put("e1", e1, s), b.put("e2", e2, s),
            b.put("rc", rc.view(np.uint8), s), b.put("scalings", scalings, s), b.put("trans", trans, s), k,
            self._constant("model", model), self._constant("table", table), b.put("flank", flank, s), n_gpu,
        )  # fmt: skip
        n = len(read)
        dev_u = b.get("ll_u", (n,), np.float32)
        dev_m = b.get("ll_m", (n,), np.float32)
        s.synchronize()
        t1 = time.perf_counter()
        threads = 2 * n_gpu
        self._kernel[(threads + self.block - 1) // self.block, self.block, s](*args, dev_u, dev_m)
        s.synchronize()
        t2 = time.perf_counter()
        got = (dev_u.copy_to_host(stream=s), dev_m.copy_to_host(stream=s))
        s.synchronize()
        return got, [t1 - t0, t2 - t1, time.perf_counter() - t2]


_default: CudaHmm | None = None
_default_lock = threading.Lock()


def score_windows(job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off, scalings,
                  events_per_base, k, model, params, table) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """`streamer_plugins.cpg.hmm.score_windows` on the GPU (default device and launch settings)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CudaHmm()
    ll_u, ll_m, _ = _default.score(job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off,
                                   scalings, events_per_base, k, model, params, table)  # fmt: skip
    return ll_u, ll_m
