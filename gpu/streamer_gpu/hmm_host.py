"""Host side of the GPU CpG HMM: job coordinates, per-read transitions, clip flanks, launch order.

Plain numba on CPU threads, importable without CUDA. Everything the kernel would otherwise
compute with log or exp is computed here by the CPU HMM's own helpers, so that the device
sees the same float32 values the CPU kernel uses.
"""

from __future__ import annotations

import numba
import numpy as np

from streamer_plugins.cpg.hmm import block_transitions, clip_flanks


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


@numba.njit(nogil=True, cache=True)
def read_transitions(job_read, events_per_base, params):
    """float32[n_reads, 10]: `block_transitions` of every read that has a job (zeros elsewhere)."""
    out = np.zeros((events_per_base.shape[0], 10), np.float32)
    done = np.zeros(events_per_base.shape[0], np.bool_)
    for j in range(job_read.shape[0]):
        r = job_read[j]
        if not done[r]:
            out[r] = block_transitions(events_per_base[r], params)
            done[r] = True
    return out


@numba.njit(nogil=True, cache=True)
def flank_table(n_events, params):
    """float32[n_events]: flank[i] is `clip_flanks`' pre[i] for any window of more than i events.

    pre[i] (the first i events clipped) depends on i only, and post[i] of a window of n events
    equals pre[n - 1 - i] (the same recurrence from the other end), so one table serves both.
    """
    pre = np.empty(max(n_events, 1), np.float32)
    post = np.empty(max(n_events, 1), np.float32)
    clip_flanks(max(n_events, 1), params, pre, post)
    return pre


def launch_order(idx: np.ndarray, cells: np.ndarray, by_cost: bool) -> np.ndarray:
    """int32 job indices in launch order: the costliest first, so a warp's jobs are alike and the tail is short."""
    if by_cost:
        idx = idx[np.argsort(-cells[idx], kind="stable")]
    return idx.astype(np.int32)
