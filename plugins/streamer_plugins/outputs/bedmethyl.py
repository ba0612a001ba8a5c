"""bedMethyl, as modkit pileup writes it, from group calls of a motif (CpG by default).

A group call covers every site of its group: each site gets one count from the call, on the strand
of the read, at the modified base. For CpG, a forward-strand call counts at the CpG's C (its
reference position p); a reverse-strand call counts at p + 1, the C of the CpG on the reverse
strand, as modkit reports strands separately (other motifs likewise at their `Motif.forward` and
`Motif.reverse`, with their modified base's code: `a` for dam's 6mA). A call is valid when
|log_lik_ratio| >= the threshold (f5c meth-freq's 2.5, on the ratio as printed with two decimals, so
counts agree with `streamer meth-freq -s`): modified if positive, canonical otherwise; below the
threshold it counts as Nfail. Only the motif's sites of the reference are called, so Ndelete, Ndiff, Nnocall and
Nother_mod are 0. As in modkit, rows with no valid coverage are not written; rows are sorted by
contig (byte order), position and strand. Calls are counted in compiled code over the batch's
arrays (`site_rows`): a site is a row of (contig, position, strand: 0 +, 1 -, modified, canonical, failed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

import numba
import numpy as np

from streamer.pore.motifs import CPG, Motif
from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.outputs.methfreq import CALL_THRESHOLD
from streamer_plugins.outputs.site_rows import (Contigs, called_bound, methylated_bound, new_index, next_site, one_call,
                                                row_of, with_room)
from streamer_plugins.outputs.site_text import BED, CHUNK_ROWS, site_chunks
from streamer_plugins.printf import text

COLOUR = "255,0,0"
_COLOUR = np.frombuffer(COLOUR.encode(), np.uint8)


@dataclass
class SiteCounts:
    """Read counts at one (contig, position, strand)."""

    n_mod: int = 0
    n_canonical: int = 0
    n_fail: int = 0

    @property
    def n_valid(self) -> int:
        return self.n_mod + self.n_canonical


_STRANDS = "+-"


@numba.njit(nogil=True, cache=True)
def _add(index, rows, n, contig, strand, start, llr, blob, off, bound, meth_bound, motif, marks, i):
    """Count each call from the i-th on at every site of its group; stops at a call whose sites may not fit
    `rows`. Returns that call (or the count) and the rows used."""
    while i < llr.shape[0]:
        o, length = off[i], off[i + 1] - off[i]
        if n + length // motif.shape[1] > rows.shape[0]:
            break
        x = llr[i]
        outcome = 5 if x < bound and x > -bound else (3 if x >= meth_bound else 4)  # column: fail, mod, canonical
        reverse = strand[i] != 1
        shift = marks[1] if reverse else marks[0]
        first = j = next_site(blob, o, length, 0, motif)
        while j >= 0:
            row, n = row_of(index, rows, n, contig[i], start[i] + j - first + shift, np.int64(reverse))
            rows[row, outcome] += 1
            j = next_site(blob, o, length, j + 1, motif)
        i += 1
    return i, n


class BedMethyl:
    """Accumulates group calls into per-site, per-strand counts; `write()` prints the table."""

    def __init__(self, call_threshold: float = CALL_THRESHOLD, motif: Motif = CPG) -> None:
        self.call_threshold = call_threshold
        self.motif = motif
        self.contigs = Contigs()
        self._index = new_index()
        self._rows = np.zeros((0, 6), np.int64)
        self._n = 0

    def add(self, chrom: str, strand: str, start: int, llr: float, sequence: str) -> None:
        """Add one group call: `start` is the group's first site, `sequence` the TSV's context (llr as printed)."""
        self.add_calls(one_call(start, start, 1 if strand == "+" else -1, llr, 1, sequence), [chrom])

    def add_calls(self, calls: MethCalls, ref_names: Sequence[str]) -> None:
        """Add a batch's calls; `ref_names` is the batch's contig per record."""
        blob, off = calls.sequence.blob, calls.sequence.off
        args = (self.contigs.ids(calls, ref_names), calls.strand, calls.start.astype(np.int64),
                calls.llr.astype(np.float64), blob, off, called_bound(self.call_threshold), methylated_bound(),
                self.motif.table(), self.motif.marks())
        i = 0
        while i < len(calls):
            size = self._n + max(off[i + 1] - off[i], 2 * (len(calls) - i))
            self._rows, self._index = with_room(self._rows, self._index, self._n, size)
            i, self._n = _add(self._index, self._rows, self._n, *args, i)

    @property
    def sites(self) -> dict[tuple[str, int, str], SiteCounts]:
        """Every site (a copy, built on each call: for readers, not for the batch path)."""
        return {(c, p, s): SiteCounts(*k) for c, p, s, k in self._listed(self._rows[: self._n])}

    def _listed(self, rows: np.ndarray) -> list[tuple[str, int, str, SiteCounts]]:
        return list(zip(self.contigs.names[rows[:, 0]].tolist(), rows[:, 1].tolist(),
                        [_STRANDS[k] for k in rows[:, 2].tolist()], map(SiteCounts, *rows[:, 3:6].T.tolist())))

    def rows(self) -> list[tuple[str, int, str, SiteCounts]]:
        """Sites with valid coverage, in output order."""
        rows = self._rows[: self._n]
        rows = rows[rows[:, 3] + rows[:, 4] > 0]
        return self._listed(rows[self.contigs.order(rows[:, 0], rows[:, 1], rows[:, 2])])

    def chunks(self, rows_per_chunk: int = CHUNK_ROWS) -> Iterator[np.ndarray]:
        """The table as uint8 text, a block of rows at a time (`site_text`, as `MethFreq.chunks`)."""
        rows = self._rows[: self._n]
        yield from site_chunks(BED, rows, np.flatnonzero(rows[:, 3] + rows[:, 4] > 0), self.contigs,
                               np.frombuffer(self.motif.mod_code.encode(), np.uint8), _COLOUR, rows_per_chunk)

    def write(self, fh: TextIO) -> None:
        fh.writelines(map(text, self.chunks()))
