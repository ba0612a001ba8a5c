"""The banded DP of base-level extension written once for the CPU (`streamer.align.extend`) and the
CUDA kernel (`streamer_gpu.extend`): one job's fill and its traceback into CIGAR runs.

A job is one row of an int64 table (the `JOB` fields): the query read from q[Q0] in steps of QSTEP
(-1 reads it reversed, as the left end is aligned), the reference likewise from r[R0], the mode,
the band's half-width and the tie rule. `extend_cells(target)` compiles the cells for a target
(`streamer.pipeline.targets`); everything is integer arithmetic, so both targets give the same runs,
scores and NM.

The fill keeps one row of H and of the two vertical gap scores in band coordinates (column c of row
i is reference base i + dlo + c), updated in place: cell c reads the row above at c (diagonal) and
c + 1 (up) before writing c, and c = width stays out of the band. Traceback bits go to a
byte matrix of (n + 1) x width; every array index is base + offset * stride, so the GPU interleaves
the 32 jobs of a warp (stride 32) while the CPU runs one job at a time (stride 1). The band is clipped
to the diagonals the matrix has, which changes no cell. Runs come out in traceback order (last column
first) as int32 (length << 2 | op).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from streamer.pipeline.targets import Target

OP_M, OP_I, OP_D = 0, 1, 2  # pysam's numbering
NEG = -(1 << 28)
GLOBAL, EXTEND = 0, 1
# a job's fields: query start, step and length; reference start, step and length; mode; band; 1 to
# break ties towards gaps (sequences given reversed)
Q0, QSTEP, QLEN, R0, RSTEP, RLEN, MODE, BAND, TIE = range(9)
JOB = 9
# a job's results: runs written, query and reference bases used, score, NM
N_RUNS, Q_USED, R_USED, SCORE, NM = range(5)
RESULT = 5


class ExtendCells(NamedTuple):
    """The DP's cells compiled for one target (`extend_cells`)."""

    band: Callable
    fill: Callable
    trace: Callable
    align_job: Callable


@functools.cache
def extend_cells(t: Target) -> ExtendCells:
    """The banded DP's fill and traceback, compiled for target t."""

    @t.jit
    def band(mode, w, n, m):
        """The band's first diagonal (reference minus query position) and its width, clipped to the matrix."""
        if mode == GLOBAL:
            dlo, dhi = min(0, m - n) - w, max(0, m - n) + w
        else:
            dlo, dhi = -w, w
        dlo, dhi = max(dlo, -n), min(dhi, m)
        return dlo, dhi - dlo + 1

    @t.jit
    def fill(q, q0, qs, n, r, r0, rs, m, mode, w, tie, sc, tb, tb0, h, f1, f2, s0, ts):
        """Align q to r in a band of diagonals: whole of both (GLOBAL), or from their starts to the best cell
        (EXTEND, stopping once a row falls zdrop below the best). sc: match, mismatch, ambiguous, q1, e1, q2,
        e2, zdrop. Ties go to the diagonal (gaps leftmost), or with tie 1 to the gaps. Fills the traceback
        bytes tb and returns the cell to trace back from and its score."""
        a, b, amb, q1, e1, q2, e2, zdrop = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
        dlo, width = band(mode, w, n, m)
        dhi = dlo + width - 1
        for c in range(width + 1):
            h[s0 + c * ts] = NEG
            f1[s0 + c * ts] = NEG
            f2[s0 + c * ts] = NEG
        h[s0 - dlo * ts] = 0
        for j in range(1, min(m, dhi) + 1):
            g1, g2 = -(q1 + e1 * j), -(q2 + e2 * j)
            h[s0 + (j - dlo) * ts] = max(g1, g2)
            tb[tb0 + (j - dlo) * ts] = (1 if g1 >= g2 else 2) | ((8 | 16) if j > 1 else 0)
        best, bi, bj = 0, 0, 0
        for i in range(1, n + 1):
            lo, hi = max(0, i + dlo), min(m, i + dhi)
            if lo > hi:
                break
            off = i + dlo  # reference position of column 0
            row = tb0 + i * width * ts
            x = q[q0 + qs * (i - 1)]
            g1 = g2 = NEG
            row_best = best_j = NEG
            at_j = 0
            if lo == 0:  # the first column: only insertions lead here
                at = s0 - off * ts
                hp, fa, fb = h[at + ts], f1[at + ts], f2[at + ts]
                v1, v2 = max(hp - q1 - e1, fa - e1), max(hp - q2 - e2, fb - e2)
                tv = (32 if fa - e1 > hp - q1 - e1 else 0) | (64 if fb - e2 > hp - q2 - e2 else 0)
                f1[at], f2[at] = v1, v2
                h_left = max(v1, v2)
                h[at] = h_left
                tb[row - off * ts] = tv | (3 if v1 >= v2 else 4)
                row_best = h_left
                h_diag = hp
                lo = 1
            else:
                h_left = NEG
                h_diag = h[s0 + (lo - off) * ts]
            for j in range(lo, hi + 1):
                at = s0 + (j - off) * ts
                hp = h[at + ts]
                # vertical gaps (insertions: a query base against no reference base)
                o1, x1 = hp - q1 - e1, f1[at + ts] - e1
                o2, x2 = hp - q2 - e2, f2[at + ts] - e2
                # horizontal gaps (deletions: a reference base against no query base)
                p1, y1 = h_left - q1 - e1, g1 - e1
                p2, y2 = h_left - q2 - e2, g2 - e2
                tv = (32 if x1 > o1 else 0) | (64 if x2 > o2 else 0) | (8 if y1 > p1 else 0) | (16 if y2 > p2 else 0)
                v1, v2 = max(o1, x1), max(o2, x2)
                g1, g2 = max(p1, y1), max(p2, y2)
                f1[at], f2[at] = v1, v2
                y = r[r0 + rs * (j - 1)]
                hh = h_diag + (-amb if x > 3 or y > 3 else (a if x == y else -b))
                src = 0
                if g1 > hh - tie:
                    hh, src = g1, 1
                if g2 > hh - tie:
                    hh, src = g2, 2
                if v1 > hh - tie:
                    hh, src = v1, 3
                if v2 > hh - tie:
                    hh, src = v2, 4
                h[at] = hh
                tb[row + (j - off) * ts] = tv | src
                h_diag = hp
                h_left = hh
                if hh > row_best:
                    row_best = hh
                if hh > best_j:  # the row's best past the first column, its first place
                    best_j, at_j = hh, j
            if mode == EXTEND:
                if best_j > best:
                    best, bi, bj = best_j, i, at_j
                if row_best < best - zdrop:
                    break
        if mode == GLOBAL:
            bi, bj, best = n, m, h[s0 + (m - n - dlo) * ts]
        return bi, bj, best

    @t.jit
    def trace(q, q0, qs, r, r0, rs, dlo, width, tb, tb0, ts, bi, bj, runs, run0):
        """Trace back from (bi, bj) to (0, 0), writing runs last column first; returns their count and the NM
        (mismatches, or N, in matched columns plus gap bases)."""
        i, j, state, k, nm = bi, bj, 0, 0, 0
        cur, length = -1, 0
        while i > 0 or j > 0:
            tv = tb[tb0 + (i * width + j - i - dlo) * ts]
            if state == 0 and tv & 7 == 0:
                op = OP_M
                x, y = q[q0 + qs * (i - 1)], r[r0 + rs * (j - 1)]
                if x != y or x > 3:
                    nm += 1
                i -= 1
                j -= 1
            else:
                if state == 0:
                    state = tv & 7
                if state == 1 or state == 2:
                    op = OP_D
                    ext = (tv & (8 if state == 1 else 16)) != 0
                    j -= 1
                else:
                    op = OP_I
                    ext = (tv & (32 if state == 3 else 64)) != 0
                    i -= 1
                nm += 1
                if not ext:
                    state = 0
            if op == cur:
                length += 1
            else:
                if length > 0:
                    runs[run0 + k] = (length << 2) | cur
                    k += 1
                cur, length = op, 1
        if length > 0:
            runs[run0 + k] = (length << 2) | cur
            k += 1
        return k, nm

    @t.jit
    def align_job(q, r, jobs, jb, sc, tb, tb0, h, f1, f2, s0, ts, runs, run0, res, out):
        """Job jb of the table: filled (scratch at tb0 and s0, stride ts), traced into runs[run0:], and its
        results in res[out]."""
        q0, qs, n = jobs[jb, Q0], jobs[jb, QSTEP], jobs[jb, QLEN]
        r0, rs, m = jobs[jb, R0], jobs[jb, RSTEP], jobs[jb, RLEN]
        mode, w, tie = jobs[jb, MODE], jobs[jb, BAND], jobs[jb, TIE]
        bi, bj, best = fill(q, q0, qs, n, r, r0, rs, m, mode, w, tie, sc, tb, tb0, h, f1, f2, s0, ts)
        dlo, width = band(mode, w, n, m)
        k, nm = trace(q, q0, qs, r, r0, rs, dlo, width, tb, tb0, ts, bi, bj, runs, run0)
        res[out, N_RUNS] = k
        res[out, Q_USED] = bi
        res[out, R_USED] = bj
        res[out, SCORE] = best
        res[out, NM] = nm

    return ExtendCells(band, fill, trace, align_job)

