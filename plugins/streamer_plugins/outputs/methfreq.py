"""Per-site methylation frequency, as f5c meth-freq computes it, kept current call by call.

A call counts when |log_lik_ratio| >= `call_threshold` (f5c: 2.5) and is methylated when the
ratio is positive; a group of n CpGs adds n called sites. With `split_groups` a multi-CpG group
is credited to each of its CpGs separately (located by the CG positions in its sequence, with
the sequence reported as "split-group"). Sites are printed sorted by chromosome (byte order),
start, end; the first call seen for a site fixes its group size and sequence.

The ratio that f5c compares is the one printed in the calls TSV (two decimals), so calls added
from records are rounded the same way before the threshold applies.

The daemon's table is also the one the publisher serves snapshots from (one table for a
genome's ~28 M sites, not two), so it is thread-safe: one writer adds whole batches under
`lock`, and site counts are immutable tuples replaced on update, so `snapshot()` is a plain
dict copy under the lock and a reader never sees half a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from streamer.errors import InputError
from streamer_plugins.cpg.calls import MethCalls

CALL_THRESHOLD = 2.5
SPLIT_SEQUENCE = "split-group"

_CALLS_COLUMNS = (
    "chromosome\t{strand}start\tend\tread_name\tlog_lik_ratio\tlog_lik_methylated\tlog_lik_unmethylated"
    "\tnum_calling_strands\t{count}\tsequence"
)
# Accepted call-TSV headers -> (has strand column, name of the count column).
_CALL_HEADERS = {
    _CALLS_COLUMNS.format(strand=strand, count=count): (bool(strand), count)
    for strand in ("", "strand\t")
    for count in ("num_cpgs", "num_motifs")
}
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

    def __init__(self, call_threshold: float = CALL_THRESHOLD, split_groups: bool = False) -> None:
        self.call_threshold = call_threshold
        self.split_groups = split_groups
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
        if abs(llr) < self.call_threshold:
            return
        methylated = llr > 0
        chrom = self._strings.setdefault(chrom, chrom)
        if not (self.split_groups and num_motifs > 1):
            self._credit((chrom, start, end), num_motifs, methylated, sequence, changed)
            return
        first = pos = sequence.find("CG")
        while pos != -1:
            self._credit((chrom, start + pos - first, start + pos - first), 1, methylated, SPLIT_SEQUENCE, changed)
            pos = sequence.find("CG", pos + 1)

    def add_calls(self, calls: MethCalls, ref_names: Sequence[str], changed: set | None = None) -> None:
        """Add a batch's calls; `ref_names` is the batch's contig per record."""
        llrs = [round(x, 2) for x in calls.llr.tolist()]  # as printed: correctly rounded, like the TSV's text
        with self.lock:
            for read, start, end, llr, num, seq in zip(calls.read.tolist(), calls.start.tolist(), calls.end.tolist(),
                                                       llrs, calls.num_motifs.tolist(), calls.sequence):
                self._add(ref_names[read], start, end, llr, num, seq, changed)

    def add_tsv(self, lines: Iterable[str], source: str | Path = "<calls>", changed: set | None = None) -> None:
        """Add the rows of a call-methylation TSV (nanopolish or f5c, with or without strand).

        The rows go in as one batch: a concurrent `snapshot()` sees all of them or none.
        `changed`, when given, collects the keys of the sites they credited.
        """
        with self.lock:
            self._add_tsv(lines, source, changed)

    def _add_tsv(self, lines: Iterable[str], source: str | Path, changed: set | None) -> None:
        it = iter(lines)
        header = next(it, None)
        if header is None:
            raise InputError(source, "empty file, expected a call-methylation header", line=1)
        fmt = _CALL_HEADERS.get(header.rstrip("\n"))
        if fmt is None:
            raise InputError(source, f"not a call-methylation header: {header.strip()!r}", line=1)
        has_strand, count = fmt
        if count == "num_cpgs":
            self.group_column = "num_cpgs_in_group"
        n_fields = 11 if has_strand else 10
        for line_no, line in enumerate(it, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != n_fields:
                raise InputError(source, f"expected {n_fields} columns, found {len(fields)}", line=line_no)
            if has_strand:
                del fields[1]
            try:
                start, end, llr, num = int(fields[1]), int(fields[2]), float(fields[4]), int(fields[8])
            except ValueError as exc:
                raise InputError(source, f"malformed number: {exc}", line=line_no) from None
            if start < 0 or end < 0 or num < 0:
                raise InputError(source, "coordinates and motif counts cannot be negative", line=line_no)
            self._add(fields[0], start, end, llr, num, fields[9], changed)

    def read(self, path: str | Path) -> None:
        """Add the calls of a call-methylation TSV file."""
        try:
            with open(path) as fh:
                self.add_tsv(fh, path)
        except OSError as exc:
            raise InputError(path, f"cannot read calls: {exc.strerror}") from exc

    @classmethod
    def from_tsv(cls, path: str | Path, call_threshold: float = CALL_THRESHOLD, split_groups: bool = False):
        """meth-freq of a calls file."""
        freq = cls(call_threshold, split_groups)
        freq.read(path)
        return freq

    def snapshot(self) -> dict[SiteKey, SiteStats]:
        """The sites with at least one called CpG, consistent between batches; safe from any thread."""
        with self.lock:
            sites = dict(self.sites)
        return {key: site for key, site in sites.items() if site[1] > 0}

    def rows(self) -> list[tuple[str, int, int, SiteStats]]:
        """Sites with at least one called CpG, in f5c's order."""
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
