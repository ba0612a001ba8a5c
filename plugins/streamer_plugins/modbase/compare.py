"""`streamer compare-meth`: streamer's signal-level CpG frequencies against dorado's MM/ML calls.

A run that has both (the daemon writes `meth-freq.tsv` and `modkit.bed` side by side) can be
checked site by site: Pearson and Spearman correlation of the two frequencies, mean absolute and
mean signed difference, over the CpGs both cover at least `--min-coverage` times.

The join is per CpG, on the C of its + strand. An HMM row of several CpGs (a group f5c calls
together) stands for each of its CpGs with the group's frequency and coverage, the same rule as
`meth-freq --split-groups`; its CpGs are where `CG` occurs in the group's sequence, the first at
`start`. bedMethyl rows of the chosen mod code count per strand (a - strand row's C is one base
after the + strand's C), so both strands of a CpG are summed, as the HMM calls both together;
combined-strand rows (`.`) are taken as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from streamer.errors import InputError
from streamer.flags import bounded

NAME = "compare-meth"
HELP = "per-CpG comparison of streamer's methylation frequencies (meth-freq.tsv) with dorado's (modkit bedMethyl)"
FREQ_HEADER = "chromosome\tstart\tend\tnum_motifs_in_group\tcalled_sites\tcalled_sites_methylated"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hmm", type=Path, required=True, metavar="TSV", help="meth-freq.tsv (streamer, f5c or nanopolish)")
    p.add_argument("--dorado", type=Path, required=True, metavar="BED", help="bedMethyl (modkit pileup, modkit.bed)")
    p.add_argument("--mod-code", default="m", help="the bedMethyl rows compared [m]")
    bounded(p, "--min-coverage", type=int, minimum=1, default=5,
            help="sites need this many calls on both sides [%(default)s]")
    p.add_argument("-o", "--output", type=Path, help="per-site TSV of both frequencies and coverages")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


@dataclass(frozen=True)
class Sites:
    """Per CpG: contig index, + strand C position, calls, modified calls."""

    contig: np.ndarray
    pos: np.ndarray
    coverage: np.ndarray
    modified: np.ndarray

    def key(self) -> np.ndarray:
        return self.contig.astype(np.int64) << 40 | self.pos

    def merged(self) -> "Sites":
        """Rows at one site summed (both strands of a CpG), in key order."""
        keys, inverse = np.unique(self.key(), return_inverse=True)
        cov = np.bincount(inverse, self.coverage, len(keys)).astype(np.int64)
        mod = np.bincount(inverse, self.modified, len(keys)).astype(np.int64)
        return Sites(keys >> 40, keys & ((1 << 40) - 1), cov, mod)


def read_freq(path: Path, contigs: dict[str, int]) -> Sites:
    """meth-freq rows, each group expanded to its CpGs."""
    contig, pos, cov, mod = [], [], [], []
    with _open(path) as fh:
        header = fh.readline()
        if not header.startswith(FREQ_HEADER):
            raise InputError(path, "not a methylation frequency TSV (header chromosome, start, end, "
                                   "num_motifs_in_group, called_sites, called_sites_methylated, ...)", line=1)
        for number, line in enumerate(fh, 2):
            f = line.rstrip("\n").split("\t")
            try:
                start, called, methylated, sequence = int(f[1]), int(f[4]), int(f[5]), f[7]
            except (IndexError, ValueError):
                raise InputError(path, "expected 8 tab-separated columns with whole numbers in 2-6", line=number) \
                    from None
            cgs = [i for i in range(len(sequence) - 1) if sequence[i:i + 2] == "CG"] or [0]
            c = contigs.setdefault(f[0], len(contigs))
            for i in cgs:
                contig.append(c)
                pos.append(start + i - cgs[0])
                cov.append(called)
                mod.append(methylated)
    return _sites(contig, pos, cov, mod)


def read_bedmethyl(path: Path, contigs: dict[str, int], code: str) -> Sites:
    """bedMethyl rows of one mod code at the + strand C of their CpG."""
    contig, pos, cov, mod = [], [], [], []
    with _open(path) as fh:
        for number, line in enumerate(fh, 1):
            if line.startswith(("#", "chrom\t", "track")):
                continue
            f = line.rstrip("\n").replace(" ", "\t").split("\t")
            if len(f) < 12:
                raise InputError(path, f"expected bedMethyl's 18 columns, found {len(f)}", line=number)
            if f[3].split(",")[0] != code:
                continue
            try:
                start, valid, nmod = int(f[1]), int(f[9]), int(f[11])
            except ValueError:
                raise InputError(path, "columns 2, 10 and 12 must be whole numbers", line=number) from None
            contig.append(contigs.setdefault(f[0], len(contigs)))
            pos.append(start - 1 if f[5] == "-" else start)
            cov.append(valid)
            mod.append(nmod)
    return _sites(contig, pos, cov, mod)


def _sites(contig, pos, cov, mod) -> Sites:
    return Sites(np.array(contig, np.int64), np.array(pos, np.int64), np.array(cov, np.int64),
                 np.array(mod, np.int64)).merged()


def _open(path: Path):
    try:
        return open(path)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None


@dataclass(frozen=True)
class Comparison:
    hmm_sites: int
    dorado_sites: int
    sites_in_both: int  # both sides with at least min_coverage calls
    min_coverage: int
    pearson: float | None
    spearman: float | None
    mean_abs_diff: float | None
    mean_diff: float | None  # hmm - dorado
    weighted_mean_abs_diff: float | None  # weights: the smaller coverage of the two


def compare(hmm: Sites, dorado: Sites, min_coverage: int) -> tuple[Comparison, np.ndarray, np.ndarray, np.ndarray]:
    """The summary, and the indices into `hmm` and `dorado` of the sites compared, with their weights."""
    common, ih, idd = np.intersect1d(hmm.key(), dorado.key(), assume_unique=True, return_indices=True)
    keep = (hmm.coverage[ih] >= min_coverage) & (dorado.coverage[idd] >= min_coverage)
    ih, idd = ih[keep], idd[keep]
    fh = hmm.modified[ih] / hmm.coverage[ih]
    fd = dorado.modified[idd] / dorado.coverage[idd]
    weight = np.minimum(hmm.coverage[ih], dorado.coverage[idd])
    n = len(ih)
    diff = fh - fd
    result = Comparison(len(hmm.pos), len(dorado.pos), n, min_coverage,
                        _corr(fh, fd), _corr(_ranks(fh), _ranks(fd)),
                        float(np.abs(diff).mean()) if n else None, float(diff.mean()) if n else None,
                        float((np.abs(diff) * weight).sum() / weight.sum()) if n else None)
    return result, ih, idd, weight


def _corr(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return None
    return float(np.corrcoef(a, b)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties given their mean rank (Spearman's)."""
    order = np.argsort(x, kind="stable")
    values, first, counts = np.unique(x[order], return_index=True, return_counts=True)
    mean_rank = first + (counts - 1) / 2
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(mean_rank, counts)
    return ranks


def run(args: argparse.Namespace) -> int:
    contigs: dict[str, int] = {}
    hmm = read_freq(args.hmm, contigs)
    dorado = read_bedmethyl(args.dorado, contigs, args.mod_code)
    result, ih, idd, _ = compare(hmm, dorado, args.min_coverage)
    if args.output is not None:
        names = {i: n for n, i in contigs.items()}
        with open(args.output, "w") as out:
            out.write("chromosome\tpos\thmm_called\thmm_methylated\thmm_frequency\tdorado_valid\tdorado_modified\t"
                      "dorado_frequency\n")
            for h, d in zip(ih.tolist(), idd.tolist()):
                out.write(f"{names[int(hmm.contig[h])]}\t{hmm.pos[h]}\t{hmm.coverage[h]}\t{hmm.modified[h]}\t"
                          f"{hmm.modified[h] / hmm.coverage[h]:.4f}\t{dorado.coverage[d]}\t{dorado.modified[d]}\t"
                          f"{dorado.modified[d] / dorado.coverage[d]:.4f}\n")
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        print(_render(result), file=sys.stdout)
    return 0


def _render(r: Comparison) -> str:
    def num(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    return "\n".join([
        f"sites: {r.hmm_sites} HMM, {r.dorado_sites} dorado, {r.sites_in_both} in both with >= {r.min_coverage} calls",
        f"correlation: Pearson {num(r.pearson)}, Spearman {num(r.spearman)}",
        f"difference (HMM - dorado): mean {num(r.mean_diff)}, mean absolute {num(r.mean_abs_diff)}, "
        f"coverage-weighted mean absolute {num(r.weighted_mean_abs_diff)}",
    ])
