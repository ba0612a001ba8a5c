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
contig (byte order), position and strand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from streamer.pore.motifs import CPG, Motif
from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.outputs.methfreq import CALL_THRESHOLD

COLOUR = "255,0,0"
_STRAND = {1: "+", -1: "-"}


@dataclass
class SiteCounts:
    """Read counts at one (contig, position, strand)."""

    n_mod: int = 0
    n_canonical: int = 0
    n_fail: int = 0

    @property
    def n_valid(self) -> int:
        return self.n_mod + self.n_canonical


class BedMethyl:
    """Accumulates group calls into per-site, per-strand counts; `write()` prints the table."""

    def __init__(self, call_threshold: float = CALL_THRESHOLD, motif: Motif = CPG) -> None:
        self.call_threshold = call_threshold
        self.motif = motif
        self.sites: dict[tuple[str, int, str], SiteCounts] = {}

    def add(self, chrom: str, strand: str, start: int, llr: float, sequence: str) -> None:
        """Add one group call: `start` is the group's first site, `sequence` the TSV's context (llr as printed)."""
        shift = self.motif.forward if strand == "+" else self.motif.reverse
        sites = self.motif.find(sequence)
        for pos in sites:
            key = (chrom, start + pos - sites[0] + shift, strand)
            site = self.sites.get(key)
            if site is None:
                site = self.sites[key] = SiteCounts()
            if abs(llr) < self.call_threshold:
                site.n_fail += 1
            elif llr > 0:
                site.n_mod += 1
            else:
                site.n_canonical += 1

    def add_calls(self, calls: MethCalls, ref_names: Sequence[str]) -> None:
        """Add a batch's calls; `ref_names` is the batch's contig per record."""
        for read, strand, start, llr, seq in zip(calls.read.tolist(), calls.strand.tolist(), calls.start.tolist(),
                                                 calls.llr.tolist(), calls.sequence):
            self.add(ref_names[read], _STRAND[strand], start, round(llr, 2), seq)

    def rows(self) -> list[tuple[str, int, str, SiteCounts]]:
        """Sites with valid coverage, in output order."""
        keys = sorted(self.sites, key=lambda k: (k[0].encode(), k[1], k[2] != "+"))
        return [(*k, self.sites[k]) for k in keys if self.sites[k].n_valid > 0]

    def write(self, fh: TextIO) -> None:
        for chrom, pos, strand, s in self.rows():
            n = s.n_valid
            fh.write(
                f"{chrom}\t{pos}\t{pos + 1}\t{self.motif.mod_code}\t{n}\t{strand}\t{pos}\t{pos + 1}\t{COLOUR}\t{n}"
                f"\t{100 * s.n_mod / n:.2f}\t{s.n_mod}\t{s.n_canonical}\t0\t0\t{s.n_fail}\t0\t0\n"
            )
