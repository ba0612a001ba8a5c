"""The two tables `streamer compare-meth` reads, as flat arrays: meth-freq rows and bedMethyl CpGs.

Files of tens of millions of rows are read in chunks of lines; each chunk is split in one call
and its columns converted by numpy, so no Python object is kept per row. A malformed row is
found again line by line only once a chunk has failed, to name its line.

Contigs are numbered in the order first seen, in one `Contigs` shared by both files, so a site
is one int64 key: contig << 40 | position.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import numpy as np

from streamer.errors import InputError

CHUNK_BYTES = 1 << 23
POS_BITS = 40
BED_COLUMNS = 18
_BED_USED = {1: "start", 9: "Nvalid_cov", 11: "Nmod"}  # 0-based column -> name
FREQ_COLUMNS = ("chromosome", "start", "end", "num_motifs_in_group", "called_sites", "called_sites_methylated")
_GROUP_ALIASES = ("num_motifs_in_group", "num_cpgs_in_group")  # f5c's name, the older one


class Contigs(dict):
    """Contig name -> index, in the order the files name them."""

    def ids(self, names: list[str]) -> np.ndarray:
        if not names or names.count(names[0]) == len(names):  # sorted files: one contig per chunk, mostly
            return np.full(len(names), self.setdefault(names[0], len(self)) if names else 0, np.int64)
        uniq, inverse = np.unique(np.array(names, dtype=object), return_inverse=True)
        index = np.array([self.setdefault(n, len(self)) for n in uniq.tolist()], np.int64)
        return index[inverse.ravel()]

    def names(self) -> np.ndarray:
        out = np.empty(len(self), dtype=object)
        for name, i in self.items():
            out[i] = name
        return out


def site_key(contig: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return contig.astype(np.int64) << POS_BITS | pos


@dataclass(frozen=True)
class FreqRows:
    """meth-freq rows (one per CpG group, or per CpG with --split-groups), in file order."""

    contig: np.ndarray
    start: np.ndarray  # + strand C of the group's first CpG
    end: np.ndarray  # + strand C of its last
    n_cpgs: np.ndarray
    called: np.ndarray  # n_cpgs per call that passed the threshold
    methylated: np.ndarray


@dataclass(frozen=True)
class BedSites:
    """bedMethyl counts of one mod code per CpG (both strands summed), sorted by key."""

    key: np.ndarray
    valid: np.ndarray
    modified: np.ndarray


def _open(path: Path):
    try:
        return open(path)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror}") from None


def _chunks(fh, first_line: int) -> Iterator[tuple[int, list[str]]]:
    """(number of the chunk's first line, its lines)."""
    number = first_line
    while lines := fh.readlines(CHUNK_BYTES):
        yield number, lines
        number += len(lines)


def _split(path: Path, number: int, lines: list[str], n_columns: int, sep: str | None) -> list[str]:
    """The chunk's fields, row after row; a row of another width is named by its line."""
    text = "".join(lines)
    fields = text.split() if sep is None else text.replace("\n", sep).split(sep)
    if sep is not None and fields and fields[-1] == "" and text.endswith("\n"):
        fields.pop()
    if len(fields) != n_columns * len(lines):
        for i, line in enumerate(lines):
            found = len(line.split() if sep is None else line.rstrip("\n").split(sep))
            if found != n_columns:
                raise InputError(path, f"expected {n_columns} columns, found {found}", line=number + i)
    return fields


def _ints(path: Path, column: list[str], name: str, line_of) -> np.ndarray:
    """A column as int64; `line_of(i)` is the line number of its i-th value."""
    try:
        return np.array(column, dtype=np.int64)
    except (ValueError, OverflowError):
        bad = next((i for i, v in enumerate(column) if not (v.lstrip("-").isdigit() and len(v) < 19)), 0)
        raise InputError(path, f"{name} is not a whole number: {column[bad]!r}", line=int(line_of(bad))) from None


def _take(values: list[str], idx: np.ndarray) -> list[str]:
    if len(idx) == len(values):
        return values
    return [values[int(i)] for i in idx] if len(idx) < 2 else list(itemgetter(*idx.tolist())(values))


def read_freq(path: Path, contigs: Contigs) -> FreqRows:
    """A methylation frequency TSV of streamer, f5c or nanopolish (columns found by their header)."""
    parts = []
    with _open(path) as fh:
        header = fh.readline().rstrip("\n").split("\t")
        names = [_GROUP_ALIASES[0] if h in _GROUP_ALIASES else h for h in header]
        missing = [c for c in FREQ_COLUMNS if c not in names]
        if missing:
            raise InputError(path, f"not a methylation frequency TSV: no column {', '.join(missing)}", line=1)
        cols = [names.index(c) for c in FREQ_COLUMNS]
        width = len(header)
        for number, lines in _chunks(fh, 2):
            f = _split(path, number, lines, width, "\t")
            values = [_ints(path, f[c::width], name, number.__add__) for c, name in zip(cols[1:], FREQ_COLUMNS[1:])]
            parts.append((contigs.ids(f[cols[0]::width]), *values))
    arrays = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(6)]
    rows = FreqRows(*arrays)
    bad = np.flatnonzero((rows.start < 0) | (rows.end < rows.start) | (rows.n_cpgs < 1) | (rows.called < 0)
                        | (rows.methylated < 0) | (rows.methylated > rows.called))
    if len(bad):
        raise InputError(path, "inconsistent row: start <= end, num_motifs_in_group >= 1 and "
                               "0 <= called_sites_methylated <= called_sites expected", line=int(bad[0]) + 2)
    return rows


def read_bedmethyl(path: Path, contigs: Contigs, mod_code: str) -> BedSites:
    """Rows of `mod_code` (also `code,MOTIF,OFFSET`) moved to the + strand C of their CpG and summed.

    A `-` row's C is the CpG's G on the + strand, one base after the + C; `+` and combined
    (`.`) rows are at the + C already. Columns 10 and 12 (Nvalid_cov, Nmod) are the counts;
    columns 10-18 may be space-separated (`--mixed-delim`).
    """
    keys, valid, modified = [], [], []
    with _open(path) as fh:
        header = fh.readline().startswith(("#", "track", "chrom\t", "chrom "))  # `--header`, or the first row
        if not header:
            fh.seek(0)
        for number, lines in _chunks(fh, 2 if header else 1):
            f = _split(path, number, lines, BED_COLUMNS, None)
            codes = np.array(f[3::BED_COLUMNS])
            take = np.flatnonzero((codes == mod_code) | np.char.startswith(codes, mod_code + ","))
            strand = np.array(f[5::BED_COLUMNS])
            odd = np.flatnonzero(~np.isin(strand, ["+", "-", "."]))
            if len(odd):
                raise InputError(path, f"strand is not +, - or .: {str(strand[odd[0]])!r}", line=number + int(odd[0]))
            line_of = (number + take).__getitem__
            start, nvalid, nmod = (_ints(path, _take(f[c::BED_COLUMNS], take), name, line_of)
                                   for c, name in _BED_USED.items())
            pos = start - (strand[take] == "-")
            wrong = np.flatnonzero((pos < 0) | (nmod > nvalid) | (nmod < 0))
            if len(wrong):
                raise InputError(path, "negative position, or Nmod outside 0..Nvalid_cov", line=int(line_of(wrong[0])))
            keys.append(site_key(contigs.ids(_take(f[0::BED_COLUMNS], take)), pos))
            valid.append(nvalid)
            modified.append(nmod)
    return _summed(*(np.concatenate(a) if a else np.zeros(0, np.int64) for a in (keys, valid, modified)))


def _summed(key: np.ndarray, valid: np.ndarray, modified: np.ndarray) -> BedSites:
    """Rows of one key (the two strands of a CpG) added up; sites with no valid call dropped."""
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else np.zeros(0, np.int64)
    sites = BedSites(key[first], np.add.reduceat(valid[order], first) if len(key) else valid,
                     np.add.reduceat(modified[order], first) if len(key) else modified)
    keep = sites.valid > 0
    return BedSites(sites.key[keep], sites.valid[keep], sites.modified[keep])
