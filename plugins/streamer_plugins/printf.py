"""Numbers and strings written into a byte buffer by numba kernels, byte for byte as printf writes them.

Formatting a row in Python costs microseconds; at millions of rows a run that is seconds of one
core holding the GIL. The row writers of the calls TSV and of eventalign measure their rows
(`write=False`), then write them in parallel into one buffer (`write=True`), with these pieces.

`%.Nf` is a correctly rounded conversion: the exact binary value of |x| times 10^N, rounded half
to even to an integer. A value with a `bits`-bit mantissa is an integer m < 2^bits over a power
of two, so integer shifts give that exactly while m * 10^N stays below 2^63: doubles (53 bits)
with 2 decimals below 2^50 (`LIMIT`), float32 values (24 bits) with up to 5 decimals below 2^20
(`FLOAT32_LIMIT`). A minus sign is written for every negative value and for -0.0, even when the
digits round to zero ("-0.00"), as Python and glibc do; nan and infinities are spelled as they do.
Callers check the bounds (`fits`) and format otherwise.
"""

from __future__ import annotations

import math

import numba
import numpy as np

LIMIT = 2.0**50
FLOAT32_LIMIT = 2.0**20
DOUBLE_BITS = 53
FLOAT32_BITS = 24


def fits(*columns: np.ndarray, limit: float = LIMIT) -> bool:
    """True when every finite value is below `limit` in magnitude (the writer's exact range)."""
    for c in columns:
        finite = c[np.isfinite(c)]
        if finite.size and np.abs(finite).max() >= limit:
            return False
    return True


@numba.njit(nogil=True, cache=True)
def scaled_round(a, decimals, bits):
    """round-half-even(a * 10^decimals) for finite 0 <= a, exactly (see the module's bounds)."""
    if a == 0.0:
        return np.int64(0)
    m, e = math.frexp(a)
    p = np.int64(math.ldexp(m, bits)) * np.int64(10) ** decimals
    sh = bits - e
    if sh <= 0:
        return p << -sh
    if sh >= 62:
        return np.int64(0)
    q = p >> sh
    rem = p & ((np.int64(1) << sh) - 1)
    half = np.int64(1) << (sh - 1)
    if rem > half or (rem == half and q & 1):
        q += 1
    return q


@numba.njit(nogil=True, cache=True)
def put_bytes(buf, pos, src, s0, s1, write):
    if write:
        for i in range(s1 - s0):
            buf[pos + i] = src[s0 + i]
    return pos + s1 - s0


@numba.njit(nogil=True, cache=True)
def put_byte(buf, pos, c, write):
    if write:
        buf[pos] = c
    return pos + 1


@numba.njit(nogil=True, cache=True)
def put_uint(buf, pos, v, write):
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
def put_int(buf, pos, v, write):
    if v < 0:
        pos = put_byte(buf, pos, 45, write)
        v = -v
    return put_uint(buf, pos, v, write)


@numba.njit(nogil=True, cache=True)
def put_fixed(buf, pos, x, decimals, bits, write):
    """x as printf("%.<decimals>f") writes it, for a value with a `bits`-bit mantissa."""
    if x != x:
        for c in (110, 97, 110):
            pos = put_byte(buf, pos, c, write)
        return pos
    if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0):
        pos = put_byte(buf, pos, 45, write)
        x = -x
    if x == np.inf:
        for c in (105, 110, 102):
            pos = put_byte(buf, pos, c, write)
        return pos
    v = scaled_round(x, decimals, bits)
    unit = np.int64(10) ** decimals
    pos = put_uint(buf, pos, v // unit, write)
    pos = put_byte(buf, pos, 46, write)
    frac = v % unit
    for d in range(decimals - 1, -1, -1):
        pos = put_byte(buf, pos, 48 + (frac // np.int64(10) ** d) % 10, write)
    return pos


def blob(strings) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of the strings back to back, and int64 offsets of each."""
    encoded = [s.encode() for s in strings]
    off = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)), out=off[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), off


def text(buf: np.ndarray) -> str:
    """The `str` of a kernel's UTF-8 output (a contiguous uint8 array), decoded from the array itself.

    `buf.tobytes().decode()` held the GIL about 10 ms for a batch's 7 MB of calls (two fresh buffers of that
    size, each touched page by page), against 0.5 ms decoding the array in place (2 cores); while one thread
    holds the GIL, every thread returning from a compiled function or a CUDA call waits for it.
    """
    return str(buf.data, "utf-8")
