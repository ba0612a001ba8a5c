"""numba kernels: per-site tallies from a batch of reads, and bedMethyl counts from the tallies.

Sites live in blocks of BLOCK reference positions; a block holds, per position and strand
(0 '+', 1 '-'), uint32 counts in columns DELETE, FAIL, NOCALL+base (A C G T) and one column
per (primary base, class) of the registry, and a uint64 mask of the mod codes the covering
reads declare (bit = registry entry). Every aligned or deleted reference position of a read
adds exactly what modkit's pileup adds there, so tallies of read batches simply add up.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SHIFT = 12
BLOCK = 1 << SHIFT
DELETE, FAIL, NOCALL = 0, 1, 2
FIRST_ENTRY = 6  # column of registry entry 0


@njit(nogil=True, cache=True)
def accumulate(counts, masks, focus, block_slot, lo, hi, gstart, rev, mask_plus, mask_minus,
               cig_off, cig, seq_off, seq, pc_off, pc_q, pc_col, nc_off, nc_q, nc_col):
    """Add a batch of reads to the tallies; returns the number of calls counted.

    Per read: global reference start, reverse flag, the mod-code masks its covered sites get
    on the + and - strand, CIGAR (op, length) rows, SEQ as codes 0..3 (4 other) in SEQ order,
    and its calls sorted by SEQ index: `pc_*` from MM '+' entries (counted on the alignment
    strand), `nc_*` from MM '-' entries (the opposite strand), as column numbers.
    """
    n_calls = 0
    bmask = BLOCK - 1
    for r in range(len(gstart)):
        g = gstart[r]
        q = 0
        astrand = 1 if rev[r] else 0
        other = 1 - astrand
        pi, pe = pc_off[r], pc_off[r + 1]
        ni, ne = nc_off[r], nc_off[r + 1]
        s0 = seq_off[r]
        for k in range(cig_off[r], cig_off[r + 1]):
            op, ln = cig[k, 0], cig[k, 1]
            if op == 0 or op == 7 or op == 8:
                for j in range(ln):
                    gp = g + j
                    qq = q + j
                    while pi < pe and pc_q[pi] < qq:
                        pi += 1
                    while ni < ne and nc_q[ni] < qq:
                        ni += 1
                    if gp < lo or gp >= hi:
                        continue
                    slot = block_slot[gp >> SHIFT]
                    off = gp & bmask
                    f = focus[slot, off]
                    if f == 0:
                        continue
                    masks[slot, 2 * off] |= mask_plus[r]
                    masks[slot, 2 * off + 1] |= mask_minus[r]
                    b = seq[s0 + qq]
                    if b > 3:
                        continue
                    has_p = pi < pe and pc_q[pi] == qq
                    has_n = ni < ne and nc_q[ni] == qq
                    if not has_p and not has_n:
                        if f & (1 << astrand):
                            rb = b if astrand == 0 else 3 - b
                            counts[slot, 2 * off + astrand, NOCALL + rb] += 1
                        continue
                    if has_p and f & (1 << astrand):
                        counts[slot, 2 * off + astrand, pc_col[pi]] += 1
                        n_calls += 1
                    if has_n and f & (1 << other):
                        counts[slot, 2 * off + other, nc_col[ni]] += 1
                        n_calls += 1
                g += ln
                q += ln
            elif op == 2:
                for j in range(ln):
                    gp = g + j
                    if gp < lo or gp >= hi:
                        continue
                    slot = block_slot[gp >> SHIFT]
                    off = gp & bmask
                    f = focus[slot, off]
                    if f == 0:
                        continue
                    masks[slot, 2 * off] |= mask_plus[r]
                    masks[slot, 2 * off + 1] |= mask_minus[r]
                    if f & (1 << astrand):
                        counts[slot, 2 * off + astrand, DELETE] += 1
                g += ln
            elif op == 3:
                g += ln
            elif op == 1 or op == 4:
                q += ln
    return n_calls


@njit(nogil=True, cache=True)
def _site_rows(c, mask, reg_base, reg_canon, combine, out, row, gpos, strand):
    """Rows of one site and strand; writes them at `row` when `out` has room, returns the new row."""
    nreg = len(reg_base)
    tot = np.zeros(4, np.int64)
    mods = np.zeros(4, np.int64)
    for e in range(nreg):
        v = c[FIRST_ENTRY + e]
        tot[reg_base[e]] += v
        if not reg_canon[e]:
            mods[reg_base[e]] += v
    for p in range(4):
        if tot[p] == 0:
            continue
        diff = 0
        for b in range(4):
            if b != p:
                diff += c[NOCALL + b] + tot[b]
        for e in range(-1, nreg):
            if combine:
                if e >= 0:
                    break
                nmod = mods[p]
                entry = p
            else:
                if e < 0 or reg_base[e] != p or reg_canon[e] or not (mask >> np.uint64(e)) & np.uint64(1):
                    continue
                nmod = c[FIRST_ENTRY + e]
                entry = e
            if row < out.shape[0]:
                out[row, 0] = gpos
                out[row, 1] = strand
                out[row, 2] = entry
                out[row, 3] = tot[p]
                out[row, 4] = nmod
                out[row, 5] = tot[p] - mods[p]
                out[row, 6] = mods[p] - nmod
                out[row, 7] = c[DELETE]
                out[row, 8] = c[FAIL]
                out[row, 9] = diff
                out[row, 10] = c[NOCALL + p]
            row += 1
    return row


@njit(nogil=True, cache=True)
def decode(counts, masks, slots, block_ids, reg_base, reg_canon, combine, out):
    """bedMethyl counts of the given blocks, in position then strand order.

    Columns of `out`: global position, strand, entry (registry entry, or the primary base
    with `combine`), Nvalid_cov, Nmod, Ncanonical, Nother_mod, Ndelete, Nfail, Ndiff,
    Nnocall. Returns the number of rows; when `out` is too small, only that number is right.
    """
    row = 0
    for i in range(len(slots)):
        slot = slots[i]
        base = block_ids[i] * BLOCK
        for off in range(BLOCK):
            for s in range(2):
                c = counts[slot, 2 * off + s]
                called = False
                for e in range(len(reg_base)):
                    if c[FIRST_ENTRY + e] > 0:
                        called = True
                        break
                if not called:
                    continue
                row = _site_rows(c, masks[slot, 2 * off + s], reg_base, reg_canon,
                                 combine, out, row, base + off, s)
    return row
