"""The CPU's profile HMM: every (read, window) job of a batch, sixteen windows at a time in SIMD lanes.

One window's forward pass is a chain of table log-sums, each waiting on a multiply, a float-to-int
conversion and a dependent table read; run alone it leaves the core idle between them. Here a
group of LANES windows of similar shape (jobs sorted by events, then k-mers) runs in lockstep:
row by row, block by block, one loop over the lanes applies the shared block update
(`hmm_cells.step`) to each lane, with the lanes' values side by side (structure of arrays), and
LLVM turns that loop into vector code (sixteen float32 lanes of AVX-512, the table read by a
gather). Each lane's arithmetic is its window's own, in the same order, so every log-likelihood
is the one-window pass's (`forward`, the GPU's) bit for bit. A lane whose window is shorter than
its group's longest runs padding rows and blocks that nothing reads.

The blocks before a group's first k-mer that differs between the hypotheses (the earliest of its
lanes') have the same values under both, so the methylated pass starts there from the
unmethylated pass's values of the block before, kept row by row (`edge`).

LLVM vectorises the lane loop only when it knows the arrays it writes overlap nothing it reads:
numba marks the arrays a `prange` body uses noalias when the body creates no alias of an array (no
slice or view; an element of a bool array counts as one, so `rc` is read as uint8). So the work
arrays are allocated before the parallel loop, the lane helpers are inlined into its body (numba's
inline="always", the `LANE` target) and the lane count is a compile-time constant.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from streamer.pipeline.targets import CPU
from streamer_plugins.cpg.hmm_cells import hmm_cells
from streamer_plugins.cpg.hmm_model import SLOTS, flank_table, read_transitions

LANES = 16  # windows in lockstep: one AVX-512 vector of float32 (two of AVX2); 8 and 32 measured slower
# the row loop and its helpers, compiled into the parallel loop's body (see the module docstring)
LANE = CPU._replace(jit=numba.njit(nogil=True, error_model="numpy", inline="always"))
_lane, _cpu = hmm_cells(LANE), hmm_cells(CPU)
step, emission, row_end = _lane.step, _lane.emission, _lane.row_end
window_ranks, block_level = _cpu.window_ranks, _cpu.block_level

# rows of a group's lane array `lane`, LANES values each: the previous row's M, B, K of the block
# before, this row's, the row's event, the running log-likelihood, then the read's ten transitions
L_P, L_C, L_LEVEL, L_END, L_TRANS = 0, 3, 6, 7, 8
LANE_ROWS = 18
# rows of a group's job array `job`: job index, read, window start (in ref_seq), window length, first
# event (in ev_mean), event stride, events, k-mers
J_JOB, J_READ, J_W0, J_LEN, J_E1, J_STRIDE, J_EVENTS, J_KMERS = range(8)
JOB_ROWS = 8
U = np.uint64  # unsigned offsets: numba adds no negative-index wraparound, which would hide the stride from LLVM


@LANE.jit
def lane_block(ki, first_block, soft, cell, c0, lane, l0, table, nanopolish):
    """Block ki of one row in every lane: cell[c0:] holds the blocks' M, B, K and levels, lane[l0:] the lanes'
    values carried from block to block (`L_*` rows)."""
    o = U(c0) + U(ki * SLOTS * LANES)
    for x in range(LANES):
        i = o + U(x)
        q = U(l0) + U(x)
        prev = (cell[i], cell[i + U(LANES)], cell[i + U(2 * LANES)])
        t = q + U(L_TRANS * LANES)
        tr = (lane[t], lane[t + U(LANES)], lane[t + U(2 * LANES)], lane[t + U(3 * LANES)], lane[t + U(4 * LANES)],
              lane[t + U(5 * LANES)], lane[t + U(6 * LANES)], lane[t + U(7 * LANES)], lane[t + U(8 * LANES)],
              lane[t + U(9 * LANES)])  # fmt: skip
        p = q + U(L_P * LANES)
        c = q + U(L_C * LANES)
        em = emission(lane[q + U(L_LEVEL * LANES)], cell[i + U(3 * LANES)], cell[i + U(4 * LANES)],
                      cell[i + U(5 * LANES)], nanopolish)  # fmt: skip
        n = step(prev, (lane[p], lane[p + U(LANES)], lane[p + U(2 * LANES)]),
                 (lane[c], lane[c + U(LANES)], lane[c + U(2 * LANES)]), tr, first_block, soft, em, table)  # fmt: skip
        cell[i], cell[i + U(LANES)], cell[i + U(2 * LANES)] = n
        lane[p], lane[p + U(LANES)], lane[p + U(2 * LANES)] = prev
        lane[c], lane[c + U(LANES)], lane[c + U(2 * LANES)] = n


@CPU.jit
def lane_jobs(g, n, order, job_read, job_w0, job_w1, job_e1, job_e2, ref_seq_off, ev_off, k, trans, job, j0, lane,
              l0):  # fmt: skip
    """Group g's jobs (order[g * LANES:], the last repeated past n) into job[j0:] and their reads'
    transitions into lane[l0:]; returns the group's most k-mers and events."""
    max_k = 0
    max_e = 0
    for x in range(LANES):
        j = order[min(g * LANES + x, n - 1)]
        r = job_read[j]
        stride = 1 if job_e1[j] <= job_e2[j] else -1
        n_events = (job_e2[j] - job_e1[j]) * stride + 1
        n_kmers = job_w1[j] - job_w0[j] - k + 1
        job[j0 + J_JOB * LANES + x] = j
        job[j0 + J_READ * LANES + x] = r
        job[j0 + J_W0 * LANES + x] = ref_seq_off[r] + job_w0[j]
        job[j0 + J_LEN * LANES + x] = job_w1[j] - job_w0[j]
        job[j0 + J_E1 * LANES + x] = ev_off[r] + job_e1[j]
        job[j0 + J_STRIDE * LANES + x] = stride
        job[j0 + J_EVENTS * LANES + x] = n_events
        job[j0 + J_KMERS * LANES + x] = n_kmers
        for s in range(10):
            lane[l0 + (L_TRANS + s) * LANES + x] = trans[r, s]
        max_k = max(max_k, n_kmers)
        max_e = max(max_e, n_events)
    return max_k, max_e


@CPU.jit
def lane_ranks(ref_seq, rc, k, sites, marks, job, j0, ranks, r0, max_k):
    """Both hypotheses' k-mer ranks of each lane's window into ranks[r0:] (unmethylated, then methylated,
    max_k * LANES each); returns the group's earliest first k-mer that differs between them (a lane's last
    at most: its methylated pass needs a block of its own)."""
    first = max_k
    for x in range(LANES):
        n_kmers = job[j0 + J_KMERS * LANES + x]
        f = 0
        if n_kmers > 0:
            w0 = job[j0 + J_W0 * LANES + x]
            length = job[j0 + J_LEN * LANES + x]
            strand = rc[job[j0 + J_READ * LANES + x]] != 0
            window_ranks(ref_seq, w0, length, k, strand, False, sites, marks, ranks, r0 + x, LANES)
            window_ranks(ref_seq, w0, length, k, strand, True, sites, marks, ranks, r0 + max_k * LANES + x, LANES)
            while f < n_kmers - 1 and ranks[r0 + f * LANES + x] == ranks[r0 + (max_k + f) * LANES + x]:
                f += 1
        first = min(first, f)
    return first


@CPU.jit
def lane_levels(model, scalings, nanopolish, job, j0, ranks, r0, cell, c0, first, max_k):
    """Blocks first.. of every lane set to -inf with their levels (padding blocks past a lane's window: any finite
    level) from the ranks at ranks[r0:]."""
    ninf = np.float32(-np.inf)
    for ki in range(first, max_k):
        for x in range(LANES):
            i = c0 + ki * SLOTS * LANES + x
            cell[i] = ninf
            cell[i + LANES] = ninf
            cell[i + 2 * LANES] = ninf
            if ki < job[j0 + J_KMERS * LANES + x]:
                level = block_level(ranks[r0 + ki * LANES + x], model, scalings, job[j0 + J_READ * LANES + x],
                                    nanopolish)  # fmt: skip
                cell[i + 3 * LANES], cell[i + 4 * LANES], cell[i + 5 * LANES] = level
            else:
                cell[i + 3 * LANES] = np.float32(0.0)
                cell[i + 4 * LANES] = np.float32(1.0)
                cell[i + 5 * LANES] = np.float32(0.0)


@LANE.jit
def lane_rows(ev_mean, flank, table, nanopolish, job, j0, cell, c0, lane, l0, edge, e0, first, keep, max_k, max_e):
    """One hypothesis's rows over blocks first..max_k - 1 of every lane, each lane's log-likelihood left in its
    L_END row; the blocks before `first` given row by row in edge[e0:] (row, state, lane), and with keep >= 0
    block keep's values kept there."""
    ninf = np.float32(-np.inf)
    if keep >= 0:
        for x in range(3 * LANES):
            edge[e0 + x] = ninf
    for x in range(LANES):
        lane[l0 + L_END * LANES + x] = ninf
    for row in range(1, max_e + 1):
        for x in range(LANES):
            n_events = job[j0 + J_EVENTS * LANES + x]
            # a lane past its last event repeats it: a padding row that nothing reads
            e = job[j0 + J_E1 * LANES + x] + (min(row, n_events) - 1) * job[j0 + J_STRIDE * LANES + x]
            lane[l0 + L_LEVEL * LANES + x] = ev_mean[e]
            for s in range(3):
                before = ninf
                now = ninf
                if first > 0:
                    before = edge[e0 + (3 * (row - 1) + s) * LANES + x]
                    now = edge[e0 + (3 * row + s) * LANES + x]
                lane[l0 + (L_P + s) * LANES + x] = before
                lane[l0 + (L_C + s) * LANES + x] = now
        soft = flank[row - 1]  # the first row - 1 events clipped (block 0 only)
        if first == 0:
            lane_block(0, True, soft, cell, c0, lane, l0, table, nanopolish)
        for ki in range(max(first, 1), max_k):
            lane_block(ki, False, soft, cell, c0, lane, l0, table, nanopolish)
        for x in range(LANES):
            if keep >= 0:
                for s in range(3):
                    edge[e0 + (3 * row + s) * LANES + x] = cell[c0 + (keep * SLOTS + s) * LANES + x]
            n_events = job[j0 + J_EVENTS * LANES + x]
            if row <= n_events:
                end = l0 + L_END * LANES + x
                post = flank[n_events - row]  # the events after the row clipped
                i = c0 + (job[j0 + J_KMERS * LANES + x] - 1) * SLOTS * LANES + x
                if job[j0 + J_KMERS * LANES + x] > 0:  # (one tuple per call: numba counts a reassigned one as an alias)
                    lane[end] = row_end(lane[end], (cell[i], cell[i + LANES], cell[i + 2 * LANES]), post, table)
                else:
                    lane[end] = row_end(lane[end], (ninf, ninf, ninf), post, table)


def score_windows(job_read: np.ndarray, job_w0: np.ndarray, job_w1: np.ndarray, job_e1: np.ndarray, job_e2: np.ndarray,
                  ref_seq: np.ndarray, ref_seq_off: np.ndarray, rc: np.ndarray, ev_mean: np.ndarray, ev_off: np.ndarray,
                  scalings: np.ndarray, events_per_base: np.ndarray, k: int, model: np.ndarray, sites: np.ndarray,
                  marks: np.ndarray, params: np.ndarray, table: np.ndarray,
                  nanopolish: bool) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Unmethylated and methylated log-likelihoods of every (read, window) job, in parallel.

    Job j scores ref_seq[ref_seq_off[r] + w0 : ... + w1] of read r = job_read[j] against the
    read's events job_e1[j]..job_e2[j] (event indices within the read). Returns float32 arrays
    (ll_unmethylated, ll_methylated). The jobs go in groups of LANES, sorted by events and k-mers
    so that a group's windows are alike, over four times as many chunks of work arrays as numba
    has threads (asked here: numba cannot cache a kernel that asks).
    """
    return _score_groups(job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off, scalings,
                         events_per_base, k, model, sites, marks, params, table, nanopolish,
                         4 * numba.get_num_threads())  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _score_groups(
    job_read, job_w0, job_w1, job_e1, job_e2, ref_seq, ref_seq_off, rc, ev_mean, ev_off,
    scalings, events_per_base, k, model, sites, marks, params, table, nanopolish, max_chunks,
):  # fmt: skip
    """`score_windows` over at most max_chunks chunks, each with work arrays of its own allocated here
    and taking every n_chunks-th group (see the module docstring)."""
    n = job_read.shape[0]
    ll_u = np.empty(n, np.float32)
    ll_m = np.empty(n, np.float32)
    if n == 0:
        return ll_u, ll_m
    trans = read_transitions(job_read, events_per_base, params)
    n_events = np.abs(job_e2 - job_e1) + 1
    n_kmers = np.maximum(job_w1 - job_w0 - k + 1, 0)
    max_events = n_events.max()
    max_kmers = max(n_kmers.max(), 1)
    flank = flank_table(max_events, params)
    order = np.argsort(n_events * (max_kmers + 1) + n_kmers, kind="mergesort")
    rc8 = rc.astype(np.uint8)
    n_groups = (n + LANES - 1) // LANES
    n_chunks = min(n_groups, max_chunks)
    c_len = max_kmers * SLOTS * LANES
    e_len = (max_events + 1) * 3 * LANES
    r_len = 2 * max_kmers * LANES
    cell = np.empty(n_chunks * c_len, np.float32)
    edge = np.empty(n_chunks * e_len, np.float32)
    lane = np.empty(n_chunks * LANE_ROWS * LANES, np.float32)
    ranks = np.empty(n_chunks * r_len, np.int64)
    job = np.empty(n_chunks * JOB_ROWS * LANES, np.int64)
    for c in prange(n_chunks):
        c0, e0, r0 = c * c_len, c * e_len, c * r_len
        l0, j0 = c * LANE_ROWS * LANES, c * JOB_ROWS * LANES
        for g in range(c, n_groups, n_chunks):
            max_k, max_e = lane_jobs(g, n, order, job_read, job_w0, job_w1, job_e1, job_e2, ref_seq_off, ev_off, k,
                                     trans, job, j0, lane, l0)  # fmt: skip
            first = lane_ranks(ref_seq, rc8, k, sites, marks, job, j0, ranks, r0, max_k)
            for methylated in (False, True):
                start = first if methylated else 0
                keep = -1 if methylated else first - 1
                lane_levels(model, scalings, nanopolish, job, j0, ranks, r0 + (max_k * LANES if methylated else 0),
                            cell, c0, start, max_k)  # fmt: skip
                lane_rows(ev_mean, flank, table, nanopolish, job, j0, cell, c0, lane, l0, edge, e0, start, keep,
                          max_k, max_e)  # fmt: skip
                for x in range(min(LANES, n - g * LANES)):
                    if methylated:  # (not one name for either array: numba would count it as an alias)
                        ll_m[job[j0 + J_JOB * LANES + x]] = lane[l0 + L_END * LANES + x]
                    else:
                        ll_u[job[j0 + J_JOB * LANES + x]] = lane[l0 + L_END * LANES + x]
    return ll_u, ll_m
