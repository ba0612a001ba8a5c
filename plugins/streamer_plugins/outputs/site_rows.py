"""What the frequency tables (`methfreq`, `bedmethyl`) share: a batch's calls as flat arrays,
site rows kept in a numpy array keyed by an open-addressing hash index, and the calls' thresholds as
exact bounds.

The tables count each call in compiled code (no Python per call: the daemon's engine thread adds
hundreds of thousands of calls a minute while it holds the GIL). A site is a row of int64 columns,
keyed by a triple (contig, position, third: a strand or an end) in columns 0-2; the tables' counts
follow. The index is an int64 array of slots (-1: empty), a power of two at least twice the rows'
capacity, each slot a row found by hashing its key and probing the next slots in turn: one or two
cache lines a call, where numba's typed dict cost a call into its C hash table at every lookup (two
to four times the time a call). Rows only ever grow, and the index is rebuilt from them when they do.

Both tables compare the log-likelihood ratio as the calls TSV prints it, `round(llr, 2)`. Rounding
is monotonic and odd, so `|round(x, 2)| >= t` is `x >= b or x <= -b` for the least double `b` with
`round(b, 2) >= t`, and `round(x, 2) > 0` is `x >= b0` likewise: the bounds are found once per
threshold by bisection over doubles with Python's own `round`, and the kernels never round.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import numba
import numpy as np

from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.cpg.hmm import site_at
from streamer_plugins.texts import Texts

_EMPTY = -1
_MIX = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9)  # odd multipliers of the hash


def _ordered(x: float) -> int:
    """An integer that orders doubles as their values do."""
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & 0x7FFF_FFFF_FFFF_FFFF)


def _double(key: int) -> float:
    bits = key if key >= 0 else (-key) | -0x8000_0000_0000_0000
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _least(holds, lo: float, hi: float) -> float:
    """The least double in (lo, hi] where the monotonic `holds` is true (false at lo, true at hi)."""
    a, b = _ordered(lo), _ordered(hi)
    while b - a > 1:
        mid = (a + b) // 2
        if holds(_double(mid)):
            b = mid
        else:
            a = mid
    return _double(b)


@lru_cache(maxsize=None)
def called_bound(threshold: float) -> float:
    """The least x with round(x, 2) >= threshold: a call counts when x >= it or x <= -it."""
    return _least(lambda x: round(x, 2) >= threshold, threshold - 1.0, threshold + 1.0)


@lru_cache(maxsize=1)
def methylated_bound() -> float:
    """The least x with round(x, 2) > 0."""
    return _least(lambda x: round(x, 2) > 0, -1.0, 1.0)


def new_index() -> np.ndarray:
    """An empty index, for rows of no capacity yet (`with_room` sizes it to the rows)."""
    return np.full(2, _EMPTY, np.int64)


def grown(array: np.ndarray, size: int) -> np.ndarray:
    """`array`, or a copy with room for `size` rows (doubling), its first rows kept."""
    if array.shape[0] >= size:
        return array
    out = np.zeros((max(size, 2 * array.shape[0]), *array.shape[1:]), array.dtype)
    out[: array.shape[0]] = array
    return out


class Contigs:
    """Contig names as indices, in order of first sight."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.names = np.empty(0, object)

    def ids(self, calls: MethCalls, ref_names: Sequence[str]) -> np.ndarray:
        """int64: the contig of each call."""
        new = [name for name in dict.fromkeys(ref_names) if name not in self.index]
        if new:
            self.index.update(zip(new, range(len(self.index), len(self.index) + len(new))))
            self.names = np.array(list(self.index), object)
        per_record = np.fromiter(map(self.index.__getitem__, ref_names), np.int64, len(ref_names))
        return per_record[calls.read]

    def order(self, contig: np.ndarray, *then: np.ndarray) -> np.ndarray:
        """Row order by contig name (byte order), then by `then` in turn."""
        rank = np.empty(len(self.names), np.int64)
        rank[sorted(range(len(self.names)), key=lambda i: self.names[i].encode())] = np.arange(len(self.names))
        return np.lexsort((*reversed(then), rank[contig]))


def one_call(start: int, end: int, strand: int, llr: float, num_motifs: int, sequence: str) -> MethCalls:
    """A single call, of record 0."""
    return MethCalls(np.zeros(1, np.int64), np.array([start], np.int64), np.array([end], np.int64),
                     np.array([strand], np.int8), np.array([llr]), np.zeros(1), np.zeros(1),
                     np.array([num_motifs], np.int32), Texts.of([sequence]))


@numba.njit(nogil=True, cache=True, inline="always")
def _slot(index, rows, a, b, c):
    """The slot of key (a, b, c): the one holding its row, else the empty one where it would go."""
    mask = np.uint64(index.shape[0] - 1)
    h = np.uint64(a) * np.uint64(_MIX[0]) ^ np.uint64(b) * np.uint64(_MIX[1]) ^ np.uint64(c) * np.uint64(_MIX[2])
    s = (h ^ (h >> np.uint64(29))) & mask
    while True:
        row = index[s]
        if row == _EMPTY or (rows[row, 0] == a and rows[row, 1] == b and rows[row, 2] == c):
            return s
        s = (s + np.uint64(1)) & mask


@numba.njit(nogil=True, cache=True)
def _rehashed(rows, n, size):
    """An index of `size` slots over the first n rows."""
    index = np.full(size, _EMPTY, np.int64)
    for row in range(n):
        index[_slot(index, rows, rows[row, 0], rows[row, 1], rows[row, 2])] = row
    return index


def with_room(rows: np.ndarray, index: np.ndarray, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """`rows` grown to hold `size` rows (`grown`, its first n kept), and `index` rebuilt where it would be more
    than half full of them."""
    rows = grown(rows, size)
    slots = 2 * max(1, rows.shape[0])
    if index.shape[0] < slots:
        index = _rehashed(rows, n, 1 << (slots - 1).bit_length())
    return rows, index


@numba.njit(nogil=True, cache=True)
def row_of(index, rows, n, a, b, c):
    """The row of key (a, b, c), added with its key in columns 0-2 when new (room for it in `rows` and,
    at half load, in `index`); returns (row, n)."""
    s = _slot(index, rows, a, b, c)
    row = index[s]
    if row != _EMPTY:
        return row, n
    index[s] = n
    rows[n, 0], rows[n, 1], rows[n, 2] = a, b, c
    return n, n + 1


@numba.njit(nogil=True, cache=True)
def next_site(blob, o, length, j, motif):
    """The first site of the motif (`Motif.table`) at or after j in blob[o:o+length]; -1 if none."""
    while j < length:
        if site_at(blob, o, length, j, motif):
            return j
        j += 1
    return -1


@numba.njit(nogil=True, cache=True)
def lookup(index, rows, a, b, c):
    """The rows of keys (a[i], b[i], c[i]); -1 where absent."""
    out = np.empty(a.shape[0], np.int64)
    for i in range(a.shape[0]):
        out[i] = index[_slot(index, rows, a[i], b[i], c[i])]
    return out
