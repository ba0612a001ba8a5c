"""nanopolish's profile HMM forward algorithm (R9), scoring a reference window against events.

Each k-mer of the window is a block of three states: M (an event matches the k-mer), B (a bad
event, emitted with log-probability 0) and K (the k-mer is skipped, silent). Events before and
after the window's own may be clipped to a background emission, so the window can start and end
at any event. The score is log P(events | window), once for the window as it is and once with the
modified base of each whole motif site in it written as M (`streamer.pore.motifs`: CpG, GpC, dam,
dcm; the motif is data the kernels take, `sites` and `marks`).

To agree with nanopolish and f5c to their printed precision the arithmetic is theirs: float32 cells
and emissions, transition probabilities in float32 with logf (f5c is C++), flank probabilities in
double stored as float32, HMMER's table log-sum, and the same order of summation. Where the two
differ the kernels take either's (`nanopolish`): f5c 1.1 scales each k-mer's level to the read in
float32 from a float32 model and scalings and takes -0.918938 for ln(1/sqrt(2 pi)); nanopolish 0.14
scales in double from double ones (`hmm_model.pack_model64`, `pack_scalings64`), rounds once, and
takes its own constant. The forward pass of one window is written once (`hmm_cells`) and compiled
both here and for CUDA (`streamer_plugins.cpg.hmm_cuda`), so CPU and GPU agree to the bit; a job is
one window of one read, and `score_windows` runs all jobs of a batch on CPU threads.

The kernels (`forward`, `profile_forward`, `score_windows`) take flat arrays and scalars, many of
them, as numba needs; the Python side passes the jobs and what they are scored against as two
records (`HmmJobs`, `HmmInputs`) to `score_jobs` or the GPU's `CudaHmm.score`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np
from numba import prange

from streamer.pipeline.targets import CPU, NANOPOLISH_LOG_INV_SQRT_2PI, Target, log_normal_pdf
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
    flank_table,
    read_transitions,
)
from streamer_plugins.cpg.logsum import flogsum_for

class HmmCells(NamedTuple):
    """The profile HMM's shared helpers compiled for one target (`hmm_cells`)."""

    site_at: Callable
    window_kmer_rank: Callable
    scaled_level: Callable
    scaled_level64: Callable
    forward: Callable
    forward_span: Callable
    shared_blocks: Callable


@functools.cache
def hmm_cells(t: Target) -> HmmCells:
    """The k-mer ranks of a window and its forward pass, compiled for target t."""
    fadd, fmul, dadd, dmul = t.fadd, t.fmul, t.dadd, t.dmul
    flogsum = flogsum_for(t)
    emission = log_normal_pdf(t)
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
    def scaled_level(rank, model, scale, shift, var, log_var):
        """(mean, stdv, log stdv) of k-mer `rank` scaled to the read: N(scale * mu + shift, stdv * var)."""
        return fadd(fmul(scale, model[0, rank]), shift), fmul(model[1, rank], var), fadd(model[2, rank], log_var)

    @t.jit
    def scaled_level64(rank, model, scale, shift, var, log_var):
        """`scaled_level` as nanopolish computes it: double model and scalings, each result rounded once."""
        return (np.float32(dadd(dmul(scale, model[0, rank]), shift)), np.float32(dmul(model[1, rank], var)),
                np.float32(dadd(model[2, rank], log_var)))  # fmt: skip

    @t.jit
    def sum5(x0, x1, x2, x3, x4, table):
        """Log-sum of five terms in the tools' order."""
        s = flogsum(x0, x1, table)
        s = flogsum(s, x2, table)
        s = flogsum(s, x3, table)
        return flogsum(s, x4, table)

    @t.jit
    def forward_span(ref_seq, w0, length, rc, methylated, sites, marks, ev_mean, e1, e2, k, model, scalings,
                     nanopolish, trans, r, flank, table, cell, first, edge, keep):  # fmt: skip
        """`forward` over blocks first.. of the window, the blocks before given row by row in `edge`.

        edge[3 * row : 3 * row + 3] holds row `row`'s M, B, K of block first - 1 (row 0: the start,
        all -inf), as a pass with keep = first - 1 wrote it (keep < 0: nothing written). Two
        hypotheses whose blocks before `first` have the same levels share those blocks' values, so
        the second pass needs only the rest.
        """
        ninf = np.float32(-np.inf)
        n_kmers = length - k + 1
        stride = 1 if e1 <= e2 else -1
        n_events = (e2 - e1) * stride + 1
        sc_scale = scalings[r, S_SCALE]
        sc_shift = scalings[r, S_SHIFT]
        sc_var = scalings[r, S_VAR]
        sc_log_var = scalings[r, S_LOG_VAR]
        for ki in range(first, n_kmers):
            rank = window_kmer_rank(ref_seq, w0, length, ki, k, rc, methylated, sites, marks)
            o = SLOTS * ki
            cell[o] = ninf
            cell[o + 1] = ninf
            cell[o + 2] = ninf
            if nanopolish:
                gaussian = scaled_level64(rank, model, sc_scale, sc_shift, sc_var, sc_log_var)
            else:
                gaussian = scaled_level(rank, model, sc_scale, sc_shift, sc_var, sc_log_var)
            cell[o + 3], cell[o + 4], cell[o + 5] = gaussian

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

        if keep >= 0:
            edge[0] = ninf
            edge[1] = ninf
            edge[2] = ninf
        lp_end = ninf
        for row in range(1, n_events + 1):
            level = ev_mean[e1 + (row - 1) * stride]
            soft = flank[row - 1]  # the first row - 1 events clipped (block 0 only)
            # the previous row's and this row's M, B, K of the block before (before block 0, all -inf)
            p_m = ninf
            p_b = ninf
            p_k = ninf
            c_m = ninf
            c_b = ninf
            c_k = ninf
            if first > 0:
                p_m = edge[3 * row - 3]
                p_b = edge[3 * row - 2]
                p_k = edge[3 * row - 1]
                c_m = edge[3 * row]
                c_b = edge[3 * row + 1]
                c_k = edge[3 * row + 2]
            for ki in range(first, n_kmers):
                o = SLOTS * ki
                o_m = cell[o]
                o_b = cell[o + 1]
                o_k = cell[o + 2]
                m = sum5(fadd(t_mm_self, o_m), fadd(t_mm_next, p_m), fadd(t_bm_self, o_b), fadd(t_bm_next, p_b),
                         fadd(t_km, p_k), table)  # fmt: skip
                # the tools' sixth term, the clip state, is -inf past block 0: a log-sum with -inf gives the
                # other term back (nan as -inf), so only block 0 looks it up
                m = flogsum(m, soft, table) if ki == 0 else (m if m == m else ninf)
                if nanopolish:
                    n_m = fadd(m, emission64(level, cell[o + 3], cell[o + 4], cell[o + 5]))
                else:
                    n_m = fadd(m, emission(level, cell[o + 3], cell[o + 4], cell[o + 5]))
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
            if keep >= 0:
                edge[3 * row] = cell[SLOTS * keep]
                edge[3 * row + 1] = cell[SLOTS * keep + 1]
                edge[3 * row + 2] = cell[SLOTS * keep + 2]
            post = flank[n_events - row]  # the events after this row clipped
            lp_end = flogsum(lp_end, fadd(c_m, post), table)
            lp_end = flogsum(lp_end, fadd(c_b, post), table)
            lp_end = flogsum(lp_end, fadd(c_k, post), table)
        return lp_end

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
        return forward_span(ref_seq, w0, length, rc, methylated, sites, marks, ev_mean, e1, e2, k, model, scalings,
                            nanopolish, trans, r, flank, table, cell, 0, cell, -1)  # fmt: skip

    @t.jit
    def shared_blocks(ref_seq, w0, length, rc, k, sites, marks):
        """How many leading blocks of the window have the same k-mer unmethylated and methylated."""
        n_kmers = length - k + 1
        for ki in range(n_kmers):
            if window_kmer_rank(ref_seq, w0, length, ki, k, rc, False, sites, marks) != window_kmer_rank(
                    ref_seq, w0, length, ki, k, rc, True, sites, marks):  # fmt: skip
                return ki
        return n_kmers

    return HmmCells(site_at, window_kmer_rank, scaled_level, scaled_level64, forward, forward_span, shared_blocks)


site_at, window_kmer_rank, scaled_level, scaled_level64, forward, forward_span, shared_blocks = hmm_cells(CPU)


@numba.njit(nogil=True, cache=True)
def profile_forward(
    seq, w0, length, rc, methylated, sites, marks, ev_mean, e_start, e_stop, k, model, scalings, nanopolish, trans,
    params, table,
):  # fmt: skip
    """log P(events e_start..e_stop | window seq[w0:w0+length]) under the profile HMM, float32.

    Events are taken from `e_start` towards `e_stop` (either direction); `sites` and `marks` the
    motif's, `model` from `pack_model`, `scalings` one row of `pack_scalings` (or their double forms
    with `nanopolish`), `trans` from `block_transitions`.
    """
    n_kmers = length - k + 1
    cell = np.empty(SLOTS * max(n_kmers, 1), np.float32)
    flank = flank_table(abs(e_stop - e_start) + 1, params)
    return forward(seq, w0, length, rc, methylated, sites, marks, ev_mean, e_start, e_stop, k, model,
                   scalings.reshape((1, 4)), nanopolish, trans.reshape((1, 10)), 0, flank, table, cell)  # fmt: skip


class HmmJobs(NamedTuple):
    """The (read, window) jobs of a batch: window ref_seq[ref_seq_off[read] + w0 : ... + w1] against the
    read's events e1..e2 (indices within the read)."""

    read: np.ndarray
    w0: np.ndarray
    w1: np.ndarray
    e1: np.ndarray
    e2: np.ndarray


class HmmInputs(NamedTuple):
    """What every job of a batch is scored against: the reads' reference spans and events, their
    scalings and event rates, the model and its motif (`Motif.table`, `Motif.marks`), parameters and
    log-sum table, and whose arithmetic (`nanopolish`: scalings and model in double, as
    `pack_scalings64` and `pack_model64` give them; else float32, f5c's)."""

    ref_seq: np.ndarray
    ref_seq_off: np.ndarray
    rc: np.ndarray
    ev_mean: np.ndarray
    ev_off: np.ndarray
    scalings: np.ndarray
    events_per_base: np.ndarray
    k: int
    model: np.ndarray
    sites: np.ndarray
    marks: np.ndarray
    params: np.ndarray
    table: np.ndarray
    nanopolish: bool


def score_jobs(jobs: HmmJobs, inputs: HmmInputs) -> tuple[np.ndarray, np.ndarray]:
    """`score_windows` of the jobs: (ll_unmethylated, ll_methylated), float32. The GPU's `CudaHmm.score`
    takes the same two records."""
    return score_windows(*jobs, *inputs)


JOBS_PER_CHUNK = 32


@numba.njit(parallel=True, nogil=True, cache=True)
def score_windows(
    job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off,
    scalings, events_per_base, k, model, sites, marks, params, table, nanopolish,
):  # fmt: skip
    """Unmethylated and methylated log-likelihoods of every (read, window) job, in parallel.

    Job j scores ref_seq[ref_seq_off[r] + w0 : ... + w1] of read r = job_read[j] against the
    read's events job_e1[j]..job_e2[j] (event indices within the read). Returns float32 arrays
    (ll_unmethylated, ll_methylated). Threads take chunks of jobs and allocate their work
    arrays once per chunk: an allocation per window made the threads contend. The blocks before
    a window's first methylated k-mer are the same under both hypotheses (a fifth of all blocks
    on R9.4.1 E. coli reads), so the methylated pass starts there from the unmethylated pass's
    values; the GPU, which runs the two passes on two threads, computes them in full.
    """
    n = job_read.shape[0]
    ll_u = np.empty(n, np.float32)
    ll_m = np.empty(n, np.float32)
    trans = read_transitions(job_read, events_per_base, params)
    max_events = 1
    for j in range(n):
        max_events = max(max_events, abs(job_e2[j] - job_e1[j]) + 1)
    flank = flank_table(max_events, params)
    n_chunks = (n + JOBS_PER_CHUNK - 1) // JOBS_PER_CHUNK
    for c in prange(n_chunks):
        j0 = c * JOBS_PER_CHUNK
        j1 = min(n, j0 + JOBS_PER_CHUNK)
        max_kmers = 1
        for j in range(j0, j1):
            max_kmers = max(max_kmers, job_w1[j] - job_w0[j] - k + 1)
        cell = np.empty(SLOTS * max_kmers, np.float32)
        edge = np.empty(3 * (max_events + 1), np.float32)
        for j in range(j0, j1):
            r = job_read[j]
            w0 = ref_seq_off[r] + job_w0[j]
            length = job_w1[j] - job_w0[j]
            e1 = ev_off[r] + job_e1[j]
            e2 = ev_off[r] + job_e2[j]
            # the methylated pass takes the blocks before its first methylated k-mer from the unmethylated one
            first = shared_blocks(ref_seq, w0, length, rc[r], k, sites, marks)
            if first >= length - k + 1:
                first = 0
            ll_u[j] = forward_span(ref_seq, w0, length, rc[r], False, sites, marks, ev_mean, e1, e2, k, model,
                                   scalings, nanopolish, trans, r, flank, table, cell, 0, edge, first - 1)  # fmt: skip
            ll_m[j] = forward_span(ref_seq, w0, length, rc[r], True, sites, marks, ev_mean, e1, e2, k, model,
                                   scalings, nanopolish, trans, r, flank, table, cell, first, edge, -1)  # fmt: skip
    return ll_u, ll_m
