"""ABEA's arithmetic written once for the CPU kernel (`streamer.pipeline.abea`) and the CUDA kernels
(`streamer_gpu.kernels`): the cell score, the band rule, trimmed scores, the traceback and the QC.

`abea_cells(target)` compiles them for a target (`streamer.pipeline.targets`); both kernels call the
same source with the same rounding operations in the same order, so they agree to the bit. The
arithmetic is f5c's (align.c): emissions in float32, transition log probabilities in double,
each move's score formed in double and rounded once to float32, ties going up over diagonal and
left over both.

The cells take flat arrays and scalars, many of them, as device functions must: the batch record
is unpacked once by the Python-side callers (`align_batch`, `CudaAbea.align`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from streamer.pipeline.targets import Target, log_normal_pdf

FROM_D = 0  # diagonal: step to the next k-mer with the next event
FROM_U = 1  # up: the event stays on the same k-mer
FROM_L = 2  # left: the k-mer is skipped


class AbeaCells(NamedTuple):
    """ABEA's per-cell arithmetic compiled for one target (`abea_cells`)."""

    scaled_mean: Callable
    log_emission: Callable
    cell_score: Callable
    moves_right: Callable
    trimmed: Callable
    with_trimmed: Callable
    traceback: Callable
    failed_qc: Callable


@functools.cache
def abea_cells(t: Target) -> AbeaCells:
    """The arithmetic every ABEA kernel shares, in f5c's order and rounding, compiled for target t."""
    fadd, fmul, dadd, dmul, ddiv = t.fadd, t.fmul, t.dadd, t.dmul, t.ddiv
    log_emission = log_normal_pdf(t)

    @t.jit
    def scaled_mean(scale, level_mean, shift):
        """A k-mer's level scaled to the read, float32 scale * mean + shift (ABEA leaves var aside)."""
        return fadd(fmul(scale, level_mean), shift)

    @t.jit
    def cell_score(diag, up, left, lp_emission, lp_step, lp_stay, lp_skip):
        """Best of the three moves into a cell (float32 score, FROM_* code): each score formed in
        double and rounded once; ties go up over diagonal and left over both."""
        em = np.float64(lp_emission)
        score_d = np.float32(dadd(dadd(np.float64(diag), lp_step), em))
        score_u = np.float32(dadd(dadd(np.float64(up), lp_stay), em))
        score_l = np.float32(dadd(np.float64(left), lp_skip))
        best = score_d
        move = np.uint8(FROM_D)
        if score_u > best:
            best = score_u
        if best == score_u:
            move = np.uint8(FROM_U)
        if score_l > best:
            best = score_l
        if best == score_l:
            move = np.uint8(FROM_L)
        return best, move

    @t.jit
    def moves_right(first, last, b):
        """Whether band b lies right of band b-1 (next k-mer) rather than below it (next event),
        from the scores at the two ends of band b-1 (Suzuki-Kasahara); alternating while both are -inf."""
        ninf = np.float32(-np.inf)
        if first == ninf and last == ninf:
            return b % 2 == 1
        return first < last

    @t.jit
    def trimmed(lp_trim, n):
        """The score of n trimmed events, float32."""
        return np.float32(dmul(lp_trim, np.float64(n)))

    @t.jit
    def with_trimmed(score, n, lp_trim):
        """A cell's score with n further events trimmed after it (the end-cell candidates), float32."""
        return np.float32(dadd(np.float64(score), dmul(np.float64(n), lp_trim)))

    @t.jit
    def traceback(trace, ll_e, r0, w, ev_mean, e0, mean, stdv, log_stdv, k0, end_event, last_k, out_kmer,
                  out_event, out0):  # fmt: skip
        """Walk a read's trace back from (end_event, last_k), writing its pairs last to first at out0.

        The read's bands are rows r0.. of ll_e and of trace (w bytes a row), its events at
        ev_mean[e0:], its k-mer cache at mean/stdv/log_stdv[k0:]. Returns (pairs, the float64 sum
        of their log emissions, the longest run of skipped k-mers, whether the walk stayed in the
        band); pairs is 0 when it left the band (where f5c would read outside its matrix).
        """
        e = end_event
        kk = last_k
        n = 0
        gap = 0
        max_gap = 0
        total = np.float64(0.0)
        while kk >= 0 and e >= 0:
            b = e + kk + 2
            o = ll_e[r0 + b] - e
            if o < 0 or o >= w:
                return 0, total, max_gap, False
            out_kmer[out0 + n] = kk
            out_event[out0 + n] = e
            n += 1
            x = k0 + kk
            total = dadd(total, np.float64(log_emission(ev_mean[e0 + e], mean[x], stdv[x], log_stdv[x])))
            move = trace[(r0 + b) * w + o]
            if move == FROM_D:
                kk -= 1
                e -= 1
                gap = 0
            elif move == FROM_U:
                e -= 1
                gap = 0
            else:
                kk -= 1
                gap += 1
                max_gap = max(max_gap, gap)
        return n, total, max_gap, True

    @t.jit
    def failed_qc(n, total, max_gap, inside, first_kmer, last_kmer, n_kmers, min_avg_log_emission, max_skip_run):
        """f5c's alignment QC on a traceback: fails when it left the band, its average log emission
        is below the threshold, it does not span the read's first and last k-mer, or it skipped
        more than max_skip_run k-mers in a row."""
        if not inside:
            return True
        spanned = first_kmer == 0 and last_kmer == n_kmers - 1
        return ddiv(total, np.float64(n)) < min_avg_log_emission or not spanned or max_gap > max_skip_run

    return AbeaCells(scaled_mean, log_emission, cell_score, moves_right, trimmed, with_trimmed, traceback, failed_qc)
