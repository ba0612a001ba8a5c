"""numba parsing of the usual MM/ML tags of a whole batch: the fast path of PileupCounts.add.

Dorado writes per base one or two entries (`C+h?,d...;C+m?,d...;`) with the same positions
and mode. `parse` reads such tags for every read of a batch at once: per (base, strand)
group its forward read positions and its probabilities (one column per code, zeros on the
bases a `.` entry leaves implicit). A read whose tags are anything else (N, ChEBI codes,
entries of one base with different positions or modes, more than MAX_CODES codes, errors) gets
status SLOW and goes through tags.py, which reads every form and names every error.
`calls` then turns the groups into per-read call columns sorted along SEQ, like pileup.py does
for the slow path.
Both kernels take a batch's flat arrays, twenty or so, as numba needs; `parsed.parse_records` and
`PileupCounts` (`pileup.py`) hold them as records and unpack them once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_CODES = 4
MAX_GROUPS = 8
OK, SLOW = 0, 1


@njit(nogil=True, cache=True)
def _base_code(c):
    if c == 65:
        return 0
    if c == 67:
        return 1
    if c == 71:
        return 2
    if c == 84 or c == 85:
        return 3
    return -1


@njit(nogil=True, cache=True)
def _fbase(seq, s0, length, rev, i):
    """Base code of forward (as sequenced) position i."""
    if not rev:
        return seq[s0 + i]
    b = seq[s0 + length - 1 - i]
    return b if b > 3 else 3 - b


@njit(nogil=True, cache=True)
def _listed(seq, s0, length, rev, base, deltas, nd, listed):
    """Forward positions of the MM-listed bases; False when one is past the end of the read."""
    target = -1
    occ = -1
    k = 0
    for d in range(nd):
        target += deltas[d] + 1
        while k < length:
            if _fbase(seq, s0, length, rev, k) == base:
                occ += 1
                if occ == target:
                    break
            k += 1
        if k >= length:
            return False
        listed[d] = k
        k += 1
    return True


@njit(nogil=True, cache=True)
def _header(mm, i, end, codes):
    """(base, minus, mode, number of codes, index after the header); base -1 when not the usual form."""
    if end - i < 3:
        return -1, False, 0, 0, i
    base = _base_code(mm[i])
    minus = mm[i + 1] == 45
    if base < 0 or not (minus or mm[i + 1] == 43):
        return -1, False, 0, 0, i
    i += 2
    nc = 0
    mode = 2
    while i < end and mm[i] != 44 and mm[i] != 59:
        c = mm[i]
        if c == 63:
            mode = 0
        elif c == 46:
            mode = 1
        elif (65 <= c <= 90 or 97 <= c <= 122) and nc < MAX_CODES:
            codes[nc] = c
            nc += 1
        else:
            return -1, False, 0, 0, i
        i += 1
    return base, minus, mode, nc, i


@njit(nogil=True, cache=True)
def _deltas(mm, i, end, deltas):
    """Parse ',d,d,...' up to ';' or the end; (count, index after), count -1 when malformed."""
    nd = 0
    if i >= end or mm[i] != 44:
        return 0, i
    i += 1
    value = -1
    while True:
        c = mm[i] if i < end else 59
        if 48 <= c <= 57:
            value = (0 if value < 0 else value * 10) + (c - 48)
        elif c == 44 or c == 59:
            if value < 0:
                return -1, i
            deltas[nd] = value
            nd += 1
            value = -1
            if c == 59:
                return nd, i
        elif c != 32:
            return -1, i
        i += 1


@njit(nogil=True, cache=True)
def parse(mm, mm_off, ml, ml_off, seq, seq_off, rev, status, g_read, g_base, g_minus, g_mode, g_codes, g_ncodes,
          g_pos_off, g_pos_end, positions, explicit, probs):
    """Parse every read's MM/ML; fills the group arrays and returns (groups, positions) used.

    Group arrays need room for MAX_GROUPS per read; `positions`, `explicit` and `probs` for
    every base of every read. A group's codes are ASCII values in g_codes[g, :g_ncodes[g]].
    """
    n_groups = 0
    n_pos = 0
    deltas = np.empty(len(mm) + 1, np.int64)
    listed = np.empty(len(mm) + 1, np.int64)
    codes = np.zeros(MAX_CODES, np.int32)
    for r in range(len(mm_off) - 1):
        status[r] = OK
        first_group, first_pos = n_groups, n_pos
        s0 = seq_off[r]
        length = seq_off[r + 1] - s0
        ptr, ml_end = ml_off[r], ml_off[r + 1]
        i, end = mm_off[r], mm_off[r + 1]
        ok = True
        while i < end:
            if mm[i] == 59:
                i += 1
                continue
            base, minus, mode, nc, i = _header(mm, i, end, codes)
            if base < 0 or nc == 0:
                ok = False
                break
            nd, i = _deltas(mm, i, end, deltas)
            if nd < 0 or ptr + nd * nc > ml_end or not _listed(seq, s0, length, rev[r], base, deltas, nd, listed):
                ok = False
                break
            g = first_group
            while g < n_groups and not (g_base[g] == base and g_minus[g] == minus):
                g += 1
            if g < n_groups:
                # another entry of a (base, strand) already read: same mode and positions, new codes
                if g_mode[g] != mode or g_ncodes[g] + nc > MAX_CODES:
                    ok = False
                    break
                e = 0
                for p in range(g_pos_off[g], g_pos_end[g]):
                    if explicit[p]:
                        if e >= nd or positions[p] != listed[e]:
                            ok = False
                            break
                        for j in range(nc):
                            probs[p, g_ncodes[g] + j] = (ml[ptr + e * nc + j] + np.float32(0.5)) / np.float32(256)
                        e += 1
                if not ok or e != nd:
                    ok = False
                    break
                for j in range(nc):
                    for j2 in range(g_ncodes[g]):
                        if g_codes[g, j2] == codes[j]:
                            ok = False
                    g_codes[g, g_ncodes[g] + j] = codes[j]
                g_ncodes[g] += nc
                for p in range(g_pos_off[g], g_pos_end[g]):
                    total = np.float32(0)
                    for j in range(g_ncodes[g]):
                        total += probs[p, j]
                    if total > np.float32(1.01):  # modkit refuses merged probabilities above 1.01
                        ok = False
                if not ok:
                    break
            else:
                if n_groups - first_group >= MAX_GROUPS:
                    ok = False
                    break
                g_read[g], g_base[g], g_minus[g], g_mode[g], g_ncodes[g] = r, base, minus, mode, nc
                for j in range(nc):
                    g_codes[g, j] = codes[j]
                g_pos_off[g] = n_pos
                e = 0
                for q in range(length):
                    is_listed = e < nd and listed[e] == q
                    if not is_listed and (mode == 0 or _fbase(seq, s0, length, rev[r], q) != base):
                        continue
                    positions[n_pos] = q
                    explicit[n_pos] = is_listed
                    for j in range(MAX_CODES):
                        probs[n_pos, j] = 0
                    if is_listed:
                        for j in range(nc):
                            probs[n_pos, j] = (ml[ptr + e * nc + j] + np.float32(0.5)) / np.float32(256)
                        e += 1
                    n_pos += 1
                g_pos_end[g] = n_pos
                n_groups += 1
            ptr += nd * nc
        if not ok or ptr != ml_end:  # extra ML values: tags.py names them
            status[r] = SLOW
            n_groups, n_pos = first_group, first_pos
    return n_groups, n_pos


@njit(nogil=True, cache=True)
def calls(n_reads, seq_off, rev, g_read, g_minus, g_ncodes, g_pos_off, g_pos_end, g_table, positions, probs,
          cols, limits, order, pc_off, pc_q, pc_col, nc_off, nc_q, nc_col):
    """Call columns of the active groups (g_table >= 0), per read sorted by SEQ index.

    Per group, from offset g_table[g] into the tables: `cols` (column of each code, then
    canonical, then FAIL), `limits` (threshold of each code, then canonical), `order` (code
    indices, the last maximum of which wins a tie). `pc_off`/`nc_off` get per-read offsets.
    """
    n_p = 0
    n_n = 0
    g = 0
    n_groups = len(g_read)
    for r in range(n_reads):
        pc_off[r] = n_p
        nc_off[r] = n_n
        length = seq_off[r + 1] - seq_off[r]
        while g < n_groups and g_read[g] == r:
            t = g_table[g]
            if t >= 0:
                k = g_ncodes[g]
                for p in range(g_pos_off[g], g_pos_end[g]):
                    total = np.float32(0)
                    for j in range(k):
                        total += probs[p, j]
                    canonical = np.float32(1) - total
                    best = -1
                    best_p = np.float32(-1)
                    for jj in range(k):
                        j = order[t + jj]
                        if probs[p, j] >= limits[t + j] and (best < 0 or probs[p, j] >= best_p):
                            best = j
                            best_p = probs[p, j]
                    if canonical >= limits[t + k] and (best < 0 or canonical >= best_p):
                        col = cols[t + k]
                    elif best >= 0:
                        col = cols[t + best]
                    else:
                        col = cols[t + k + 1]
                    q = positions[p] if not rev[r] else length - 1 - positions[p]
                    if g_minus[g]:
                        nc_q[n_n] = q
                        nc_col[n_n] = col
                        n_n += 1
                    else:
                        pc_q[n_p] = q
                        pc_col[n_p] = col
                        n_p += 1
            g += 1
        _sort_pairs(pc_q, pc_col, pc_off[r], n_p)
        _sort_pairs(nc_q, nc_col, nc_off[r], n_n)
    pc_off[n_reads] = n_p
    nc_off[n_reads] = n_n


@njit(nogil=True, cache=True)
def _sort_pairs(q, col, a, b):
    if b - a < 2:
        return
    idx = np.argsort(q[a:b], kind="mergesort")
    q[a:b] = q[a:b][idx]
    col[a:b] = col[a:b][idx]


@njit(nogil=True, cache=True)
def aligned_forward(cig_off, cig, seq_off, rev, out):
    """Mark the forward (as sequenced) read positions that an M/=/X operation aligns."""
    for r in range(len(cig_off) - 1):
        length = seq_off[r + 1] - seq_off[r]
        q = 0
        for k in range(cig_off[r], cig_off[r + 1]):
            op, ln = cig[k, 0], cig[k, 1]
            if op == 0 or op == 7 or op == 8:
                for j in range(ln):
                    f = q + j if not rev[r] else length - 1 - q - j
                    out[seq_off[r] + f] = True
            if op == 0 or op == 1 or op == 4 or op == 7 or op == 8:
                q += ln
