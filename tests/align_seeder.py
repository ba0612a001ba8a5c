"""A brute-force seeder for the alignment tests: exact k-mer hits between reads (both strands) and a
small reference, merged along their diagonals into maximal runs, handed over as `Seeds` exactly as
the FM-index seeding does. Slow and memory-hungry on purpose: it is the plainest statement of what
a seed is, for tests only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamer.align.anchors import Seeds
from streamer.align.bases import revcomp


def _packed(codes: np.ndarray, k: int) -> np.ndarray:
    n = max(len(codes) - k + 1, 0)
    out = np.zeros(n, dtype=np.uint64)
    for i in range(k):
        out = (out << np.uint64(2)) | codes[i:i + n].astype(np.uint64)
    return out


def _valid(codes: np.ndarray, starts: np.ndarray, k: int, offsets: np.ndarray) -> np.ndarray:
    """k-mers at `starts` lie inside one stretch of `offsets` and hold no N."""
    bad = np.concatenate([[0], np.cumsum(codes > 3)])
    ok = bad[starts + k] == bad[starts]
    seg = np.searchsorted(offsets, starts, side="right") - 1
    return ok & (starts + k <= offsets[seg + 1])


@dataclass
class KmerSeeder:
    """Seeds of length >= k from a reference held as (contig codes, ...)."""

    genome: np.ndarray  # codes of the contigs laid end to end
    contig_offsets: np.ndarray  # int64[n + 1]
    k: int = 15
    max_occ: int = 50

    @classmethod
    def of(cls, contigs: list[tuple[str, np.ndarray]], **kw) -> KmerSeeder:
        lengths = [len(c) for _, c in contigs]
        return cls(np.concatenate([c for _, c in contigs]), np.concatenate([[0], np.cumsum(lengths)]), **kw)

    def __post_init__(self):
        kmers = _packed(self.genome, self.k)
        pos = np.arange(len(kmers), dtype=np.int64)
        keep = _valid(self.genome, pos, self.k, self.contig_offsets)
        order = np.argsort(kmers[keep], kind="stable")
        self._kmers, self._pos = kmers[keep][order], pos[keep][order]

    def __call__(self, codes: np.ndarray, offsets: np.ndarray) -> Seeds:
        n = len(offsets) - 1
        lens = np.diff(offsets)
        read_of = np.repeat(np.arange(n, dtype=np.int64), lens)
        # the reverse complement of read i laid where read i is
        rc_codes = np.concatenate([revcomp(codes[offsets[i]:offsets[i + 1]]) for i in range(n)]) if n else codes
        hits = []
        for strand, buf in ((False, codes), (True, rc_codes)):
            kmers = _packed(buf, self.k)
            start = np.arange(len(kmers), dtype=np.int64)
            ok = _valid(buf, start, self.k, offsets)
            lo = np.searchsorted(self._kmers, kmers, "left")
            hi = np.searchsorted(self._kmers, kmers, "right")
            ok &= (hi > lo) & (hi - lo <= self.max_occ)
            start, lo, hi = start[ok], lo[ok], hi[ok]
            count = hi - lo
            q = np.repeat(start, count)
            idx = np.repeat(lo - np.cumsum(count) + count, count) + np.arange(count.sum())
            r = self._pos[idx]
            rd = read_of[q]
            hits.append((rd, q - offsets[rd], r, np.full(len(q), strand)))
        read, qpos, rpos, rc = (np.concatenate(x) for x in zip(*hits))
        order = np.lexsort((qpos, rpos - qpos, rc, read))
        read, qpos, rpos, rc = read[order], qpos[order], rpos[order], rc[order]
        if not len(read):
            return Seeds(*(np.zeros(0, t) for t in (np.int32, np.int32, np.int64, np.int32, bool)))
        diag = rpos - qpos
        cont = np.zeros(len(read), dtype=bool)
        cont[1:] = (read[1:] == read[:-1]) & (rc[1:] == rc[:-1]) & (diag[1:] == diag[:-1]) & (qpos[1:] == qpos[:-1] + 1)
        first = np.flatnonzero(~cont)
        last = np.concatenate([first[1:], [len(read)]]) - 1
        return Seeds(read[first].astype(np.int32), qpos[first].astype(np.int32), rpos[first].astype(np.int64),
                     (qpos[last] - qpos[first] + self.k).astype(np.int32), rc[first].astype(bool))
