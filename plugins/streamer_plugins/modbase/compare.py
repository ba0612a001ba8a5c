"""`streamer compare-meth`: streamer's signal-level CpG frequencies against dorado's MM/ML calls.

A run that has both (the daemon writes `meth-freq.tsv` and `modkit.bed` side by side) is
checked row by row of the meth-freq table: Pearson and Spearman correlation of the two
frequencies, mean absolute and mean signed difference (HMM - dorado), each also weighted by
coverage, over the rows both cover at least `--min-coverage` reads per CpG.

The unit is the HMM's row, with dorado's calls summed over its CpGs. A multi-CpG row is one
call per read for the whole group (f5c/nanopolish score the group's CpGs together): spreading
it over its CpGs would count one measurement several times, with the same value, in every
statistic. Dorado's CpGs from the row's `start` to its `end` (the + strand Cs of its first and
last CpG; every CpG in between belongs to the group) are summed instead, so both sides
count the same thing: calls on the group's CpGs. Rows of `meth-freq --split-groups` are single
CpGs, so that table gives the per-CpG comparison, each CpG with its group's call.

- HMM frequency: called_sites_methylated / called_sites; coverage: called_sites /
  num_motifs_in_group, the reads called at each CpG of the row.
- Dorado frequency: sum Nmod / sum Nvalid_cov over the row's CpGs (both strands: a `-` row's C
  is one base after the + C; combined `.` rows are at the + C); coverage: sum Nvalid_cov /
  num_motifs_in_group, valid calls per CpG.
- Weight: the smaller of the two coverages, the side the difference is least sure of.
  Spearman's weighted form is the weighted Pearson correlation of the (unweighted) ranks.

The dorado table is expected to hold CpG sites only (dorado's CpG models call nothing else;
`pileup --cpg` or `--preset traditional` keep only CpGs): another C inside a group's span
would be counted with it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from streamer.errors import InputError
from streamer.flags import bounded
from streamer_plugins.modbase.methtables import BedSites, Contigs, FreqRows, read_bedmethyl, read_freq, site_key

NAME = "compare-meth"
HELP = "per-CpG comparison of streamer's methylation frequencies (meth-freq.tsv) with dorado's (modkit bedMethyl)"
SITES_HEADER = ("chromosome\tstart\tend\tnum_motifs_in_group\thmm_called_sites\thmm_methylated\thmm_frequency\t"
                "hmm_coverage\tdorado_cpgs\tdorado_valid\tdorado_modified\tdorado_frequency\tdorado_coverage\n")
WRITE_ROWS = 200_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hmm", type=Path, required=True, metavar="TSV", help="meth-freq.tsv (streamer, f5c or nanopolish)")
    p.add_argument("--dorado", type=Path, required=True, metavar="BED", help="bedMethyl (modkit pileup, modkit.bed)")
    p.add_argument("--mod-code", default="m", help="the bedMethyl rows compared [m]")
    bounded(p, "--min-coverage", type=int, minimum=1, default=5,
            help="rows need this many reads per CpG on both sides [%(default)s]")
    p.add_argument("-o", "--output", type=Path, help="per-row TSV of both frequencies and coverages")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


@dataclass(frozen=True)
class Joined:
    """Per HMM row: dorado's CpGs in its span, their valid and modified calls summed."""

    cpgs: np.ndarray
    valid: np.ndarray
    modified: np.ndarray


def join(hmm: FreqRows, dorado: BedSites) -> Joined:
    """Dorado's counts summed over each row's [start, end], by prefix sums and binary search."""
    lo = np.searchsorted(dorado.key, site_key(hmm.contig, hmm.start), side="left")
    hi = np.searchsorted(dorado.key, site_key(hmm.contig, hmm.end), side="right")
    valid = np.concatenate([[0], np.cumsum(dorado.valid)])
    modified = np.concatenate([[0], np.cumsum(dorado.modified)])
    return Joined(hi - lo, valid[hi] - valid[lo], modified[hi] - modified[lo])


@dataclass(frozen=True)
class Comparison:
    hmm_sites: int  # rows with a call
    hmm_cpgs: int  # their CpGs
    dorado_sites: int  # CpGs with a valid call
    sites_in_both: int  # HMM rows with a valid dorado call on one of their CpGs
    sites_compared: int  # of those, with at least min_coverage reads per CpG on both sides
    min_coverage: int
    pearson: float | None
    spearman: float | None
    mean_abs_diff: float | None
    mean_diff: float | None  # hmm - dorado
    weighted_pearson: float | None
    weighted_spearman: float | None
    weighted_mean_abs_diff: float | None
    weighted_mean_diff: float | None


@dataclass(frozen=True)
class Compared:
    """The rows compared (indices into the HMM rows) and their frequencies, coverages, weights."""

    rows: np.ndarray
    hmm_freq: np.ndarray
    hmm_cov: np.ndarray
    dorado_freq: np.ndarray
    dorado_cov: np.ndarray

    @property
    def weight(self) -> np.ndarray:
        return np.minimum(self.hmm_cov, self.dorado_cov)


def compare(hmm: FreqRows, dorado: BedSites, joined: Joined, min_coverage: int) -> tuple[Comparison, Compared]:
    called = hmm.called > 0
    both = called & (joined.valid > 0)
    hmm_cov = hmm.called / hmm.n_cpgs
    dorado_cov = joined.valid / hmm.n_cpgs
    rows = np.flatnonzero(both & (hmm_cov >= min_coverage) & (dorado_cov >= min_coverage))
    c = Compared(rows, hmm.methylated[rows] / hmm.called[rows], hmm_cov[rows],
                 joined.modified[rows] / joined.valid[rows], dorado_cov[rows])
    diff, w = c.hmm_freq - c.dorado_freq, c.weight
    n = len(rows)
    rh, rd = _ranks(c.hmm_freq), _ranks(c.dorado_freq)
    summary = Comparison(
        int(called.sum()), int(hmm.n_cpgs[called].sum()), len(dorado.key), int(both.sum()), n, min_coverage,
        _corr(c.hmm_freq, c.dorado_freq), _corr(rh, rd),
        float(np.abs(diff).mean()) if n else None, float(diff.mean()) if n else None,
        _corr(c.hmm_freq, c.dorado_freq, w), _corr(rh, rd, w),
        float(np.average(np.abs(diff), weights=w)) if n else None, float(np.average(diff, weights=w)) if n else None)
    return summary, c


def _corr(a: np.ndarray, b: np.ndarray, w: np.ndarray | None = None) -> float | None:
    """Pearson's r (weighted when `w` is given); None for fewer than two rows or a constant side."""
    if len(a) < 2:
        return None
    w = np.ones(len(a)) if w is None else w / w.sum()
    da, db = a - np.average(a, weights=w), b - np.average(b, weights=w)
    va, vb = np.average(da * da, weights=w), np.average(db * db, weights=w)
    if va <= 0 or vb <= 0:
        return None
    return float(np.clip(np.average(da * db, weights=w) / np.sqrt(va * vb), -1.0, 1.0))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties given their mean rank (Spearman's)."""
    order = np.argsort(x, kind="stable")
    _, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(first + (counts - 1) / 2, counts)
    return ranks


def write_sites(out, contigs: Contigs, hmm: FreqRows, joined: Joined, c: Compared) -> None:
    """The compared rows, in the meth-freq table's order, formatted a chunk at a time."""
    out.write(SITES_HEADER)
    names = contigs.names()
    for a in range(0, len(c.rows), WRITE_ROWS):
        r, s = c.rows[a:a + WRITE_ROWS], slice(a, a + WRITE_ROWS)
        columns = [names[hmm.contig[r]].tolist(), *(v[r].tolist() for v in (hmm.start, hmm.end, hmm.n_cpgs)),
                   hmm.called[r].tolist(), hmm.methylated[r].tolist(), _fixed(c.hmm_freq[s]), _fixed(c.hmm_cov[s]),
                   joined.cpgs[r].tolist(), joined.valid[r].tolist(), joined.modified[r].tolist(),
                   _fixed(c.dorado_freq[s]), _fixed(c.dorado_cov[s])]
        out.write("".join("\t".join(map(str, row)) + "\n" for row in zip(*columns)))


def _fixed(x: np.ndarray) -> list[str]:
    return [f"{v:.4f}" for v in x.tolist()]


def run(args: argparse.Namespace) -> int:
    out = None
    if args.output is not None:
        try:  # before the work, as pileup does
            out = open(args.output, "w")
        except OSError as exc:
            raise InputError(args.output, f"cannot write: {exc.strerror}") from None
    try:
        contigs = Contigs()
        hmm = read_freq(args.hmm, contigs)
        dorado = read_bedmethyl(args.dorado, contigs, args.mod_code)
        joined = join(hmm, dorado)
        summary, compared = compare(hmm, dorado, joined, args.min_coverage)
        if out is not None:
            write_sites(out, contigs, hmm, joined, compared)
    except BaseException:
        if out is not None:  # no half table left to be taken for a result
            out.close()
            args.output.unlink(missing_ok=True)
        raise
    if out is not None:
        out.close()
    print(json.dumps(asdict(summary), indent=2) if args.json else render(summary))
    return 0


def render(r: Comparison) -> str:
    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    return "\n".join([
        f"HMM: {r.hmm_sites} rows ({r.hmm_cpgs} CpGs); dorado: {r.dorado_sites} CpGs; {r.sites_in_both} rows in both, "
        f"{r.sites_compared} with >= {r.min_coverage} reads per CpG on both sides",
        f"correlation: Pearson {num(r.pearson)}, Spearman {num(r.spearman)}; coverage-weighted: Pearson "
        f"{num(r.weighted_pearson)}, Spearman {num(r.weighted_spearman)}",
        f"difference (HMM - dorado): mean {num(r.mean_diff)}, mean absolute {num(r.mean_abs_diff)}; coverage-weighted: "
        f"mean {num(r.weighted_mean_diff)}, mean absolute {num(r.weighted_mean_abs_diff)}",
    ])
