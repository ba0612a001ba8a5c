"""bedMethyl lines written by numba into one byte buffer (a human pileup has ~10^8 rows).

The percentage is printed from its exact float32 value rounded half to even at two decimals,
which is what modkit's `format!("{:.2}", f32)` prints.
`render_rows` takes one flat array per column, as numba needs, and `render_text` the same columns
(`bedmethyl.py` holds the table as columns, never as records).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streamer_plugins import printf


@njit(nogil=True, cache=True)
def _put_int(buf, at, v):
    if v == 0:
        buf[at] = 48
        return at + 1
    n = 0
    x = v
    while x > 0:
        n += 1
        x //= 10
    for i in range(n):
        buf[at + n - 1 - i] = 48 + v % 10
        v //= 10
    return at + n


@njit(nogil=True, cache=True)
def _put_bytes(buf, at, src, a, b):
    for i in range(a, b):
        buf[at] = src[i]
        at += 1
    return at


@njit(nogil=True, cache=True)
def _put_percent(buf, at, x):
    """x (a float32 value, 0 <= x <= 100) with two decimals, ties to even on its exact value."""
    m, e = math.frexp(x)
    mant = np.int64(m * 16777216.0)  # 24-bit mantissa: x = mant * 2**(e - 24)
    shift = e - 24
    num = mant * 100
    if shift >= 0:
        q = num << shift
    elif -shift > 62:
        q = 0
    else:
        den = np.int64(1) << (-shift)
        q = num // den
        r = num - q * den
        if 2 * r > den or (2 * r == den and q % 2 == 1):
            q += 1
    at = _put_int(buf, at, q // 100)
    buf[at] = 46
    buf[at + 1] = 48 + (q % 100) // 10
    buf[at + 2] = 48 + q % 10
    return at + 3


@njit(nogil=True, cache=True)
def render_rows(tid, pos, name, strand, values, percent, names, name_off, chroms, chrom_off, sep, buf):
    """Write rows into buf; returns the bytes used. `values` columns: Nvalid_cov .. Nnocall."""
    at = 0
    color = np.array([50, 53, 53, 44, 48, 44, 48], np.uint8)  # "255,0,0"
    stc = np.array([43, 45, 46], np.uint8)  # + - .
    for i in range(len(pos)):
        p = pos[i]
        at = _put_bytes(buf, at, chroms, chrom_off[tid[i]], chrom_off[tid[i] + 1])
        buf[at] = 9
        at = _put_int(buf, at + 1, p)
        buf[at] = 9
        at = _put_int(buf, at + 1, p + 1)
        buf[at] = 9
        at = _put_bytes(buf, at + 1, names, name_off[name[i]], name_off[name[i] + 1])
        buf[at] = 9
        at = _put_int(buf, at + 1, values[i, 0])
        buf[at] = 9
        buf[at + 1] = stc[strand[i]]
        buf[at + 2] = 9
        at = _put_int(buf, at + 3, p)
        buf[at] = 9
        at = _put_int(buf, at + 1, p + 1)
        buf[at] = 9
        at = _put_bytes(buf, at + 1, color, 0, 7)
        buf[at] = 9
        at = _put_int(buf, at + 1, values[i, 0])
        buf[at] = sep
        at = _put_percent(buf, at + 1, percent[i])
        for j in range(1, 8):
            buf[at] = sep
            at = _put_int(buf, at + 1, values[i, j])
        buf[at] = 10
        at += 1
    return at


def render_text(tid, pos, name, strand, values, percent, name_list: list[str], chrom_list: list[str], mixed: bool) -> str:
    """bedMethyl text of rows given as arrays (see render_rows)."""
    names = [n.encode() for n in name_list]
    chroms = [c.encode() for c in chrom_list]
    width = max(map(len, names), default=1) + max(map(len, chroms), default=1) + 240
    buf = np.empty(len(pos) * width, np.uint8)
    used = render_rows(tid, pos, name, strand, values, percent.astype(np.float64),
                       np.frombuffer(b"".join(names) or b" ", np.uint8), _offsets(names),
                       np.frombuffer(b"".join(chroms) or b" ", np.uint8), _offsets(chroms),
                       32 if mixed else 9, buf)
    return printf.text(buf[:used])


def _offsets(parts: list[bytes]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
