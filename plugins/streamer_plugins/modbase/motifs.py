"""Motif sites on the reference (`--motif MOTIF OFFSET`, `--cpg`), with modkit 0.4.4's strand rules.

A motif is an IUPAC pattern and the offset of the base whose calls count. Its reverse-complement
pattern gives the `-` strand sites. The reference is upper-cased (modkit's default). Each site
has motif ids per strand, kept in the command line's motif order; that order names the rows
when there is more than one motif and orders rows of the same code and strand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from streamer.errors import ConfigError
from streamer.io.reference import Reference

_IUPAC = {"A": "A", "C": "C", "G": "G", "T": "T", "U": "U", "M": "[AC]", "R": "[AG]", "W": "[AT]",
          "S": "[CG]", "Y": "[CT]", "K": "[GT]", "V": "[ACG]", "H": "[ACT]", "D": "[AGT]", "B": "[CGT]",
          "X": "[ACGT]", "N": "[ACGT]"}
_RC = str.maketrans("ACGTU[]", "TGCAA][")


@dataclass(frozen=True)
class Motif:
    raw: str
    offset: int
    pattern: str
    rc_pattern: str

    @property
    def rc_offset(self) -> int:
        return len(self.raw) - self.offset - 1

    @property
    def palindrome(self) -> bool:
        return self.pattern == self.rc_pattern

    @property
    def label(self) -> str:
        return f"{self.raw},{self.offset}"

    def hits(self, seq: str) -> tuple[np.ndarray, np.ndarray]:
        """(+ strand sites, - strand sites) on `seq`, 0-based."""
        if len(self.raw) == 1 and not self.palindrome:
            arr = np.frombuffer(seq.encode(), dtype=np.uint8)
            return np.flatnonzero(arr == ord(self.raw)), np.flatnonzero(arr == ord(self.raw.translate(_RC)))
        fwd = _starts(self.pattern, seq)
        rev = fwd if self.palindrome else _starts(self.rc_pattern, seq)
        return fwd + self.offset, rev + self.rc_offset


def _starts(pattern: str, seq: str) -> np.ndarray:
    return np.fromiter((m.start() for m in re.finditer(f"(?=({pattern}))", seq)), dtype=np.int64)


def parse_motifs(raw_parts: list[list[str]] | None, cpg: bool) -> list[Motif]:
    """`--motif` pairs in order, then `CG 0` for `--cpg` unless already given."""
    pairs = [tuple(p) for p in raw_parts or []]
    if len(set(pairs)) != len(pairs):
        raise ConfigError("--motif: the same motif is given more than once")
    if cpg and ("CG", "0") not in pairs:
        pairs.append(("CG", "0"))
    motifs = []
    for raw, offset in pairs:
        if len(raw) == 1 and raw not in "ACGT":
            raise ConfigError(f"--motif {raw}: a single-base motif must be A, C, G or T")
        try:
            pattern = "".join(_IUPAC[c] for c in raw)
        except KeyError as exc:
            raise ConfigError(f"--motif {raw}: invalid IUPAC code {exc.args[0]!r}") from None
        if not offset.isdigit() or int(offset) >= len(raw):
            raise ConfigError(f"--motif {raw} {offset}: offset must be an integer inside the motif")
        motifs.append(Motif(raw, int(offset), pattern, pattern[::-1].translate(_RC)))
    return motifs


@dataclass
class MotifSites:
    """Sites of all motifs on one contig: strand bits (1 '+', 2 '-') per position, and (key, motif id) pairs.

    `keys` are position * 2 + strand (0 '+', 1 '-'), sorted, with `ids` in motif order within a key.
    """

    positions: np.ndarray
    bit_values: np.ndarray
    keys: np.ndarray
    ids: np.ndarray


def contig_sites(motifs: list[Motif], seq: str, combine_strands: bool) -> MotifSites:
    """The focus positions modkit builds for one contig from all motifs."""
    rules: list[dict[int, int]] = []
    for motif in motifs:
        rule: dict[int, int] = {}
        plus, minus = motif.hits(seq)
        for p in plus.tolist():
            rule[p] = rule.get(p, 0) | 1
        for p in minus.tolist():
            rule[p] = rule.get(p, 0) | 2
        rules.append(rule)
    single = [m.raw for m in motifs]
    pairs: list[tuple[int, int, int]] = []  # (position, strand, motif id)
    bits: dict[int, int] = {}
    if len(motifs) > 1 and not combine_strands and all(len(m) == 1 for m in single):
        # modkit's shortcut for several single-base motifs: only A and C lead
        for top, bottom in (("A", "T"), ("C", "G")):
            if top not in single:
                continue
            top_id = single.index(top)
            both = [top_id, single.index(bottom)] if bottom in single else None
            for p, r in sorted(rules[top_id].items()):
                bits[p] = 3 if both else r
                for strand in (0, 1):
                    if both:
                        pairs.extend((p, strand, i) for i in both)
                    elif r & (1 << strand):
                        pairs.append((p, strand, top_id))
    else:
        for motif_id, rule in enumerate(rules):
            for p, r in rule.items():
                bits[p] = bits.get(p, 0) | r
                if r & 1:
                    pairs.append((p, 0, motif_id))
                if r == 2 or (r == 3 and not combine_strands):
                    pairs.append((p, 1, motif_id))
    positions = np.array(sorted(bits), dtype=np.int64)
    bit_values = np.array([bits[p] for p in positions.tolist()], dtype=np.uint8)
    arr = np.array(pairs, dtype=np.int64).reshape(-1, 3)
    keys = arr[:, 0] * 2 + arr[:, 1]
    order = np.argsort(keys, kind="stable")  # ids keep the order modkit pushes them in
    return MotifSites(positions, bit_values, keys[order], arr[order, 2].astype(np.int16))


def load_reference(path, names: list[str]) -> dict[str, str]:
    """Upper-cased sequences of the named contigs that the FASTA (plain, bgzip or gzip) holds."""
    reference = Reference(path)
    try:
        present = set(reference.names)
        return {name: reference.fetch(name, 0, reference.length(name)) for name in names if name in present}
    finally:
        reference.close()
