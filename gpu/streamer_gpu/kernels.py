"""CUDA kernels of ABEA, cell for cell the arithmetic of `streamer.pipeline.abea`.

Four kernels over the packed batch (reads addressed by base, event and band-row offsets):
`kcache` builds each read's k-mer model cache (scaled level mean, stdv, log stdv per k-mer),
`fill` runs the banded dynamic programme keeping the last three bands in shared memory and
writing one trace byte per cell, `backtrack` walks each read's trace and applies the QC,
and `compact` writes the pairs of the reads that passed, ascending and packed as steps, at
their final offsets.

Exactness: the arithmetic of each cell, the band rule, the traceback and the QC are
`streamer.pipeline.abea_cells`, the CPU's own source compiled for the device (`streamer_gpu.target`:
libdevice's unfused round-to-nearest operations, numpy scalars under the simulator); log and exp
are never evaluated on the device (the host passes ln(trim) and each read's transition log
probabilities). numba's CUDA simulator has no warp barrier and no shuffles: there every read
barrier is a block barrier, so simulated launches put one read in a block.

The kernels and their device functions take the arena's flat arrays, a dozen or more: CUDA kernels
take no Python objects, so `CudaAbea.align` takes the batch record and unpacks it once.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from streamer.pipeline.abea_cells import FROM_U, abea_cells
from streamer.skips import Skip
from streamer_gpu.target import DEVICE, SIMULATED

ALIGNMENT_FAILED = np.int8(Skip.ALIGNMENT_FAILED)
scaled_mean, log_emission, cell_score, moves_right, trimmed, with_trimmed, traceback, failed_qc = abea_cells(DEVICE)


def _kcache(seq, base_off, shift, scale, k, codes, level_mean, level_stdv, level_log_stdv, n_reads,
           gp_mean, stdv, log_stdv):  # fmt: skip
    """One block per read: the model entry of each of its k-mers, level mean already scaled."""
    i = cuda.blockIdx.x
    if i >= n_reads:
        return
    b0 = base_off[i]
    n_kmers = base_off[i + 1] - b0 - k + 1
    for kk in range(cuda.threadIdx.x, n_kmers, cuda.blockDim.x):
        r = 0
        for j in range(k):
            r = r * 4 + np.int64(codes[seq[b0 + kk + j]])
        gp_mean[b0 + kk] = scaled_mean(scale[i], level_mean[r], shift[i])
        stdv[b0 + kk] = level_stdv[r]
        log_stdv[b0 + kk] = level_log_stdv[r]


@functools.cache
def fill_kernel(bandwidth: int, threads_per_read: int, reads_per_block: int):
    """The band-filling kernel for one band width and thread layout (compiled once per layout).

    threads_per_read threads share a read, each taking every threads_per_read-th cell of a
    band; reads_per_block reads share a block. With 32 threads per read a read is one warp and
    its barrier a warp barrier, so several reads can share a block; with more, the barrier is
    the block's and a block holds one read. One barrier per band suffices: band b writes the
    ring slot of band b-3, which was last read while band b-1 was filled.
    """
    W, T, R = bandwidth, threads_per_read, reads_per_block
    if (T % 32 and not SIMULATED) or (T > 32 and R != 1) or (SIMULATED and R != 1):
        raise ValueError(f"unsupported layout: {T} threads per read, {R} reads per block")
    C = (W + T - 1) // T
    HALF = W // 2
    WARP = T == 32 and not SIMULATED

    @cuda.jit(
        "void(float32[::1], float32[::1], float32[::1], float32[::1], int64[::1], int64[::1], int64[::1], "
        "float64[:, ::1], float64, int64, int64, uint8[::1], int32[::1], int32[::1])",
        cache=True,
    )
    def fill(ev_mean, gp_mean, stdv, log_stdv, base_off, ev_off, row_off, lp, lp_trim, k, n_reads,
             trace, ll_e, end_event):  # fmt: skip
        ring = cuda.shared.array((R, 3, W), np.float32)
        best = cuda.shared.array(R, np.float32)
        best_e = cuda.shared.array(R, np.int32)
        slot = cuda.threadIdx.x // T
        t = cuda.threadIdx.x - slot * T
        i = cuda.blockIdx.x * R + slot
        if i >= n_reads:
            return
        ninf = np.float32(-np.inf)
        e0 = ev_off[i]
        b0 = base_off[i]
        r0 = row_off[i]
        n_events = ev_off[i + 1] - e0
        n_kmers = base_off[i + 1] - b0 - k + 1
        n_bands = n_events + n_kmers + 2
        last_k = n_kmers - 1
        lp_skip = lp[i, 0]
        lp_stay = lp[i, 1]
        lp_step = lp[i, 2]

        # band 0 holds only the start cell (-1, -1); band 1 the first trimmed event (0, -1)
        for j in range(C):
            o = t + j * T
            if o < W:
                ring[slot, 0, o] = np.float32(0.0) if o == HALF else ninf
                ring[slot, 1, o] = np.float32(lp_trim) if o == HALF else ninf
        if t == 0:
            best[slot] = ninf
            best_e[slot] = 0
            ll_e[r0] = HALF - 1
            ll_e[r0 + 1] = HALF
        if WARP:
            cuda.syncwarp()
        else:
            cuda.syncthreads()

        lle1 = HALF
        lle2 = HALF - 1
        p2 = 0
        p1 = 1
        cur = 2
        for b in range(2, n_bands):
            lle = lle1 if moves_right(ring[slot, p1, 0], ring[slot, p1, W - 1], b) else lle1 + 1
            llk = b - 2 - lle
            llk1 = b - 3 - lle1
            llk2 = b - 4 - lle2
            if t == 0:
                ll_e[r0 + b] = lle
            lo = max(max(-llk, lle - (n_events - 1)), 0)
            hi = min(min(n_kmers - llk, lle + 1), W)
            trim_o = -1 - llk
            end_o = last_k - llk
            row = (r0 + b) * W
            for j in range(C):
                o = t + j * T
                if o < W:
                    e = lle - o
                    v = ninf
                    if o >= lo and o < hi:
                        kk = llk + o
                        o_up = lle1 - e + 1
                        o_left = kk - 1 - llk1
                        o_diag = kk - 1 - llk2
                        up = ring[slot, p1, o_up] if 0 <= o_up < W else ninf
                        left = ring[slot, p1, o_left] if 0 <= o_left < W else ninf
                        diag = ring[slot, p2, o_diag] if 0 <= o_diag < W else ninf
                        x = b0 + kk
                        em = log_emission(ev_mean[e0 + e], gp_mean[x], stdv[x], log_stdv[x])
                        v, move = cell_score(diag, up, left, em, lp_step, lp_stay, lp_skip)
                        trace[row + o] = move
                    elif o == trim_o and e >= 0 and e < n_events:
                        v = trimmed(lp_trim, e + 1)
                        trace[row + o] = np.uint8(FROM_U)
                    ring[slot, cur, o] = v
                    # the end cell (e, last k-mer) with the remaining events trimmed; bands come
                    # in ascending event order and each has one such cell, so the first best wins
                    if o == end_o and e >= 0 and e < n_events:
                        s = with_trimmed(v, n_events - e, lp_trim)
                        if s > best[slot]:
                            best[slot] = s
                            best_e[slot] = e
            if WARP:
                cuda.syncwarp()
            else:
                cuda.syncthreads()
            lle2 = lle1
            lle1 = lle
            p2, p1, cur = p1, cur, p2
        if t == 0:
            end_event[i] = best_e[slot]

    return fill


def _backtrack(ev_mean, gp_mean, stdv, log_stdv, base_off, ev_off, row_off, k, bandwidth, n_reads, trace, ll_e,
              end_event, min_avg_log_emission, max_skip_run, cap_kmer, cap_event, n_aligned, sum_emission,
              status):  # fmt: skip
    """One thread per read: the traceback (pairs written last to first), its emission sum and the QC.

    n_aligned is 0 where the traceback leaves the band; status is 0 or ALIGNMENT_FAILED, by
    the CPU kernel's rules and thresholds.
    """
    i = cuda.grid(1)
    if i >= n_reads:
        return
    e0 = ev_off[i]
    b0 = base_off[i]
    r0 = row_off[i]
    n_kmers = base_off[i + 1] - b0 - k + 1
    n, total, max_gap, inside = traceback(trace, ll_e, r0, bandwidth, ev_mean, e0, gp_mean, stdv, log_stdv, b0,
                                          np.int64(end_event[i]), n_kmers - 1, cap_kmer, cap_event, r0)  # fmt: skip
    sum_emission[i] = total
    n_aligned[i] = n
    # pairs written last to first: the read's first k-mer is the last pair
    first = cap_kmer[r0 + n - 1] if inside else -1
    last = cap_kmer[r0] if inside else -1
    if failed_qc(n, total, max_gap, inside, first, last, n_kmers, min_avg_log_emission, max_skip_run):
        status[i] = ALIGNMENT_FAILED
    else:
        status[i] = 0


def _compact(row_off, aln_off, cap_kmer, cap_event, n_reads, steps, first_kmer, first_event):
    """One block per read: its pairs (traced last to first) turned ascending into its first pair and steps.

    steps[aln_off[i] + j] says how pair j follows pair j-1: bit 0 next k-mer, bit 1 next event
    (a byte where the pair itself takes eight, to copy back an eighth).
    """
    i = cuda.blockIdx.x
    if i >= n_reads:
        return
    r0 = row_off[i]
    a0 = aln_off[i]
    m = aln_off[i + 1] - a0
    if m == 0:
        return
    if cuda.threadIdx.x == 0:
        first_kmer[i] = cap_kmer[r0 + m - 1]
        first_event[i] = cap_event[r0 + m - 1]
        steps[a0] = 0
    for j in range(cuda.threadIdx.x + 1, m, cuda.blockDim.x):
        src = r0 + m - 1 - j
        steps[a0 + j] = (cap_kmer[src] - cap_kmer[src + 1]) | ((cap_event[src] - cap_event[src + 1]) << 1)


# Kernels compile on first use, for the device then current (importing this module needs no GPU), and
# are cached on disk beside this file, so later runs load them instead of compiling (start-up).


@functools.cache
def kcache_kernel():
    return cuda.jit(
        "void(uint8[::1], int64[::1], float32[::1], float32[::1], int64, int8[::1], "
        "float32[::1], float32[::1], float32[::1], int64, float32[::1], float32[::1], float32[::1])",
        cache=True,
    )(_kcache)


@functools.cache
def backtrack_kernel():
    return cuda.jit(
        "void(float32[::1], float32[::1], float32[::1], float32[::1], int64[::1], int64[::1], int64[::1], int64, "
        "int64, int64, uint8[::1], int32[::1], int32[::1], float64, int64, int32[::1], int32[::1], int32[::1], "
        "float64[::1], int8[::1])",
        cache=True,
    )(_backtrack)


@functools.cache
def compact_kernel():
    return cuda.jit(
        "void(int64[::1], int64[::1], int32[::1], int32[::1], int64, uint8[::1], int32[::1], int32[::1])",
        cache=True,
    )(_compact)
