"""Base-level alignment of chains: the bases between anchors filled and the ends extended, into CIGARs.

One banded dynamic programme does both, with minimap2's map-ont scores (match 2, mismatch 4, N 1,
two-piece affine gaps costing min(4 + 2l, 24 + l)): global between two anchors (the band covers the
two gaps' difference plus a margin), and from an anchor outwards to the read's end, stopping at the
best-scoring cell (the rest is clipped) and giving up once a row falls `zdrop` below the best so far.
Ties go to the diagonal, which places a gap at its leftmost position, as minimap2 does (the left end,
extended on both sequences reversed, breaks ties the other way for the same result).

Measured against edlib and parasail on the same jobs (`benchmarks/bench_extend.py`), this numba
kernel was chosen: see docs/alignment.md for the numbers.

A batch's chains are aligned in chunks on threads (the kernel releases the GIL); each chunk's
CIGARs come back laid end to end with offsets, as (op, length) in pysam's numbering.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from streamer.align.anchors import Seeds
from streamer.align.chain import Chains

OP_M, OP_I, OP_D = 0, 1, 2
NEG = -(1 << 28)
GLOBAL, EXTEND = 0, 1


@dataclass(frozen=True)
class ExtendParams:
    """The DP's scores (minimap2's map-ont) and bands."""

    match: int = 2  # score of a matching base
    mismatch: int = 4  # cost of a mismatch
    ambiguous: int = 1  # cost of a base against N
    gap_open: int = 4  # a gap of l bases costs min(gap_open + gap_extend * l, long_gap_open + long_gap_extend * l)
    gap_extend: int = 2
    long_gap_open: int = 24  # the second piece: long gaps cost less per base
    long_gap_extend: int = 1
    band: int = 200  # half-width of the band of an end extension
    gap_band: int = 15  # margin of the band between anchors, beyond the gaps' difference
    zdrop: int = 400
    anchor_trim: int = 8  # bases of each anchor's ends aligned by the DP too


@dataclass(frozen=True)
class Alignments:
    """The base-level alignment of each chain: its span (query on the read as aligned) and CIGAR."""

    qstart: np.ndarray  # int64
    qend: np.ndarray
    rstart: np.ndarray  # on the contigs laid end to end
    rend: np.ndarray
    score: np.ndarray  # int64: the DP score of the whole alignment
    nm: np.ndarray  # int64: mismatches plus inserted and deleted bases
    cigar: np.ndarray  # int32[:, 2] (op, length)
    cigar_off: np.ndarray  # int64[n + 1]


@numba.njit(nogil=True, cache=True)
def _align(q, r, mode, w, sc, ops, rightmost=False):
    """Align q to r in a band of diagonals: whole of both (GLOBAL), or from their starts to the best cell
    (EXTEND). sc: match, mismatch, ambiguous, q1, e1, q2, e2, zdrop. Ties go to the diagonal (gaps at
    their leftmost place), or with `rightmost` to the gaps (for sequences given reversed). Writes one op per
    column into `ops` from the end backwards (reversed) and returns (n ops, query used, reference used, score)."""
    tie = 1 if rightmost else 0
    n, m = len(q), len(r)
    a, b, amb, q1, e1, q2, e2, zdrop = sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7]
    if mode == GLOBAL:
        dlo, dhi = min(0, m - n) - w, max(0, m - n) + w
    else:
        dlo, dhi = -w, w
    width = dhi - dlo + 1
    tb = np.zeros((n + 1, width), dtype=np.uint8)
    h_prev = np.full(m + 1, NEG, dtype=np.int64)
    f1 = np.full(m + 1, NEG, dtype=np.int64)
    f2 = np.full(m + 1, NEG, dtype=np.int64)
    h_cur = np.full(m + 1, NEG, dtype=np.int64)
    best, bi, bj = np.int64(0), 0, 0
    h_prev[0] = 0
    for j in range(1, min(m, dhi) + 1):
        e_1, e_2 = -(q1 + e1 * j), -(q2 + e2 * j)
        h_prev[j] = max(e_1, e_2)
        tb[0, j - dlo] = 1 if e_1 >= e_2 else 2
        tb[0, j - dlo] |= (8 | 16) if j > 1 else 0
    subst = np.empty(25, dtype=np.int64)  # score of query code x against reference code y at 5x + y
    for x in range(5):
        for y in range(5):
            subst[5 * x + y] = -amb if x > 3 or y > 3 else (a if x == y else -b)
    for i in range(1, n + 1):
        lo, hi = max(0, i + dlo), min(m, i + dhi)
        if lo > hi:
            break
        e_1 = e_2 = np.int64(NEG)
        row_best = np.int64(NEG)
        row = tb[i]
        off = i + dlo
        qrow = 5 * np.int64(q[i - 1])
        if lo == 0:  # the first column: only insertions lead here
            v1, v2 = max(h_prev[0] - q1 - e1, f1[0] - e1), max(h_prev[0] - q2 - e2, f2[0] - e2)
            t = (32 if f1[0] - e1 > h_prev[0] - q1 - e1 else 0) | (64 if f2[0] - e2 > h_prev[0] - q2 - e2 else 0)
            f1[0], f2[0] = v1, v2
            h_left = max(v1, v2)
            row[-off] = t | (3 if v1 >= v2 else 4)
            h_cur[0] = h_left
            row_best = h_left
            h_diag = h_prev[0]
            lo = 1
        else:
            h_left = np.int64(NEG)
            h_diag = h_prev[lo - 1]
        for j in range(lo, hi + 1):
            hp = h_prev[j]
            # vertical gaps (insertions: a query base against no reference base)
            o1, x1 = hp - q1 - e1, f1[j] - e1
            o2, x2 = hp - q2 - e2, f2[j] - e2
            # horizontal gaps (deletions: a reference base against no query base)
            p1, y1 = h_left - q1 - e1, e_1 - e1
            p2, y2 = h_left - q2 - e2, e_2 - e2
            t = (32 if x1 > o1 else 0) | (64 if x2 > o2 else 0) | (8 if y1 > p1 else 0) | (16 if y2 > p2 else 0)
            v1, v2 = max(o1, x1), max(o2, x2)
            e_1, e_2 = max(p1, y1), max(p2, y2)
            f1[j], f2[j] = v1, v2
            h = h_diag + subst[qrow + r[j - 1]]
            src = 0
            if e_1 > h - tie:
                h, src = e_1, 1
            if e_2 > h - tie:
                h, src = e_2, 2
            if v1 > h - tie:
                h, src = v1, 3
            if v2 > h - tie:
                h, src = v2, 4
            h_cur[j] = h
            row[j - off] = t | src
            h_diag = hp
            h_left = h
            if h > row_best:
                row_best = h
        if mode == EXTEND and row_best > best:
            for j in range(lo if lo > 0 else 0, hi + 1):
                if h_cur[j] > best:
                    best, bi, bj = h_cur[j], i, j
        if hi < m:
            h_cur[hi + 1] = NEG
            f1[hi + 1] = NEG
            f2[hi + 1] = NEG
        h_prev, h_cur = h_cur, h_prev
        if mode == EXTEND and row_best < best - zdrop:
            break
    if mode == GLOBAL:
        bi, bj, best = n, m, h_prev[m]
    # trace back from (bi, bj)
    i, j, state, k = bi, bj, 0, 0
    while i > 0 or j > 0:
        t = tb[i, j - i - dlo]
        if state == 0:
            src = t & 7
            if src == 0:
                ops[k] = OP_M
                i -= 1
                j -= 1
                k += 1
                continue
            state = src
        if state == 1 or state == 2:
            ops[k] = OP_D
            ext = (t & (8 if state == 1 else 16)) != 0
            j -= 1
        else:
            ops[k] = OP_I
            ext = (t & (32 if state == 3 else 64)) != 0
            i -= 1
        k += 1
        if not ext:
            state = 0
    return k, bi, bj, best


@numba.njit(nogil=True, cache=True)
def _emit(cig, first, nc, op, length):
    """Append (op, length) to the run-length CIGAR `cig` whose runs start at `first` (merging with the last
    run); returns the new count."""
    if length <= 0:
        return nc
    if nc > first and cig[nc - 1, 0] == op:
        cig[nc - 1, 1] += length
        return nc
    cig[nc, 0] = op
    cig[nc, 1] = length
    return nc + 1


@numba.njit(nogil=True, cache=True)
def _align_emit(qx, rx, mode, band, sc, cig, first, nc, q, genome, q0, r0):
    """qx aligned against rx (GLOBAL, or EXTEND from their starts) at q0, r0 of the read and the genome, its
    ops (which `_align` writes last column first) appended to the CIGAR begun at cig[first]; returns the
    CIGAR's new end, the query and reference bases used, the score and the NM of those columns."""
    ops = np.empty(len(qx) + len(rx) + 1, dtype=np.uint8)
    k, qu, ru, s = _align(qx, rx, mode, band, sc, ops)
    for u in range(k - 1, -1, -1):
        nc = _emit(cig, first, nc, ops[u], 1)
    return nc, qu, ru, s, _count_nm(ops[:k][::-1].copy(), k, q, genome, q0, r0, 1)


@numba.njit(nogil=True, cache=True)
def _count_nm(ops, k, q, r, qi, rj, step):
    """Mismatches and gap bases of `k` ops walked from (qi, rj) in direction `step` (+1 forwards, -1 back)."""
    nm = 0
    for t in range(k):
        op = ops[t]
        if op == OP_M:
            if q[qi] != r[rj] or q[qi] > 3:
                nm += 1
            qi += step
            rj += step
        elif op == OP_I:
            nm += 1
            qi += step
        else:
            nm += 1
            rj += step
    return nm


@numba.njit(nogil=True, cache=True)
def extend_chains(q_all, q_start, q_end, genome, ctg_start, ctg_end, a_qs, a_rs, a_ln, a_off, w, gap_band, sc,
                  out_q0, out_q1, out_r0, out_r1, out_score, out_nm):
    """Align each chain c: query `q_all[q_start[c]:q_end[c]]` (the read as aligned), its anchors
    `a_*[a_off[c]:a_off[c+1]]` (query and contig-end-to-end reference starts, lengths; forward on both),
    reference limits [ctg_start[c], ctg_end[c]). Returns the CIGARs laid end to end and their offsets."""
    n_chains = len(q_start)
    cap = 1024
    cig = np.zeros((cap, 2), dtype=np.int32)
    cig_off = np.zeros(n_chains + 1, dtype=np.int64)
    nc = 0
    for c in range(n_chains):
        q = q_all[q_start[c]:q_end[c]]
        lq = len(q)
        a0, a1 = a_off[c], a_off[c + 1]
        # anchors trimmed so that none overlaps the one before on either sequence
        qs = np.empty(a1 - a0, dtype=np.int64)
        rs = np.empty(a1 - a0, dtype=np.int64)
        ln = np.empty(a1 - a0, dtype=np.int64)
        na = 0
        for t in range(a0, a1):
            s_q, s_r, s_l = np.int64(a_qs[t]), np.int64(a_rs[t]), np.int64(a_ln[t])
            if na > 0:
                over = max(qs[na - 1] + ln[na - 1] - s_q, rs[na - 1] + ln[na - 1] - s_r, 0)
                if over >= s_l:
                    continue
                s_q, s_r, s_l = s_q + over, s_r + over, s_l - over
            qs[na], rs[na], ln[na] = s_q, s_r, s_l
            na += 1
        # anchors split the work, not the alignment: all but their middle bases go to the DP, so that a
        # gap at an anchor's edge may move left as the scores' ties place it
        for t in range(na):
            cut = min(sc[8], (ln[t] - 1) // 2)
            qs[t], rs[t], ln[t] = qs[t] + cut, rs[t] + cut, ln[t] - 2 * cut
        # room for this chain's runs: at most one per aligned column
        left_q = qs[0]
        right_q = lq - (qs[na - 1] + ln[na - 1])
        need = nc + 2 * (lq + rs[na - 1] + ln[na - 1] - rs[0] + 2 * w) + 8
        if need > cap:
            while cap < need:
                cap *= 2
            grown = np.zeros((cap, 2), dtype=np.int32)
            grown[:nc] = cig[:nc]
            cig = grown
        first = nc
        score = np.int64(0)
        nm = 0
        # left end: both sequences reversed, extended from the first anchor outwards
        lr = min(rs[0] - ctg_start[c], left_q + w)
        q_left = q[:left_q][::-1].copy()
        r_left = genome[rs[0] - lr:rs[0]][::-1].copy()
        ops = np.empty(len(q_left) + len(r_left) + 1, dtype=np.uint8)
        k, qu, ru, s = _align(q_left, r_left, EXTEND, w, sc, ops, True)
        score += s
        # the ops of the reversed sequences, written from their end backwards, run forwards here
        qi, rj = left_q - qu, rs[0] - ru
        out_q0[c], out_r0[c] = qi, rj
        for t in range(k):
            nc = _emit(cig, first, nc, ops[t], 1)
        nm += _count_nm(ops, k, q, genome, qi, rj, 1)
        for t in range(na):
            if t > 0:
                gq0, gr0 = qs[t - 1] + ln[t - 1], rs[t - 1] + ln[t - 1]
                qg, rg = q[gq0:qs[t]], genome[gr0:rs[t]]
                if len(qg) == 0 or len(rg) == 0:
                    nc = _emit(cig, first, nc, OP_I, len(qg))
                    nc = _emit(cig, first, nc, OP_D, len(rg))
                    gl = max(len(qg), len(rg))
                    if gl > 0:
                        score -= min(sc[3] + sc[4] * gl, sc[5] + sc[6] * gl)
                        nm += gl
                else:
                    nc, _, _, s, gnm = _align_emit(qg, rg, GLOBAL, gap_band, sc, cig, first, nc, q, genome, gq0, gr0)
                    score += s
                    nm += gnm
            nc = _emit(cig, first, nc, OP_M, ln[t])
            score += sc[0] * ln[t]
        # right end
        e_q, e_r = qs[na - 1] + ln[na - 1], rs[na - 1] + ln[na - 1]
        rr = min(ctg_end[c] - e_r, right_q + w)
        q_right = q[e_q:].copy()
        r_right = genome[e_r:e_r + rr].copy()
        nc, qu, ru, s, gnm = _align_emit(q_right, r_right, EXTEND, w, sc, cig, first, nc, q, genome, e_q, e_r)
        score += s
        nm += gnm
        out_q1[c], out_r1[c] = e_q + qu, e_r + ru
        out_score[c], out_nm[c] = score, nm
        cig_off[c + 1] = nc
    return cig[:nc].copy(), cig_off


def both_strands(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The reads' codes, then each read's reverse complement where the read is, shifted by len(codes)."""
    lens = np.diff(offsets)
    read_of = np.repeat(np.arange(len(lens)), lens)
    mirror = offsets[read_of] + offsets[read_of + 1] - 1 - np.arange(len(codes))
    rc = codes[mirror]
    return np.concatenate([codes, np.where(rc < 4, 3 - rc, rc).astype(np.uint8)])


def _scores(p: ExtendParams) -> np.ndarray:
    return np.array([p.match, p.mismatch, p.ambiguous, p.gap_open, p.gap_extend, p.long_gap_open,
                     p.long_gap_extend, p.zdrop, p.anchor_trim], dtype=np.int64)


def extend(chains: Chains, seeds: Seeds, codes: np.ndarray, offsets: np.ndarray, genome: np.ndarray,
           contig_offsets: np.ndarray, params: ExtendParams = ExtendParams(), threads: int = 1) -> Alignments:
    """Base-level alignments of the chains of reads `codes`/`offsets` (as basecalled) on `genome` (the
    contigs' codes laid end to end), in chunks over `threads` threads."""
    n = len(chains)
    strands = both_strands(codes, offsets)
    read = chains.read.astype(np.int64)
    q_start = offsets[read] + np.where(chains.rc, len(codes), 0)
    q_end = q_start + np.diff(offsets)[read]
    ctg = chains.contig.astype(np.int64)
    a = chains.anchors
    a_qs, a_rs, a_ln = seeds.qpos[a].astype(np.int64), seeds.rpos[a], seeds.length[a].astype(np.int64)
    sc = _scores(params)
    fields = [np.zeros(n, dtype=np.int64) for _ in range(6)]

    def run(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        a0, a1 = chains.anchor_off[lo], chains.anchor_off[hi]
        return extend_chains(strands, q_start[lo:hi], q_end[lo:hi], genome, contig_offsets[ctg[lo:hi]],
                             contig_offsets[ctg[lo:hi] + 1], a_qs[a0:a1], a_rs[a0:a1], a_ln[a0:a1],
                             chains.anchor_off[lo:hi + 1] - a0, params.band, params.gap_band, sc,
                             *(f[lo:hi] for f in fields))

    cuts = np.linspace(0, n, min(n, 4 * max(1, threads)) + 1).astype(np.int64) if n else np.zeros(1, np.int64)
    spans = list(zip(cuts[:-1], cuts[1:]))
    if threads > 1 and len(spans) > 1:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="extend") as pool:
            parts = list(pool.map(lambda s: run(*s), spans))
    else:
        parts = [run(*s) for s in spans]
    cigar = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, 2), np.int32)
    sizes = np.concatenate([np.diff(o) for _, o in parts]) if parts else np.zeros(0, np.int64)
    q0, q1, r0, r1, score, nm = fields
    return Alignments(q0, q1, r0, r1, score, nm, cigar, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
