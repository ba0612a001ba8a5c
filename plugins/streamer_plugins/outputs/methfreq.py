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

The daemon's table is also the one the publisher serves snapshots from (one table for a
genome's ~28 M sites, not two), so it is thread-safe: one writer adds whole batches under
`lock`, and site counts are immutable tuples replaced on update, so `snapshot()` is a plain
dict copy under the lock and a reader never sees half a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple, TextIO

from streamer.pore.motifs import CPG, Motif
from streamer_plugins.cpg.calls import MethCalls

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


class MethFreq:
    """Accumulates calls into per-site counts; `format()` gives the current meth-freq table."""

    def __init__(self, call_threshold: float = CALL_THRESHOLD, split_groups: bool = False, motif: Motif = CPG,
                 per_motif: bool = False) -> None:  # fmt: skip
        self.call_threshold = call_threshold
        self.split_groups = split_groups
        self.motif = motif
        self.per_motif = per_motif
        self.group_column = "num_motifs_in_group"
        self.sites: dict[SiteKey, SiteStats] = {}
        """Written only under `lock`; read freely by the writer's own thread."""
        self.lock = threading.Lock()
        self._strings: dict[str, str] = {}  # one object per chromosome name and group sequence, not one per site

    def _credit(self, key: SiteKey, n_sites: int, methylated: bool, sequence: str, changed: set | None) -> None:
        site = self.sites.get(key)
        m = n_sites if methylated else 0
        if site is None:
            self.sites[key] = SiteStats(n_sites, n_sites, m, self._strings.setdefault(sequence, sequence))
        else:
            self.sites[key] = SiteStats(site[0], site[1] + n_sites, site[2] + m, site[3])
        if changed is not None:
            changed.add(key)

    def add(self, chrom: str, start: int, end: int, llr: float, num_motifs: int, sequence: str,
            changed: set | None = None) -> None:
        """Add one call (llr as printed in the calls TSV); the keys it credits go into `changed`."""
        with self.lock:
            self._add(chrom, start, end, llr, num_motifs, sequence, changed)

    def _add(self, chrom: str, start: int, end: int, llr: float, num_motifs: int, sequence: str,
             changed: set | None) -> None:
        if abs(llr) < (self.call_threshold * num_motifs if self.per_motif else self.call_threshold):
            return
        methylated = llr > 0
        chrom = self._strings.setdefault(chrom, chrom)
        if not (self.split_groups and num_motifs > 1):
            self._credit((chrom, start, end), num_motifs, methylated, sequence, changed)
            return
        sites = self.motif.find(sequence)
        for pos in sites:
            site = start + pos - sites[0]
            self._credit((chrom, site, site), 1, methylated, SPLIT_SEQUENCE, changed)

    def add_calls(self, calls: MethCalls, ref_names: Sequence[str], changed: set | None = None) -> None:
        """Add a batch's calls; `ref_names` is the batch's contig per record."""
        llrs = [round(x, 2) for x in calls.llr.tolist()]  # as printed: correctly rounded, like the TSV's text
        with self.lock:
            for read, start, end, llr, num, seq in zip(calls.read.tolist(), calls.start.tolist(), calls.end.tolist(),
                                                       llrs, calls.num_motifs.tolist(), calls.sequence):
                self._add(ref_names[read], start, end, llr, num, seq, changed)

    def snapshot(self) -> dict[SiteKey, SiteStats]:
        """The sites with at least one called site, consistent between batches; safe from any thread."""
        with self.lock:
            sites = dict(self.sites)
        return {key: site for key, site in sites.items() if site[1] > 0}

    def rows(self) -> list[tuple[str, int, int, SiteStats]]:
        """Sites with at least one called site, in f5c's order."""
        keys = sorted(self.sites, key=lambda key: (key[0].encode(), key[1], key[2]))
        return [(*key, self.sites[key]) for key in keys if self.sites[key].called_sites > 0]

    def format(self) -> str:
        """The current table, header included, formatted as f5c prints it."""
        out = [_FREQ_HEADER.format(group=self.group_column)]
        for chrom, start, end, s in self.rows():
            freq = s.called_sites_methylated / s.called_sites
            out.append(
                f"{chrom}\t{start}\t{end}\t{s.group_size}\t{s.called_sites}\t{s.called_sites_methylated}"
                f"\t{freq:.3f}\t{s.sequence}\n"
            )
        return "".join(out)

    def write(self, fh: TextIO) -> None:
        fh.write(self.format())
