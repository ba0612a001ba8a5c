"""Per-site methylation frequency, as f5c meth-freq computes it, kept current call by call.

A call counts when |log_lik_ratio| >= `call_threshold` (f5c: 2.5) and is methylated when the
ratio is positive; a group of n sites adds n called sites. With `per_motif` the threshold is
per site of the group (n times it), as nanopolish's calculate_methylation_frequency.py counts
(its threshold: 2.0). With `split_groups` a multi-site group is credited to each of its sites
separately (located by the motif's sites in its sequence: the CGs of a CpG group; nanopolish's
script looks for CG whatever the motif), with the sequence reported as "split-group". Sites
are printed sorted by chromosome (byte order), start, end; the first call seen for a site fixes
its group size and sequence.

The ratio that f5c compares is the one printed in the calls TSV (two decimals), so calls added
from records are rounded the same way before the threshold applies; a calls TSV is read into
records by `streamer_plugins.outputs.calls_tsv`.

Calls are counted in compiled code over the batch's arrays (`site_rows`): a site is a row of
(contig, start, end, group size, called, methylated, sequence offset, sequence length) with its
first call's sequence in a byte arena (length -1: "split-group").

The daemon's table is also the one the publisher serves snapshots from (one table for a
genome's ~28 M sites, not two), so it is thread-safe: one writer adds whole batches under
`lock`, and `snapshot()` copies the counts under the lock (the arena only grows), so a reader
never sees half a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple, TextIO

import numba
import numpy as np

from streamer.pore.motifs import CPG, Motif
from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.outputs.site_rows import (Contigs, called_bound, grown, lookup, methylated_bound, new_index,
                                                next_site, one_call, row_of, with_room)
from streamer_plugins.outputs.site_text import (CALLED, CHUNK_ROWS, CONTIG, END, FREQ, GROUP, LEN, METH, SEQ, START,
                                                site_chunks)
from streamer_plugins.printf import text

CALL_THRESHOLD = 2.5
SPLIT_SEQUENCE = "split-group"

_FREQ_HEADER = (
    "chromosome\tstart\tend\t{group}\tcalled_sites\tcalled_sites_methylated\tmethylated_frequency\tgroup_sequence\n"
)


SiteKey = tuple[str, int, int]


class SiteStats(NamedTuple):
    """Counts for one (chromosome, start, end) site, in the publisher's FREQ_COLUMNS order."""

    group_size: int
    called_sites: int
    called_sites_methylated: int
    sequence: str


_SPLIT = np.frombuffer(SPLIT_SEQUENCE.encode(), np.uint8)


@numba.njit(nogil=True, cache=True)
def _credit(index, rows, n, key, n_sites, methylated, seq, seq_len, touched, t):
    row, after = row_of(index, rows, n, key[0], key[1], key[2])
    if after > n:  # a new site: its first call fixes its group size and sequence
        rows[row, GROUP], rows[row, SEQ], rows[row, LEN] = n_sites, seq, seq_len
    rows[row, CALLED] += n_sites
    if methylated:
        rows[row, METH] += n_sites
    touched[t] = row
    return after


@numba.njit(nogil=True, cache=True)
def _add(index, rows, n, arena, n_bytes, contig, start, end, llr, num, blob, off, bound, meth_bound, split, motif,
         touched, t, i):  # fmt: skip
    """Credit each called call from the i-th on to its site(s) (the module's rules), the rows it credits into
    `touched`; stops at a call that may not fit the arrays. Returns that call (or the count), rows, bytes, credits."""
    while i < llr.shape[0]:
        x, b = llr[i], bound[num[i]]
        o, length = off[i], off[i + 1] - off[i]
        group = split and num[i] > 1
        credits = length // motif.shape[1] if group else 1
        if n + credits > rows.shape[0] or t + credits > touched.shape[0] or n_bytes + length > arena.shape[0]:
            break
        methylated = x >= meth_bound
        if (x < b and x > -b) or credits == 0:
            pass
        elif not group:
            seen = n
            n = _credit(index, rows, n, (contig[i], start[i], end[i]), num[i], methylated, n_bytes, length, touched, t)
            t += 1
            if n > seen:
                arena[n_bytes : n_bytes + length] = blob[o : o + length]
                n_bytes += length
        else:
            first = j = next_site(blob, o, length, 0, motif)
            while j >= 0:
                site = start[i] + j - first
                n = _credit(index, rows, n, (contig[i], site, site), 1, methylated, 0, -1, touched, t)
                t += 1
                j = next_site(blob, o, length, j + 1, motif)
        i += 1
    return i, n, n_bytes, t


class MethFreq:
    """Accumulates calls into per-site counts; `format()` gives the current meth-freq table."""

    def __init__(self, call_threshold: float = CALL_THRESHOLD, split_groups: bool = False, motif: Motif = CPG,
                 per_motif: bool = False) -> None:  # fmt: skip
        self.call_threshold = call_threshold
        self.split_groups = split_groups
        self.motif = motif
        self.per_motif = per_motif
        self.group_column = "num_motifs_in_group"
        self.lock = threading.Lock()
        self.contigs = Contigs()
        self._index = new_index()
        self._rows = np.zeros((0, 8), np.int64)
        self._arena = np.zeros(0, np.uint8)
        self._n = self._n_bytes = 0
        """Rows, their index and the arena are written only under `lock`; read freely by the writer's own thread."""

    def _bounds(self, num: np.ndarray) -> np.ndarray:
        """The called bound per group size 0..max(num)."""
        sizes = range(int(num.max()) + 1 if len(num) else 1)
        return np.array([called_bound(self.call_threshold * k if self.per_motif else self.call_threshold)
                         for k in sizes])  # fmt: skip

    def add(self, chrom: str, start: int, end: int, llr: float, num_motifs: int, sequence: str,
            changed: set | None = None) -> None:
        """Add one call (llr as printed in the calls TSV); the keys it credits go into `changed`."""
        self.add_calls(one_call(start, end, 1, llr, num_motifs, sequence), [chrom], changed)

    def add_calls(self, calls: MethCalls, ref_names: Sequence[str], changed: set | None = None) -> None:
        """Add a batch's calls; `ref_names` is the batch's contig per record; the keys credited go into `changed`."""
        contig = self.contigs.ids(calls, ref_names)
        blob, off = calls.sequence.blob, calls.sequence.off
        num = calls.num_motifs.astype(np.int64)
        args = (contig, calls.start.astype(np.int64), calls.end.astype(np.int64), calls.llr.astype(np.float64), num,
                blob, off, self._bounds(num), methylated_bound(), self.split_groups, self.motif.table())
        touched = np.empty(len(num), np.int64)
        i = t = 0
        with self.lock:
            while i < len(num):
                more = off[i + 1] - off[i] + 1  # room for the call it stopped at, at least
                size = self._n + max(more, len(num) - i)
                self._rows, self._index = with_room(self._rows, self._index, self._n, size)
                self._arena = grown(self._arena, self._n_bytes + more)
                touched = grown(touched, t + more)
                i, self._n, self._n_bytes, t = _add(self._index, self._rows, self._n, self._arena, self._n_bytes,
                                                    *args, touched, t, i)  # fmt: skip
        if changed is not None and t:
            changed.update(self._keys(self._rows[np.unique(touched[:t])]))

    def _keys(self, rows: np.ndarray) -> zip:
        return zip(self.contigs.names[rows[:, CONTIG]].tolist(), rows[:, START].tolist(), rows[:, END].tolist())

    def _sites(self, rows: np.ndarray, arena: np.ndarray) -> dict[SiteKey, SiteStats]:
        text = arena.tobytes().decode("ascii")
        seqs = [text[o : o + k] if k >= 0 else SPLIT_SEQUENCE for o, k in rows[:, [SEQ, LEN]].tolist()]
        stats = map(SiteStats, rows[:, GROUP].tolist(), rows[:, CALLED].tolist(), rows[:, METH].tolist(), seqs)
        return dict(zip(self._keys(rows), stats))

    @property
    def sites(self) -> dict[SiteKey, SiteStats]:
        """Every site (a copy, built on each call: for readers, not for the batch path)."""
        return self._sites(self._rows[: self._n], self._arena[: self._n_bytes])

    def select(self, keys: Sequence[SiteKey]) -> dict[SiteKey, SiteStats]:
        """The sites of `keys` (all present), in that order."""
        if not keys:
            return {}
        chrom, start, end = zip(*keys)
        contig = np.fromiter(map(self.contigs.index.__getitem__, chrom), np.int64, len(keys))
        found = lookup(self._index, self._rows, contig, np.array(start, np.int64), np.array(end, np.int64))
        return self._sites(self._rows[found], self._arena[: self._n_bytes])

    def snapshot(self) -> dict[SiteKey, SiteStats]:
        """The sites with at least one called site, consistent between batches; safe from any thread."""
        with self.lock:
            rows, arena = self._rows[: self._n].copy(), self._arena[: self._n_bytes]
        return self._sites(rows[rows[:, CALLED] > 0], arena)

    def rows(self) -> list[tuple[str, int, int, SiteStats]]:
        """Sites with at least one called site, in f5c's order."""
        rows = self._rows[: self._n]
        rows = rows[rows[:, CALLED] > 0]
        rows = rows[self.contigs.order(rows[:, CONTIG], rows[:, START], rows[:, END])]
        return [(*key, stats) for key, stats in self._sites(rows, self._arena[: self._n_bytes]).items()]
    def chunks(self, rows_per_chunk: int = CHUNK_ROWS) -> Iterator[np.ndarray]:
        """The current table as f5c prints it, header first, as uint8 text a block of rows at a time
        (`site_text`: compiled, without the GIL, a genome's sites never held as one text)."""
        yield np.frombuffer(_FREQ_HEADER.format(group=self.group_column).encode(), np.uint8)
        rows = self._rows[: self._n]
        yield from site_chunks(FREQ, rows, np.flatnonzero(rows[:, CALLED] > 0), self.contigs,
                               self._arena[: self._n_bytes], _SPLIT, rows_per_chunk)  # fmt: skip

    def format(self) -> str:
        """The current table, header included, formatted as f5c prints it."""
        return "".join(text(chunk) for chunk in self.chunks())

    def write(self, fh: TextIO) -> None:
        fh.writelines(map(text, self.chunks()))
