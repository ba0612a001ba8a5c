"""The frequency tables' sites as text: meth-freq.tsv's rows and bedMethyl's, written by compiled kernels a block of
sites at a time, without the GIL and byte for byte what Python's formatting gives (`streamer_plugins.printf`).

The daemon rewrites both tables every `refresh_interval`: a genome's tens of millions of sites, formatted by
Python, held the GIL for minutes and their whole text in memory. Each block's rows are measured, then written in
parallel. One kernel serves both tables (`kind`), since numba caches no kernel that takes another as an argument.

A meth-freq site is a row (contig, start, end, group size, called, methylated, sequence offset, sequence length:
-1 for "split-group") over a byte arena of sequences; a bedMethyl site (contig, position, strand: 0 +, 1 -,
modified, canonical, failed).
"""

from __future__ import annotations

from collections.abc import Iterator

import numba
import numpy as np

from streamer_plugins.outputs.site_rows import Contigs
from streamer_plugins.printf import (
    DOUBLE_BITS,
    blob,
    put_byte,
    put_bytes,
    put_fixed,
    put_int,
)

CONTIG, START, END, GROUP, CALLED, METH, SEQ, LEN = range(8)  # a meth-freq site's columns
FREQ, BED = 0, 1  # the table a kernel writes
CHUNK_ROWS = 1 << 18  # sites written at a time: some 15 MB of text, whatever the genome


def site_chunks(kind: int, rows: np.ndarray, kept: np.ndarray, contigs: Contigs, a: np.ndarray, b: np.ndarray,
                rows_per_chunk: int = CHUNK_ROWS) -> Iterator[np.ndarray]:
    """The `kept` sites as uint8 text, sorted by contig (byte order) and columns 1 and 2, a block at a time.
    `a`, `b`: meth-freq's sequence arena and its split-group text; bedMethyl's mod code and colour."""
    order = kept[contigs.order(rows[kept, 0], rows[kept, 1], rows[kept, 2])]
    names, name_off = blob(contigs.names.tolist())
    for i in range(0, len(order), rows_per_chunk):
        yield _text(kind, rows, order[i : i + rows_per_chunk], names, name_off, a, b)


@numba.njit(nogil=True, cache=True, parallel=True)
def _text(kind, rows, order, names, name_off, a, b):
    n = order.shape[0]
    dummy = np.empty(0, np.uint8)
    row_off = np.zeros(n + 1, np.int64)
    for j in numba.prange(n):
        row_off[j + 1] = _row(kind, dummy, 0, order[j], rows, names, name_off, a, b, False)
    for j in range(n):
        row_off[j + 1] += row_off[j]
    buf = np.empty(row_off[n], np.uint8)
    for j in numba.prange(n):
        _row(kind, buf, row_off[j], order[j], rows, names, name_off, a, b, True)
    return buf


@numba.njit(nogil=True, cache=True)
def _row(kind, buf, pos, r, rows, names, name_off, a, b, write):
    c = rows[r, CONTIG]
    pos = put_bytes(buf, pos, names, name_off[c], name_off[c + 1], write)
    if kind == FREQ:
        return _freq_row(buf, pos, r, rows, a, b, write)
    return _bed_row(buf, pos, r, rows, a, b, write)


@numba.njit(nogil=True, cache=True)
def _freq_row(buf, pos, r, rows, arena, split, write):
    """After the contig: its frequency as Python's `f"{methylated / called:.3f}"` gives it, then its sequence."""
    tab = 9
    for v in (rows[r, START], rows[r, END], rows[r, GROUP], rows[r, CALLED], rows[r, METH]):
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, v, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, rows[r, METH] / rows[r, CALLED], 3, DOUBLE_BITS, write)
    pos = put_byte(buf, pos, tab, write)
    if rows[r, LEN] >= 0:
        pos = put_bytes(buf, pos, arena, rows[r, SEQ], rows[r, SEQ] + rows[r, LEN], write)
    else:
        pos = put_bytes(buf, pos, split, 0, split.shape[0], write)
    return put_byte(buf, pos, 10, write)


@numba.njit(nogil=True, cache=True)
def _bed_row(buf, pos, r, rows, code, colour, write):
    """After the contig, modkit's 17 other columns: the percentage as Python's `f"{100 * n_mod / n_valid:.2f}"`."""
    tab = 9
    p, n = rows[r, 1], rows[r, 3] + rows[r, 4]
    for half in range(2):  # start end code score strand | start end colour n
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, p, write)
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, p + 1, write)
        pos = put_byte(buf, pos, tab, write)
        if half == 0:
            pos = put_bytes(buf, pos, code, 0, code.shape[0], write)
            pos = put_byte(buf, pos, tab, write)
            pos = put_int(buf, pos, n, write)
            pos = put_byte(buf, pos, tab, write)
            pos = put_byte(buf, pos, 45 if rows[r, 2] else 43, write)
        else:
            pos = put_bytes(buf, pos, colour, 0, colour.shape[0], write)
            pos = put_byte(buf, pos, tab, write)
            pos = put_int(buf, pos, n, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, 100 * rows[r, 3] / n, 2, DOUBLE_BITS, write)
    for v in (rows[r, 3], rows[r, 4], 0, 0, rows[r, 5], 0, 0):
        pos = put_byte(buf, pos, tab, write)
        pos = put_int(buf, pos, v, write)
    return put_byte(buf, pos, 10, write)
