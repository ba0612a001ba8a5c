"""Chains of seeds: which exact matches of a read belong to one alignment, and which alignments of a
read are its primary, its supplementary parts (a chimera's other pieces) and its secondaries.

Chaining is minimap2's dynamic programme over anchors, written for seeds of any length: the anchors
of one read and strand, in order of their end on the reference, each scored as the best of
starting a chain (its length) or extending one of the `max_lookback` anchors before it (the search
stops after `max_skip` valid ones in a row that do not improve it, like minimap2's skip rule), adding
the bases it brings (min of the two gaps and its length) less a gap cost for the difference of the two
gaps g: `gap_scale * 0.01 * mean anchor length * g + 0.5 * log2(g)`. Two anchors join only on one
contig, in order on both sequences, within `max_gap` bases and with gaps differing by at most
`bandwidth`. Chains are read back best first, each stopping where it meets an anchor already used.

Of a read's chains (both strands), the best is the primary; a later one overlapping a kept
primary on the read by more than `mask_level` of the shorter is its secondary (at most `best_n`,
scoring at least `pri_ratio` of it), else a supplementary part. MAPQ is minimap2's idea: 40 times
(1 - second best / best) times ln(best), lowered for chains of few anchors or low score and for
many near-equal alternatives, between 0 and 60.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from streamer.align.anchors import Seeds

PRIMARY, SUPPLEMENTARY, SECONDARY = 0, 1, 2


@dataclass(frozen=True)
class ChainParams:
    """Chaining's settings, minimap2's map-ont values (the module's docstring says how each is used)."""

    max_gap: int = 5000  # bases between two joined anchors, on either sequence
    bandwidth: int = 500  # how far the two gaps may differ
    max_lookback: int = 5000  # anchors an anchor looks back over
    max_skip: int = 25  # valid predecessors in a row that do not improve it before the search stops
    gap_scale: float = 1.0  # weight of the gap cost
    min_score: int = 40  # a chain's least score to be kept
    min_anchors: int = 2  # and its fewest anchors
    mask_level: float = 0.5
    pri_ratio: float = 0.8
    best_n: int = 5


@dataclass(frozen=True)
class Chains:
    """A batch's chains, by read, each read's primary first, then its supplementary parts, then secondaries.

    Query coordinates are on the read as aligned (its reverse complement where `rc`); reference
    coordinates on the contigs laid end to end. Chain `i` owns `anchors[anchor_off[i]:anchor_off[i+1]]`
    (indices into the seeds, in order along the reference).
    """

    read: np.ndarray  # int32
    rc: np.ndarray  # bool
    score: np.ndarray  # int32
    qstart: np.ndarray  # int64
    qend: np.ndarray
    rstart: np.ndarray
    rend: np.ndarray
    contig: np.ndarray  # int32
    role: np.ndarray  # int8: PRIMARY, SUPPLEMENTARY, SECONDARY
    parent: np.ndarray  # int32: the primary or supplementary chain a secondary is under; itself otherwise
    mapq: np.ndarray  # uint8 (0 for secondaries)
    anchors: np.ndarray  # int64
    anchor_off: np.ndarray  # int64[n + 1]

    def __len__(self) -> int:
        return len(self.read)


@numba.njit(nogil=True, cache=True)
def _gap_cost(g: int, avg_len: float, gap_scale: float) -> int:
    if g == 0:
        return 0
    return int(gap_scale * 0.01 * avg_len * g + 0.5 * np.log2(g))


@numba.njit(nogil=True, cache=True)
def _chain_group(qs, rs, ln, ctg, max_gap, bandwidth, max_lookback, max_skip, gap_scale, min_score, min_anchors,
                 c_score, c_first, c_count, order_out):
    """Chains of one read and strand; anchors given in order of their reference end. Writes each chain's
    score, and its anchors (positions in the group, ascending) into `order_out[c_first:c_first+c_count]`;
    returns the number of chains."""
    n = len(qs)
    f = np.empty(n, dtype=np.int64)
    p = np.full(n, -1, dtype=np.int64)
    avg = ln.mean() if n else 0.0
    for i in range(n):
        qe_i, re_i = qs[i] + ln[i], rs[i] + ln[i]
        best = np.int64(ln[i])
        skipped = 0
        for j in range(i - 1, max(-1, i - 1 - max_lookback), -1):
            dr = re_i - (rs[j] + ln[j])
            if dr > max_gap:
                break
            dq = qe_i - (qs[j] + ln[j])
            if dr <= 0 or dq <= 0 or dq > max_gap or ctg[j] != ctg[i] or qs[j] >= qs[i] or rs[j] >= rs[i]:
                continue
            g = abs(dq - dr)
            if g > bandwidth:
                continue
            sc = f[j] + min(dq, dr, ln[i]) - _gap_cost(g, avg, gap_scale)
            if sc > best:
                best = sc
                p[i] = j
                skipped = 0
            else:
                skipped += 1
                if skipped > max_skip:
                    break
        f[i] = best
    used = np.zeros(n, dtype=np.bool_)
    by_score = np.argsort(-f, kind="mergesort")
    n_chains = 0
    out = 0
    path = np.empty(n, dtype=np.int64)
    for t in range(n):
        end = by_score[t]
        if used[end]:
            continue
        k = 0
        i = end
        while i >= 0 and not used[i]:
            used[i] = True
            path[k] = i
            k += 1
            i = p[i]
        score = f[end] - (f[i] if i >= 0 else 0)
        if score < min_score or k < min_anchors:
            continue
        c_score[n_chains] = score
        c_first[n_chains] = out
        c_count[n_chains] = k
        for m in range(k):
            order_out[out + m] = path[k - 1 - m]
        out += k
        n_chains += 1
    return n_chains


@numba.njit(nogil=True, cache=True)
def _chain_all(qs, rs, ln, ctg, grp_off, max_gap, bandwidth, max_lookback, max_skip, gap_scale, min_score,
               min_anchors, c_score, c_first, c_count, c_n, anchor_out):
    """`_chain_group` over every group (one read and strand; `grp_off` into anchors sorted by group,
    then by reference end); a group's chains are written in its own slots of the outputs."""
    for g in range(len(grp_off) - 1):
        a, b = grp_off[g], grp_off[g + 1]
        c_n[g] = _chain_group(qs[a:b], rs[a:b], ln[a:b], ctg[a:b], max_gap, bandwidth, max_lookback, max_skip,
                              gap_scale, min_score, min_anchors, c_score[a:b], c_first[a:b], c_count[a:b],
                              anchor_out[a:b])


@numba.njit(nogil=True, cache=True)
def _select(read, score, fq0, fq1, count, mask_level, pri_ratio, best_n, min_score,
            role, parent, mapq, keep):
    """Roles, parents and MAPQ of chains sorted by (read, score descending); fq0/fq1 the chain's span on
    the read as basecalled. Secondaries beyond `best_n` or under `pri_ratio` of their parent are dropped."""
    n = len(read)
    sub = np.zeros(n, dtype=np.int64)
    n_sub = np.zeros(n, dtype=np.int64)
    n_kept_sec = np.zeros(n, dtype=np.int64)
    start = 0
    while start < n:
        stop = start
        while stop < n and read[stop] == read[start]:
            stop += 1
        tops = np.empty(stop - start, dtype=np.int64)
        n_tops = 0
        for c in range(start, stop):
            parent[c] = c
            for t in range(n_tops):
                top = tops[t]
                ov = min(fq1[c], fq1[top]) - max(fq0[c], fq0[top])
                if ov > mask_level * min(fq1[c] - fq0[c], fq1[top] - fq0[top]):
                    parent[c] = top
                    break
            if parent[c] == c:
                role[c] = PRIMARY if n_tops == 0 else SUPPLEMENTARY
                tops[n_tops] = c
                n_tops += 1
                keep[c] = True
                continue
            top = parent[c]
            role[c] = SECONDARY
            sub[top] = max(sub[top], score[c])
            if score[c] >= pri_ratio * score[top]:
                n_sub[top] += 1
                keep[c] = n_kept_sec[top] < best_n
                n_kept_sec[top] += keep[c]
        start = stop
    for c in range(n):
        if role[c] == SECONDARY:
            mapq[c] = 0
            continue
        s = score[c]
        pen = min(1.0, count[c] / 5.0, s / 100.0)
        x = max(sub[c], min_score) / s
        q = 40.0 * pen * (1.0 - x) * np.log(s) - 4.343 * np.log(n_sub[c] + 1)
        mapq[c] = int(min(60.0, max(0.0, q)))


def chain(seeds: Seeds, read_lengths: np.ndarray, contig_offsets: np.ndarray,
          params: ChainParams = ChainParams()) -> Chains:
    """Chain a batch's seeds; `read_lengths` per read, `contig_offsets` the contigs' starts laid end to end
    (and the total after the last)."""
    read = seeds.read.astype(np.int64)
    rc = seeds.rc.astype(np.int64)
    ln = seeds.length.astype(np.int64)
    qs, rs = seeds.qpos.astype(np.int64), seeds.rpos.astype(np.int64)
    order = np.lexsort((qs + ln, rs + ln, rc, read))
    read, rc, ln, qs, rs = read[order], rc[order], ln[order], qs[order], rs[order]
    ctg = (np.searchsorted(contig_offsets, rs, side="right") - 1).astype(np.int64)
    n = len(read)
    new = np.ones(n, dtype=bool)
    new[1:] = (read[1:] != read[:-1]) | (rc[1:] != rc[:-1])
    grp_off = np.concatenate([np.flatnonzero(new), [n]]).astype(np.int64)
    c_score, c_first, c_count = (np.zeros(n, dtype=np.int64) for _ in range(3))
    anchor_out = np.zeros(n, dtype=np.int64)
    c_n = np.zeros(len(grp_off) - 1, dtype=np.int64)
    p = params
    _chain_all(qs, rs, ln, ctg, grp_off, p.max_gap, p.bandwidth, p.max_lookback, p.max_skip, p.gap_scale,
               p.min_score, p.min_anchors, c_score, c_first, c_count, c_n, anchor_out)
    # each group's chains sit at the start of its slots: gather them, and their anchors as batch indices
    slot = np.concatenate([np.arange(a, a + k) for a, k in zip(grp_off[:-1], c_n)]) if n else np.zeros(0, np.int64)
    grp_of_slot = np.repeat(grp_off[:-1], c_n)
    first = grp_of_slot + c_first[slot]
    count = c_count[slot]
    idx = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
    members = grp_of_slot.repeat(count) + anchor_out[idx]  # anchor positions in sorted order
    a_first = np.concatenate([[0], np.cumsum(count)])
    score = c_score[slot]
    c_read = read[grp_of_slot]
    qstart, rstart = qs[members[a_first[:-1]]], rs[members[a_first[:-1]]]
    last = members[a_first[1:] - 1] if len(slot) else members[:0]
    qend, rend = qs[last] + ln[last], rs[last] + ln[last]
    c_rc = rc[grp_of_slot].astype(bool)
    lens = read_lengths[c_read]
    fq0 = np.where(c_rc, lens - qend, qstart)
    fq1 = np.where(c_rc, lens - qstart, qend)
    by = np.lexsort((-score, c_read))
    m = len(slot)
    role, parent = np.zeros(m, dtype=np.int8), np.zeros(m, dtype=np.int64)
    mapq, keep = np.zeros(m, dtype=np.uint8), np.zeros(m, dtype=bool)
    _select(c_read[by], score[by], fq0[by], fq1[by], count[by], p.mask_level, p.pri_ratio,
            p.best_n, p.min_score, role, parent, mapq, keep)
    # output order: read, then primary, supplementary, secondary, each by score
    out = np.lexsort((np.arange(m), role, c_read[by]))
    out = out[keep[out]]
    ranks = np.full(m, -1, dtype=np.int64)
    ranks[out] = np.arange(len(out))
    sel = by[out]
    anchors_sorted = order[members]  # indices into the caller's seeds
    a_count = count[sel]
    a_idx = np.repeat(a_first[:-1][sel] - np.cumsum(a_count) + a_count, a_count) + np.arange(a_count.sum())
    return Chains(read=c_read[sel].astype(np.int32), rc=c_rc[sel], score=score[sel].astype(np.int32),
                  qstart=qstart[sel], qend=qend[sel], rstart=rstart[sel], rend=rend[sel],
                  contig=ctg[members[a_first[:-1]]][sel].astype(np.int32), role=role[out],
                  parent=ranks[parent[out]].astype(np.int32), mapq=mapq[out], anchors=anchors_sorted[a_idx],
                  anchor_off=np.concatenate([[0], np.cumsum(a_count)]).astype(np.int64))
