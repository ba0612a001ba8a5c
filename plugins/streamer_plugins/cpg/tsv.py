"""call-methylation TSV rows written by a numba kernel, byte for byte what Python's formatting gives
(`streamer_plugins.printf`: Python's `%.2f` of a double is printf's).

The row kernels take one flat array per column, as numba needs; their caller (`calls.format_calls`)
unpacks the calls record once.
"""

from __future__ import annotations

import numba
import numpy as np

from streamer_plugins.printf import DOUBLE_BITS, put_byte, put_bytes, put_fixed, put_int


@numba.njit(nogil=True, cache=True)
def _row(buf, pos, j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob, id_off,
         seq_blob, seq_off, write):  # fmt: skip
    r = read[j]
    tab = 9
    pos = put_bytes(buf, pos, ref_blob, ref_off[r], ref_off[r + 1], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_byte(buf, pos, 45 if strand[j] < 0 else 43, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_int(buf, pos, start[j], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_int(buf, pos, end[j], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_bytes(buf, pos, id_blob, id_off[r], id_off[r + 1], write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, llr[j], 2, DOUBLE_BITS, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, ll_m[j], 2, DOUBLE_BITS, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_fixed(buf, pos, ll_u[j], 2, DOUBLE_BITS, write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_byte(buf, pos, 49, write)  # num_calling_strands
    pos = put_byte(buf, pos, tab, write)
    pos = put_int(buf, pos, np.int64(num_motifs[j]), write)
    pos = put_byte(buf, pos, tab, write)
    pos = put_bytes(buf, pos, seq_blob, seq_off[j], seq_off[j + 1], write)
    return put_byte(buf, pos, 10, write)


@numba.njit(nogil=True, cache=True, parallel=True)
def format_rows(read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob, id_off, seq_blob,
                seq_off):  # fmt: skip
    """uint8 text of every call row: each row's length first, then all rows written in parallel."""
    n = read.shape[0]
    dummy = np.empty(0, np.uint8)
    row_off = np.zeros(n + 1, np.int64)
    for j in numba.prange(n):
        row_off[j + 1] = _row(dummy, 0, j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off,
                              id_blob, id_off, seq_blob, seq_off, False)  # fmt: skip
    for j in range(n):
        row_off[j + 1] += row_off[j]
    buf = np.empty(row_off[n], np.uint8)
    for j in numba.prange(n):
        _row(buf, row_off[j], j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob,
             id_off, seq_blob, seq_off, True)  # fmt: skip
    return buf
