"""CUDA kernel of the CpG profile-HMM forward pass, cell for cell the arithmetic of `streamer_plugins.cpg.hmm`.

One thread scores one (read, window) job under one hypothesis: threads 2j and 2j+1 take job
order[j] unmethylated and methylated, so the two threads of a pair run the same number of
rows and blocks in step. A thread keeps one row of the forward matrix (M, B, K per k-mer
block) and the window's scaled k-mer levels in local memory, which the hardware interleaves
across the lanes of a warp: lanes at the same block touch adjacent words.

The CPU keeps two rows; here one row is updated in place, block by block, holding in
registers the previous row's values of the block before (which the update has already
overwritten) and the current row's values of that block (which the skip state K reads). The
values and the order in which each is formed are the CPU's.

Exactness: every float32 add, subtract, multiply and divide goes through the round-to-nearest
helpers of `streamer_gpu.kernels` (libdevice intrinsics, never contracted into fused
multiply-adds; numpy scalars under the simulator). log is never evaluated on the device: the
host passes each read's transition log probabilities (`block_transitions`) and the clip
flanks (`clip_flanks`), computed by the CPU helpers themselves.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from streamer_gpu.kernels import fadd, fdiv, fmul, fsub
from streamer_plugins.cpg.hmm import (
    S_LOG_VAR,
    S_SCALE,
    S_SHIFT,
    S_VAR,
    T_BB,
    T_BK,
    T_BM_NEXT,
    T_BM_SELF,
    T_KK,
    T_KM,
    T_MB,
    T_MK,
    T_MM_NEXT,
    T_MM_SELF,
)
from streamer_plugins.cpg.logsum import LOGSUM_CUTOFF, LOGSUM_SCALE

# values kept per k-mer block in local memory: the row's M, B, K and the level mean, stdv, log stdv
SLOTS = 6


@cuda.jit(device=True)
def flogsum(a, b, table):
    """`streamer_plugins.cpg.logsum.flogsum` (the table is read only when it changes the answer)."""
    hi = a if a > b else b
    lo = a if a < b else b
    d = fsub(hi, lo)
    if d < np.float32(LOGSUM_CUTOFF):
        return fadd(hi, table[int(fmul(d, np.float32(LOGSUM_SCALE)))])
    return hi


@cuda.jit(device=True)
def base_digit(seq, w0, length, pos, rc, methylated):
    """`streamer_plugins.cpg.hmm.base_digit`: digit (A0 C1 G2 M3 T4) of a window base in read orientation."""
    if rc:
        b = seq[w0 + length - 1 - pos]
        if b == 67:
            return 2
        if b == 71:
            q = length - 1 - pos
            return 3 if methylated and q > 0 and seq[w0 + q - 1] == 67 else 1
        return 4 if b == 65 else 0
    b = seq[w0 + pos]
    if b == 67:
        return 3 if methylated and pos + 1 < length and seq[w0 + pos + 1] == 71 else 1
    if b == 71:
        return 2
    return 4 if b == 84 else 0


@cuda.jit(device=True)
def window_kmer_rank(seq, w0, length, ki, k, rc, methylated):
    """`streamer_plugins.cpg.hmm.window_kmer_rank`: base-5 rank of k-mer ki of the window."""
    r = 0
    start = length - ki - k if rc else ki
    for j in range(k):
        r = r * 5 + base_digit(seq, w0, length, start + j, rc, methylated)
    return r


@cuda.jit(device=True)
def log_normal_pdf(x, mean, stdv, log_stdv):
    """`streamer_plugins.cpg.hmm.log_normal_pdf`: (-0.918938 - log stdv) + (-0.5 * a) * a."""
    a = fdiv(fsub(x, mean), stdv)
    return fadd(fsub(np.float32(-0.918938), log_stdv), fmul(fmul(np.float32(-0.5), a), a))


@cuda.jit(device=True)
def sum6(x0, x1, x2, x3, x4, x5, table):
    """`streamer_plugins.cpg.hmm.sum6`: log-sum of six terms, left to right."""
    s = flogsum(x0, x1, table)
    s = flogsum(s, x2, table)
    s = flogsum(s, x3, table)
    s = flogsum(s, x4, table)
    return flogsum(s, x5, table)


@functools.cache
def forward_kernel(max_kmers: int):
    """The forward kernel for windows of up to max_kmers k-mers (the size of its local arrays)."""
    CELLS = SLOTS * max_kmers  # a constant of the kernel: local arrays need one

    @cuda.jit(
        "void(uint8[::1], float32[::1], int32[::1], int32[::1], int64[::1], int32[::1], int64[::1], int64[::1], "
        "uint8[::1], float32[:, ::1], float32[:, ::1], int64, float32[:, ::1], float32[::1], float32[::1], int64, "
        "float32[::1], float32[::1])",
        cache=True,
    )
    def forward(ref_seq, ev_mean, order, job_read, job_w0, job_len, job_e1, job_e2, rc, scalings, trans, k, model,
                table, flank, n_jobs, ll_u, ll_m):  # fmt: skip
        t = cuda.grid(1)
        if t >= 2 * n_jobs:
            return
        j = order[t >> 1]
        methylated = (t & 1) == 1
        r = job_read[j]
        w0 = job_w0[j]
        length = np.int64(job_len[j])
        e1 = job_e1[j]
        e2 = job_e2[j]
        strand = rc[r] != 0
        n_kmers = length - k + 1
        stride = 1 if e1 <= e2 else -1
        n_events = (e2 - e1) * stride + 1
        cell = cuda.local.array(CELLS, np.float32)
        ninf = np.float32(-np.inf)

        sc_scale = scalings[r, S_SCALE]
        sc_shift = scalings[r, S_SHIFT]
        sc_var = scalings[r, S_VAR]
        sc_log_var = scalings[r, S_LOG_VAR]
        for ki in range(n_kmers):
            rank = window_kmer_rank(ref_seq, w0, length, ki, k, strand, methylated)
            o = SLOTS * ki
            cell[o] = ninf
            cell[o + 1] = ninf
            cell[o + 2] = ninf
            cell[o + 3] = fadd(fmul(sc_scale, model[0, rank]), sc_shift)
            cell[o + 4] = fmul(model[1, rank], sc_var)
            cell[o + 5] = fadd(model[2, rank], sc_log_var)

        t_mm_self = trans[r, T_MM_SELF]
        t_mb = trans[r, T_MB]
        t_mk = trans[r, T_MK]
        t_mm_next = trans[r, T_MM_NEXT]
        t_bb = trans[r, T_BB]
        t_bk = trans[r, T_BK]
        t_bm_next = trans[r, T_BM_NEXT]
        t_bm_self = trans[r, T_BM_SELF]
        t_kk = trans[r, T_KK]
        t_km = trans[r, T_KM]

        lp_end = ninf
        for row in range(1, n_events + 1):
            level = ev_mean[e1 + (row - 1) * stride]
            soft = flank[row - 1]  # the first row - 1 events clipped (block 0 only)
            # the previous row's and this row's M, B, K of the block before (block 0 is all -inf)
            p_m = ninf
            p_b = ninf
            p_k = ninf
            c_m = ninf
            c_b = ninf
            c_k = ninf
            for ki in range(n_kmers):
                o = SLOTS * ki
                o_m = cell[o]
                o_b = cell[o + 1]
                o_k = cell[o + 2]
                m = sum6(
                    fadd(t_mm_self, o_m),
                    fadd(t_mm_next, p_m),
                    fadd(t_bm_self, o_b),
                    fadd(t_bm_next, p_b),
                    fadd(t_km, p_k),
                    soft if ki == 0 else ninf,
                    table,
                )
                n_m = fadd(m, log_normal_pdf(level, cell[o + 3], cell[o + 4], cell[o + 5]))
                n_b = flogsum(fadd(t_mb, o_m), fadd(t_bb, o_b), table)
                kk = flogsum(fadd(t_mk, c_m), fadd(t_bk, c_b), table)
                n_k = flogsum(kk, fadd(t_kk, c_k), table)
                cell[o] = n_m
                cell[o + 1] = n_b
                cell[o + 2] = n_k
                p_m = o_m
                p_b = o_b
                p_k = o_k
                c_m = n_m
                c_b = n_b
                c_k = n_k
            post = flank[n_events - row]  # the events after this row clipped
            lp_end = flogsum(lp_end, fadd(c_m, post), table)
            lp_end = flogsum(lp_end, fadd(c_b, post), table)
            lp_end = flogsum(lp_end, fadd(c_k, post), table)
        if methylated:
            ll_m[j] = lp_end
        else:
            ll_u[j] = lp_end

    return forward
