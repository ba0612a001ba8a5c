"""The suffix array in pieces, on the CPU: suffixes bucketed by their first 7 symbols, a piece of whole
buckets sorted at a time by 63-bit keys of 21 symbols, then its ties refined 21 symbols deeper each
round (`fm_cells.refine_run`).

A piece is a run of consecutive buckets, so its sorted suffixes are a run of consecutive rows of the
whole suffix array: each piece's rows go straight into the BWT's codes and the sampled entries
(`fm_cells.emit_row`), and the whole suffix array is never held. A piece needs PIECE_BYTES a suffix;
one piece holds the whole text when the memory budget allows. Sorting by keys of the text itself,
rather than by the ranks of prefix doubling, is what lets a piece sort alone: doubling needs the rank
of every suffix of the text at each round. The keys deepen linearly, so an exact repeat of length R
costs about R^2/42 key reads per pair of copies: nothing for a bacterial genome, seconds for the
longest exact repeats of a mammalian one. `streamer_gpu.fmindex` runs the same steps on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numba
import numpy as np

from streamer.align.fm_cells import KEY_SYM, KEY_SYMBOLS, fm_cells
from streamer.pipeline.targets import CPU

BUCKET_SYMBOLS = 7  # a bucket is the first 7 symbols: the top 21 bits of a key
BUCKET_SHIFT = np.uint64(3 * (KEY_SYMBOLS - BUCKET_SYMBOLS))
N_BUCKETS = 1 << (3 * BUCKET_SYMBOLS)
PIECE_BYTES = 33  # a suffix in a piece: its position and key, both twice for the radix sort, and a tie flag

_cells = fm_cells(CPU)
_suffix_key, _refine_run, _emit_row = _cells.suffix_key, _cells.refine_run, _cells.emit_row
_KEY_MASK = np.uint64((1 << (3 * KEY_SYMBOLS)) - 1)


class Piece(NamedTuple):
    """Buckets [first, last) whose suffixes are rows [row, row + size) of the suffix array."""

    first: int
    last: int
    row: int
    size: int


@numba.njit(nogil=True, cache=True)
def next_key(text, n, key, i):
    """The key of suffix i + 1 from that of suffix i."""
    q = i + KEY_SYMBOLS
    return ((key << np.uint64(3)) & _KEY_MASK) | (KEY_SYM[text[q]] if q < n else np.uint64(0))


@numba.njit(nogil=True, cache=True)
def bucket_counts(text, n):
    """How many suffixes start with each 7-symbol bucket."""
    counts = np.zeros(N_BUCKETS, np.int64)
    key = _suffix_key(text, n, 0)
    for i in range(n):
        counts[np.int64(key >> BUCKET_SHIFT)] += 1
        key = next_key(text, n, key, i)
    return counts


def plan_pieces(counts: np.ndarray, max_piece: int) -> Iterator[Piece]:
    """Runs of consecutive buckets of at most max_piece suffixes (a larger bucket alone), in row order."""
    row, first, size = 0, 0, 0
    for b in np.flatnonzero(counts):
        c = int(counts[b])
        if size and size + c > max_piece:
            yield Piece(first, int(b), row, size)
            row, first, size = row + size, int(b), 0
        size += c
    if size:
        yield Piece(first, N_BUCKETS, row, size)


@numba.njit(nogil=True, cache=True)
def gather(text, n, first, last, pos, keys):
    """The suffixes of buckets [first, last), in text order, with their keys; returns how many."""
    key = _suffix_key(text, n, 0)
    m = 0
    for i in range(n):
        b = np.int64(key >> BUCKET_SHIFT)
        if first <= b < last:
            pos[m] = i
            keys[m] = key
            m += 1
        key = next_key(text, n, key, i)
    return m


@numba.njit(nogil=True, cache=True)
def radix_sort(keys, vals, tmp_keys, tmp_vals):
    """Sort keys ascending, vals along, 8 bits a pass from the lowest (stable), passing over digits
    that every key shares."""
    n = len(keys)
    hist = np.zeros((8, 256), np.int64)
    for i in range(n):
        k = keys[i]
        for d in range(8):
            hist[d, np.int64((k >> np.uint64(8 * d)) & np.uint64(255))] += 1
    src_k, src_v, dst_k, dst_v = keys, vals, tmp_keys, tmp_vals
    swapped = False
    for d in range(8):
        if hist[d].max() == n:
            continue
        at = np.zeros(256, np.int64)
        for j in range(1, 256):
            at[j] = at[j - 1] + hist[d, j - 1]
        shift = np.uint64(8 * d)
        for i in range(n):
            digit = np.int64((src_k[i] >> shift) & np.uint64(255))
            dst_k[at[digit]] = src_k[i]
            dst_v[at[digit]] = src_v[i]
            at[digit] += 1
        src_k, src_v, dst_k, dst_v = dst_k, dst_v, src_k, src_v
        swapped = not swapped
    if swapped:
        keys[:] = src_k
        vals[:] = src_v


@numba.njit(nogil=True, cache=True)
def tied_runs(keys, brk):
    """brk[i] = 1 where keys[i] starts a run of equal keys; returns the runs of more than one as
    (starts, ends)."""
    m = len(keys)
    n_runs = 0
    for i in range(m):
        brk[i] = 1 if i == 0 or keys[i] != keys[i - 1] else 0
        if brk[i] == 0 and brk[i - 1] == 1:
            n_runs += 1
    starts = np.empty(n_runs, np.int64)
    ends = np.empty(n_runs, np.int64)
    r = -1
    for i in range(1, m):
        if brk[i] == 0:
            if brk[i - 1] == 1:
                r += 1
                starts[r] = i - 1
            ends[r] = i + 1
    return starts, ends


@numba.njit(nogil=True, cache=True, parallel=True)
def refine_runs(text, n, pos, keys, brk, starts, ends):
    """Order every run of tied suffixes (they share their first KEY_SYMBOLS symbols), runs in parallel."""
    for r in numba.prange(len(starts)):
        _refine_run(text, n, pos, keys, brk, starts[r], ends[r], KEY_SYMBOLS)


@numba.njit(nogil=True, cache=True)
def emit_rows(text, n, seg_text, pos, row0, codes, ssa, seg_row):
    for r in range(len(pos)):
        _emit_row(text, n, seg_text, pos[r], row0 + r, codes, ssa, seg_row)


def sort_suffixes(text: np.ndarray, seg_text: np.ndarray, max_piece: int, codes: np.ndarray, ssa: np.ndarray,
                  seg_row: np.ndarray) -> int:
    """Sort the text's suffixes piece by piece into the BWT codes, sampled entries and segments' rows;
    returns the number of pieces."""  # fmt: skip
    n = len(text)
    pieces = list(plan_pieces(bucket_counts(text, n), max_piece))
    largest = max(p.size for p in pieces)
    pos, tmp_pos = np.empty(largest, np.int64), np.empty(largest, np.int64)
    keys, tmp_keys = np.empty(largest, np.uint64), np.empty(largest, np.uint64)
    brk = np.empty(largest, np.uint8)
    for piece in pieces:
        m = piece.size
        got = gather(text, n, piece.first, piece.last, pos, keys)
        assert got == m, (got, m)
        radix_sort(keys[:m], pos[:m], tmp_keys[:m], tmp_pos[:m])
        starts, ends = tied_runs(keys[:m], brk[:m])
        refine_runs(text, n, pos[:m], keys[:m], brk[:m], starts, ends)
        emit_rows(text, n, seg_text, pos[:m], piece.row, codes, ssa, seg_row)
    return len(pieces)
