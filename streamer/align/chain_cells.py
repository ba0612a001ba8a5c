"""Chaining's dynamic programme written once for the CPU kernel (`streamer.align.chain`) and the CUDA kernel
(`streamer_gpu.chain`): a group's gap slope, whether and how one anchor extends another's chain, the score
it gets, the skip rule's step, and the read-back of a group's chains.

`chain_cells(target)` compiles them for a target (`streamer.pipeline.targets`). Scores are integers; the
one float in the programme, the gap cost `int(gap_scale * 0.01 * mean length * g + 0.5 * log2 g)`, takes
its products and sum from the target's round-to-nearest operations (CUDA would fuse them into one
multiply-add) and its logarithms from a table the CPU fills (`half_log2_table`: CUDA's log2 may differ from
the C library's in the last bit), so the truncated cost, and every score after it, is the same on both.
The cells of the predecessor search take scalars: an array handed to a CPU function called per
predecessor costs its reference counts, which made the search 15x slower.

A group is one read strand's anchors, in order of their end on the reference, at [a, b) of the batch's
flat arrays; every index the cells take or write is the batch's. numba's cache of the CPU kernels that
call these cells is checked against their own file only: after editing this one, delete the `*.nbi`/`*.nbc`
files of `streamer/align/__pycache__`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from streamer.pipeline.targets import Target

FAR, NONE, JOIN = 0, 1, 2  # a predecessor too far back on the reference (so are all before it), one that
# cannot be joined, one that can (`candidate`)


@numba.njit(nogil=True, cache=True)
def half_log2_table(n: int) -> np.ndarray:
    """0.5 * log2(g) for g in [0, n) as the CPU's C library computes it (entry 0 unused)."""
    out = np.zeros(max(n, 1), np.float64)
    for g in range(1, n):
        out[g] = 0.5 * np.log2(np.int64(g))
    return out


def table_size(max_gap: int, bandwidth: int) -> int:
    """Entries of `half_log2_table` a programme reads: gaps differ by at most bandwidth, and by less than max_gap."""
    return max(0, min(bandwidth, max_gap)) + 1


class ChainCells(NamedTuple):
    """Chaining's shared cells compiled for one target (`chain_cells`)."""

    gap_slope: Callable
    candidate: Callable
    joined: Callable
    step: Callable
    read_back: Callable


@functools.cache
def chain_cells(t: Target) -> ChainCells:
    """The dynamic programme's cells, compiled for target t."""
    dadd, dmul, ddiv = t.dadd, t.dmul, t.ddiv

    @t.jit
    def gap_slope(total_len, n, gap_scale):
        """gap_scale * 0.01 * the group's mean anchor length (numba's mean of integers: their sum over n)."""
        return dmul(dmul(gap_scale, 0.01), ddiv(np.float64(total_len), np.float64(n)))

    @t.jit
    def candidate(qs_i, rs_i, ln_i, ctg_i, qs_j, rs_j, ln_j, ctg_j, max_gap, bandwidth):
        """(kind, g, bases) of anchor i extending anchor j's chain: kind FAR, NONE or JOIN (module constants),
        g the difference of the two gaps, bases what i adds."""
        dr = rs_i + ln_i - (rs_j + ln_j)
        if dr > max_gap:
            return FAR, 0, 0
        dq = qs_i + ln_i - (qs_j + ln_j)
        if dr <= 0 or dq <= 0 or dq > max_gap or ctg_j != ctg_i or qs_j >= qs_i or rs_j >= rs_i:
            return NONE, 0, 0
        g = dq - dr if dq > dr else dr - dq
        if g > bandwidth:
            return NONE, 0, 0
        bases = dq if dq < dr else dr
        return JOIN, g, ln_i if ln_i < bases else bases

    @t.jit
    def joined(f_j, bases, g, slope, half_log2_g):
        """The score of a JOIN: j's, plus the bases added, less the gap cost (half_log2_g: `half_log2_table`[g])."""
        if g == 0:
            return f_j + bases
        return f_j + bases - int(dadd(dmul(slope, np.float64(g)), half_log2_g))

    @t.jit
    def step(score, j, best, parent, skipped, max_skip):
        """(best, parent, skipped, stop) after a joinable predecessor j scoring score: a strictly better one is
        kept, and the search stops after more than max_skip in a row that are not (minimap2's skip rule)."""
        if score > best:
            return score, j, 0, False
        return best, parent, skipped + 1, skipped + 1 > max_skip

    @t.jit
    def read_back(f, p, order, used, path, a, b, min_score, min_anchors, c_score, c_first, c_count, anchor_out):
        """The chains of group [a, b), read back from its anchors in `order[a:b]` (by score, best first, ties
        by position), each stopping at an anchor already used; those under min_score or min_anchors left out.
        Chain k's score, first and count go to slot a + k, its anchors (positions in the group, ascending) to
        anchor_out[a + first:]; returns the group's number of chains."""
        n_chains = 0
        out = 0
        for t_ in range(a, b):
            end = order[t_]
            if used[end]:
                continue
            k = 0
            i = end
            while i >= 0 and not used[i]:
                used[i] = True
                path[a + k] = i
                k += 1
                i = p[i]
            score = f[end] - (f[i] if i >= 0 else 0)
            if score < min_score or k < min_anchors:
                continue
            c_score[a + n_chains] = score
            c_first[a + n_chains] = out
            c_count[a + n_chains] = k
            for m in range(k):
                anchor_out[a + out + m] = path[a + k - 1 - m] - a
            out += k
            n_chains += 1
        return n_chains

    return ChainCells(gap_slope, candidate, joined, step, read_back)
