"""The profile HMM's arithmetic written once for every compile target: the k-mers of a window, their
levels, one block's update and the end of a row, and the forward pass of one window.

`hmm_cells(target)` compiles them for a target (`streamer.pipeline.targets`). The GPU kernel
(`streamer_plugins.cpg.hmm_cuda`) and `profile_forward` run `forward`, one window in one thread with
the values it carries from block to block in registers; the CPU's `score_windows`
(`streamer_plugins.cpg.hmm_lanes`) runs sixteen windows in SIMD lanes, the same `step` and `row_end`
in each lane. Every float operation is the target's rounding operation in the tools' order, so the
two agree to the bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from streamer.pipeline.targets import NANOPOLISH_LOG_INV_SQRT_2PI, Target, log_normal_pdf
from streamer_plugins.cpg.hmm_model import (
    SLOTS,
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
from streamer_plugins.cpg.logsum import flogsum_for


class HmmCells(NamedTuple):
    """The profile HMM's shared helpers compiled for one target (`hmm_cells`)."""

    site_at: Callable
    window_kmer_rank: Callable
    window_ranks: Callable
    scaled_level: Callable
    scaled_level64: Callable
    block_level: Callable
    emission: Callable
    step: Callable
    row_end: Callable
    forward: Callable


@functools.cache
def hmm_cells(t: Target) -> HmmCells:
    """The k-mer ranks of a window, one block's update and the forward pass, compiled for target t."""
    fadd, fmul, dadd, dmul = t.fadd, t.fmul, t.dadd, t.dmul
    flogsum = flogsum_for(t)
    emission32 = log_normal_pdf(t)
    emission64 = log_normal_pdf(t, NANOPOLISH_LOG_INV_SQRT_2PI)

    @t.jit
    def site_at(seq, w0, length, start, sites):
        """Whether a site (a row of `sites`, ASCII) lies wholly in the window seq[w0:w0+length] from `start`."""
        n = sites.shape[1]
        if start < 0 or start + n > length:
            return False
        for s in range(sites.shape[0]):
            j = 0
            while j < n and seq[w0 + start + j] == sites[s, j]:
                j += 1
            if j == n:
                return True
        return False

    @t.jit
    def base_digit(seq, w0, length, pos, rc, methylated, sites, marks):
        """Digit (A0 C1 G2 M3 T4) of base `pos` of the window seq[w0:w0+length], or of its reverse
        complement; with `methylated`, the motif's modified base of every whole site in the window is M
        (marks[0]: its offset in a site; marks[1]: the forward offset of its partner on the reverse strand)."""
        if rc:
            q = length - 1 - pos
            if methylated and site_at(seq, w0, length, q - marks[1], sites):
                return 3
            b = seq[w0 + q]
            if b == 67:  # C -> G
                return 2
            if b == 71:  # G -> C
                return 1
            return 4 if b == 65 else 0  # A -> T, T -> A
        if methylated and site_at(seq, w0, length, pos - marks[0], sites):
            return 3
        b = seq[w0 + pos]
        if b == 67:
            return 1
        if b == 71:
            return 2
        return 4 if b == 84 else 0

    @t.jit
    def window_kmer_rank(seq, w0, length, ki, k, rc, methylated, sites, marks):
        """Base-5 rank of k-mer `ki` of the window in the read's orientation.

        On the reverse strand k-mer ki is the reverse complement of forward k-mer ki, so blocks
        keep reference order while events run backwards.
        """
        r = 0
        start = length - ki - k if rc else ki
        for j in range(k):
            r = r * 5 + base_digit(seq, w0, length, start + j, rc, methylated, sites, marks)
        return r

    @t.jit
    def window_ranks(seq, w0, length, k, rc, methylated, sites, marks, out, o, stride):
        """`window_kmer_rank` of every k-mer ki of the window into out[o + ki * stride]: each k-mer's rank
        from the one before it, one new base's digit instead of k (on the reverse strand the new base
        comes first)."""
        top = 1
        for _ in range(k - 1):
            top *= 5
        r = window_kmer_rank(seq, w0, length, 0, k, rc, methylated, sites, marks)
        out[o] = r
        for ki in range(1, length - k + 1):
            if rc:
                r = base_digit(seq, w0, length, length - ki - k, rc, methylated, sites, marks) * top + r // 5
            else:
                r = (r % top) * 5 + base_digit(seq, w0, length, ki + k - 1, rc, methylated, sites, marks)
            out[o + ki * stride] = r

    @t.jit
    def scaled_level(rank, model, scale, shift, var, log_var):
        """(mean, stdv, log stdv) of k-mer `rank` scaled to the read: N(scale * mu + shift, stdv * var)."""
        return fadd(fmul(scale, model[0, rank]), shift), fmul(model[1, rank], var), fadd(model[2, rank], log_var)

    @t.jit
    def scaled_level64(rank, model, scale, shift, var, log_var):
        """`scaled_level` as nanopolish computes it: double model and scalings, each result rounded once."""
        return (np.float32(dadd(dmul(scale, model[0, rank]), shift)), np.float32(dmul(model[1, rank], var)),
                np.float32(dadd(model[2, rank], log_var)))  # fmt: skip

    @t.jit
    def block_level(rank, model, scalings, r, nanopolish):
        """The level of k-mer `rank` for read r (its row of `scalings`), in f5c's or nanopolish's arithmetic."""
        if nanopolish:
            return scaled_level64(rank, model, scalings[r, S_SCALE], scalings[r, S_SHIFT], scalings[r, S_VAR],
                                  scalings[r, S_LOG_VAR])  # fmt: skip
        return scaled_level(rank, model, scalings[r, S_SCALE], scalings[r, S_SHIFT], scalings[r, S_VAR],
                            scalings[r, S_LOG_VAR])  # fmt: skip

    @t.jit
    def emission(level, mean, stdv, log_stdv, nanopolish):
        """log N(level; mean, stdv) with f5c's or nanopolish's constant."""
        if nanopolish:
            return emission64(level, mean, stdv, log_stdv)
        return emission32(level, mean, stdv, log_stdv)

    @t.jit
    def sum5(x0, x1, x2, x3, x4, table):
        """Log-sum of five terms in the tools' order."""
        s = flogsum(x0, x1, table)
        s = flogsum(s, x2, table)
        s = flogsum(s, x3, table)
        return flogsum(s, x4, table)

    @t.jit
    def step(o, p, c, tr, first_block, soft, em, table):
        """One block's (M, B, K) in one row: o is the block's in the row before, p the block before's in the
        row before, c the block before's in this row (all -inf before block 0), tr the read's transitions
        (`T_*` order), em the block's emission of the row's event, soft the clip state's term (block 0)."""
        m = sum5(fadd(tr[T_MM_SELF], o[0]), fadd(tr[T_MM_NEXT], p[0]), fadd(tr[T_BM_SELF], o[1]),
                 fadd(tr[T_BM_NEXT], p[1]), fadd(tr[T_KM], p[2]), table)  # fmt: skip
        # the tools' sixth term, the clip state, is -inf past block 0: a log-sum with -inf gives the
        # other term back (nan as -inf), so only block 0 looks it up
        m = flogsum(m, soft, table) if first_block else (m if m == m else np.float32(-np.inf))
        n_b = flogsum(fadd(tr[T_MB], o[0]), fadd(tr[T_BB], o[1]), table)
        kk = flogsum(fadd(tr[T_MK], c[0]), fadd(tr[T_BK], c[1]), table)
        return fadd(m, em), n_b, flogsum(kk, fadd(tr[T_KK], c[2]), table)

    @t.jit
    def row_end(lp_end, last, post, table):
        """The running log P(events | window) after a row: its last block's M, B, K (`last`), the events
        after the row clipped (post)."""
        lp_end = flogsum(lp_end, fadd(last[0], post), table)
        lp_end = flogsum(lp_end, fadd(last[1], post), table)
        return flogsum(lp_end, fadd(last[2], post), table)

    @t.jit
    def forward(ref_seq, w0, length, rc, methylated, sites, marks, ev_mean, e1, e2, k, model, scalings, nanopolish,
                trans, r, flank, table, cell):  # fmt: skip
        """log P(events ev_mean[e1] towards ev_mean[e2] | window ref_seq[w0:w0+length]), float32.

        `sites` and `marks` are the motif's (`Motif.table`, `Motif.marks`); `model` from `pack_model` and
        row r of `scalings` (`pack_scalings`) the read's, or with `nanopolish` their double forms
        (`pack_model64`, `pack_scalings64`); row r of `trans` (`read_transitions`) is the read's; `flank`
        from `flank_table` (at least as long as the window's events); `cell` float32[SLOTS * k-mers] of work
        space. One row of the forward matrix (M, B, K per k-mer block, beside the block's scaled level) is
        updated in place, block by block, holding in registers the previous row's values of the block before
        (which the update has already overwritten) and the current row's values of that block (which the
        skip state K reads).
        """
        ninf = np.float32(-np.inf)
        n_kmers = length - k + 1
        stride = 1 if e1 <= e2 else -1
        n_events = (e2 - e1) * stride + 1
        for ki in range(n_kmers):
            o = SLOTS * ki
            cell[o] = ninf
            cell[o + 1] = ninf
            cell[o + 2] = ninf
            rank = window_kmer_rank(ref_seq, w0, length, ki, k, rc, methylated, sites, marks)
            cell[o + 3], cell[o + 4], cell[o + 5] = block_level(rank, model, scalings, r, nanopolish)
        tr = (trans[r, 0], trans[r, 1], trans[r, 2], trans[r, 3], trans[r, 4], trans[r, 5], trans[r, 6],
              trans[r, 7], trans[r, 8], trans[r, 9])  # fmt: skip
        lp_end = ninf
        for row in range(1, n_events + 1):
            level = ev_mean[e1 + (row - 1) * stride]
            soft = flank[row - 1]  # the first row - 1 events clipped (block 0 only)
            p = (ninf, ninf, ninf)
            c = (ninf, ninf, ninf)
            for ki in range(n_kmers):
                o = SLOTS * ki
                prev = (cell[o], cell[o + 1], cell[o + 2])
                em = emission(level, cell[o + 3], cell[o + 4], cell[o + 5], nanopolish)
                c = step(prev, p, c, tr, ki == 0, soft, em, table)
                cell[o], cell[o + 1], cell[o + 2] = c
                p = prev
            lp_end = row_end(lp_end, c, flank[n_events - row], table)  # the events after this row clipped
        return lp_end

    return HmmCells(site_at, window_kmer_rank, window_ranks, scaled_level, scaled_level64, block_level, emission,
                    step, row_end, forward)  # fmt: skip
