"""call-methylation TSV rows written by a numba kernel, byte for byte what Python's formatting gives.

Python formats a row in a few microseconds; at two million calls a run that is seconds of
one core holding the GIL. Here rows are measured, then written in parallel into one buffer.

`%.2f` is Python's correctly rounded conversion: the exact binary value of |x| times 100,
rounded half to even to an integer number of hundredths. For |x| < 2^50 that value is an
integer m < 2^53 times 100 (below 2^60) over a power of two, so integer shifts give it
exactly. A minus sign is printed for every negative value and for -0.0, even when the
hundredths round to zero ("-0.00"), as Python does; nan and infinities are spelled as
Python spells them. Callers check the 2^50 bound (`fits`) and format otherwise.

The row kernels take one flat array per column, as numba needs; their caller (`calls.format_calls`)
unpacks the calls record once.
"""

from __future__ import annotations

import math

import numba
import numpy as np

LIMIT = 2.0**50

NAN = np.frombuffer(b"nan", np.uint8)
INF = np.frombuffer(b"inf", np.uint8)


def fits(*columns: np.ndarray) -> bool:
    """True when every finite value is below 2^50 in magnitude (the kernel's exact range)."""
    for c in columns:
        finite = c[np.isfinite(c)]
        if finite.size and np.abs(finite).max() >= LIMIT:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def _hundredths(a):
    """round-half-even(a * 100) for finite 0 <= a < 2^50, exactly."""
    if a == 0.0:
        return np.int64(0)
    m, e = math.frexp(a)
    p = np.int64(m * 9007199254740992.0) * 100  # a = (p / 100) * 2^(e - 53), p < 2^60
    s = 53 - e
    if s <= 0:
        return p << -s
    if s >= 62:
        return np.int64(0)
    q = p >> s
    rem = p & ((np.int64(1) << s) - 1)
    half = np.int64(1) << (s - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


@numba.njit(nogil=True, cache=True)
def _put_bytes(buf, pos, src, s0, s1, write):
    if write:
        for i in range(s1 - s0):
            buf[pos + i] = src[s0 + i]
    return pos + s1 - s0


@numba.njit(nogil=True, cache=True)
def _put_byte(buf, pos, c, write):
    if write:
        buf[pos] = c
    return pos + 1


@numba.njit(nogil=True, cache=True)
def _put_uint(buf, pos, v, write):
    n = 1
    t = v
    while t >= 10:
        t //= 10
        n += 1
    if write:
        for i in range(n - 1, -1, -1):
            buf[pos + i] = 48 + v % 10
            v //= 10
    return pos + n


@numba.njit(nogil=True, cache=True)
def _put_int(buf, pos, v, write):
    if v < 0:
        pos = _put_byte(buf, pos, 45, write)
        v = -v
    return _put_uint(buf, pos, v, write)


@numba.njit(nogil=True, cache=True)
def _put_fixed2(buf, pos, x, nan, inf, write):
    """x as Python's f"{x:.2f}"."""
    if x != x:
        return _put_bytes(buf, pos, nan, 0, 3, write)
    if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0):
        pos = _put_byte(buf, pos, 45, write)
        x = -x
    if x == np.inf:
        return _put_bytes(buf, pos, inf, 0, 3, write)
    h = _hundredths(x)
    pos = _put_uint(buf, pos, h // 100, write)
    pos = _put_byte(buf, pos, 46, write)
    pos = _put_byte(buf, pos, 48 + (h % 100) // 10, write)
    return _put_byte(buf, pos, 48 + h % 10, write)


@numba.njit(nogil=True, cache=True)
def _row(buf, pos, j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob, id_off,
         seq_blob, seq_off, nan, inf, write):  # fmt: skip
    r = read[j]
    tab = 9
    pos = _put_bytes(buf, pos, ref_blob, ref_off[r], ref_off[r + 1], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_byte(buf, pos, 45 if strand[j] < 0 else 43, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_int(buf, pos, start[j], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_int(buf, pos, end[j], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_bytes(buf, pos, id_blob, id_off[r], id_off[r + 1], write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed2(buf, pos, llr[j], nan, inf, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed2(buf, pos, ll_m[j], nan, inf, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_fixed2(buf, pos, ll_u[j], nan, inf, write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_byte(buf, pos, 49, write)  # num_calling_strands
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_int(buf, pos, np.int64(num_motifs[j]), write)
    pos = _put_byte(buf, pos, tab, write)
    pos = _put_bytes(buf, pos, seq_blob, seq_off[j], seq_off[j + 1], write)
    return _put_byte(buf, pos, 10, write)


@numba.njit(nogil=True, cache=True, parallel=True)
def format_rows(read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob, id_off, seq_blob,
                seq_off, nan, inf):  # fmt: skip
    """uint8 text of every call row: each row's length first, then all rows written in parallel."""
    n = read.shape[0]
    dummy = np.empty(0, np.uint8)
    row_off = np.zeros(n + 1, np.int64)
    for j in numba.prange(n):
        row_off[j + 1] = _row(dummy, 0, j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off,
                              id_blob, id_off, seq_blob, seq_off, nan, inf, False)  # fmt: skip
    for j in range(n):
        row_off[j + 1] += row_off[j]
    buf = np.empty(row_off[n], np.uint8)
    for j in numba.prange(n):
        _row(buf, row_off[j], j, read, start, end, strand, llr, ll_m, ll_u, num_motifs, ref_blob, ref_off, id_blob,
             id_off, seq_blob, seq_off, nan, inf, True)  # fmt: skip
    return buf


def blob(strings) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of the strings back to back, and int64 offsets of each."""
    encoded = [s.encode() for s in strings]
    off = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)), out=off[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), off


def ascii_blob(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`blob` for many ASCII strings (reference k-mers): one join, one encode."""
    off = np.zeros(len(strings) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, strings), np.int64, count=len(strings)), out=off[1:])
    return np.frombuffer("".join(strings).encode("ascii"), np.uint8), off
