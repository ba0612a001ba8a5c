"""The GPU CpG HMM's jobs on the host: each (read, window) in batch coordinates, whether it fits the
kernel, and the order they are launched in.

Plain numba on CPU threads, importable without numba-cuda or a GPU; below both the launcher
(`streamer_plugins.cpg.hmm_cuda`) and the module that opens it (`hmm_gpu`), which import it.
"""

from __future__ import annotations

import numba
import numpy as np

from streamer_plugins.cpg.sites import MAX_SPAN, MIN_SEPARATION

# the largest default window (MAX_SPAN between its first and last C, MIN_SEPARATION either side)
# has MAX_SPAN + 2 * MIN_SEPARATION + 1 bases: 216 6-mers (R9.4.1), 213 9-mers (R10.4.1). The kernel
# keeps SLOTS floats per k-mer in local memory, 5.25 kB a thread for 224, whatever k; k changes
# only the loop that ranks a window's k-mers (5^9 ranks fit easily in int64) and the model's size
DEFAULT_MAX_KMERS = 224
assert all(MAX_SPAN + 2 * MIN_SEPARATION + 1 - k + 1 <= DEFAULT_MAX_KMERS for k in range(6, 10))


@numba.njit(nogil=True, cache=True, parallel=True)
def pack_jobs(job_read, job_w0, job_w1, job_e1, job_e2, ref_seq_off, ev_off, k, max_kmers):
    """Batch-absolute coordinates of every (read, window) job, its cell count, and whether it fits the kernel.

    Returns (read int32, w0 int64, length int32, e1 int64, e2 int64, cells int64, fits bool):
    window ref_seq[w0:w0+length], events ev_mean[e1] towards ev_mean[e2]; a job fits when its
    window has at most max_kmers k-mers (the kernel's local arrays).
    """
    n = job_read.shape[0]
    read = np.empty(n, np.int32)
    w0 = np.empty(n, np.int64)
    length = np.empty(n, np.int32)
    e1 = np.empty(n, np.int64)
    e2 = np.empty(n, np.int64)
    cells = np.empty(n, np.int64)
    fits = np.empty(n, np.bool_)
    for j in numba.prange(n):
        r = job_read[j]
        read[j] = r
        w0[j] = ref_seq_off[r] + job_w0[j]
        length[j] = job_w1[j] - job_w0[j]
        e1[j] = ev_off[r] + job_e1[j]
        e2[j] = ev_off[r] + job_e2[j]
        n_kmers = job_w1[j] - job_w0[j] - k + 1
        cells[j] = max(n_kmers, 0) * (abs(job_e2[j] - job_e1[j]) + 1)
        fits[j] = n_kmers <= max_kmers
    return read, w0, length, e1, e2, cells, fits


def launch_order(idx: np.ndarray, cells: np.ndarray, by_cost: bool) -> np.ndarray:
    """int32 job indices in launch order: the costliest first, so a warp's jobs are alike and the tail is short."""
    return costliest_first(idx, cells) if by_cost else idx.astype(np.int32)


@numba.njit(nogil=True, cache=True)
def costliest_first(idx, cells):
    """idx (int32) ordered by cells[idx] descending, ties in idx's order: a stable LSD radix sort, 11 bits a
    pass (a batch's 100k jobs: about a tenth of numpy's stable argsort, and without the GIL)."""
    n = idx.shape[0]
    out = idx.astype(np.int32)
    top = 0
    for i in range(n):
        top = max(top, cells[idx[i]])
    keys = np.empty(n, np.int64)
    for i in range(n):
        keys[i] = top - cells[idx[i]]
    spare_out = np.empty(n, np.int32)
    spare_keys = np.empty(n, np.int64)
    shift = 0
    while (top >> shift) > 0:
        count = np.zeros(2049, np.int64)
        for i in range(n):
            count[((keys[i] >> shift) & 2047) + 1] += 1
        for d in range(2048):
            count[d + 1] += count[d]
        for i in range(n):
            d = (keys[i] >> shift) & 2047
            spare_out[count[d]] = out[i]
            spare_keys[count[d]] = keys[i]
            count[d] += 1
        out, spare_out = spare_out, out
        keys, spare_keys = spare_keys, keys
        shift += 11
    return out
