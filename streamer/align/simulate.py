"""ONT-like reads simulated from a reference, with where each came from written down, for alignment
tests and benchmarks; and the command line that makes a synthetic genome and reads from it:

    python -m streamer.align.simulate genome --size 200M -o genome.fa
    python -m streamer.align.simulate reads -g genome.fa -n 10000 --profile r9 -o reads.fq

Reads are slices of the reference from either strand, lengths log-normal around a mean, with
errors drawn per base at the rates of an `ErrorProfile` (indels extended as in
`genome.INDEL_EXTEND`, mean 1.4 bases, so the share of erroneous bases is sub + 1.4 (ins + del)):

- "r9"  (R9.4.1-like): substitutions 4.0%, insertions 1.5%, deletions 2.5% per base -> ~9.6% of bases;
- "r10" (R10.4.1-like): substitutions 1.2%, insertions 0.5%, deletions 0.8% per base -> ~3.0% of bases.

A share of reads are chimeras of two independent slices. The truth is a TSV beside the reads: a
row per slice (read_id, part, contig, start, end, strand, read_start, read_end; 0-based half-open,
read coordinates on the read as written).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from streamer.align.bases import LETTERS, revcomp
from streamer.errors import InputError
from streamer.align.genome import INDEL_EXTEND, mutate, read_fasta, seed_bases, synth_genome, write_fasta

TRUTH_COLUMNS = ("read_id", "part", "contig", "start", "end", "strand", "read_start", "read_end")


@dataclass(frozen=True)
class ErrorProfile:
    """Per-base odds of a substitution, of an insertion and of a deletion starting."""

    name: str
    sub: float
    ins: float
    dele: float

    @property
    def error_rate(self) -> float:
        """The expected share of erroneous bases."""
        return self.sub + (self.ins + self.dele) / (1 - INDEL_EXTEND)


PROFILES = {"r9": ErrorProfile("r9", 0.040, 0.015, 0.025), "r10": ErrorProfile("r10", 0.012, 0.005, 0.008)}


@dataclass(frozen=True)
class Reads:
    """Simulated reads as base codes laid end to end, and their truth rows."""

    names: list[str]
    codes: np.ndarray  # uint8
    offsets: np.ndarray  # int64[n + 1]
    truth: list[tuple]  # TRUTH_COLUMNS

    def seq(self, i: int) -> np.ndarray:
        return self.codes[self.offsets[i]:self.offsets[i + 1]]


@numba.njit(nogil=True, cache=True)
def _draw(genome: np.ndarray, start: np.ndarray, length: np.ndarray, rc: np.ndarray, sub: float, ins: float,
          dele: float, out: np.ndarray, out_off: np.ndarray, written: np.ndarray) -> None:
    """Each slice, reverse-complemented where `rc`, copied with errors into `out[out_off[k]:]`."""
    for k in range(len(start)):
        piece = genome[start[k]:start[k] + length[k]]
        if rc[k]:
            piece = revcomp(piece)
        written[k] = mutate(piece, sub, ins, dele, out[out_off[k]:out_off[k + 1]])


def simulate_reads(contigs: list[tuple[str, np.ndarray]], n: int, profile: ErrorProfile, *, mean_length: int = 8000,
                   min_length: int = 300, chimeras: float = 0.02, seed: int = 1, prefix: str = "") -> Reads:
    """`n` reads; lengths log-normal (sigma 0.7) with this mean, clipped to [min_length, the contig]."""
    rng = np.random.default_rng(seed)
    seed_bases(int(rng.integers(2**31)))
    lengths = np.array([len(c) for _, c in contigs], dtype=np.int64)
    if lengths.max() < min_length:
        raise ValueError(f"no contig as long as {min_length} bases")
    sigma = 0.7
    want = np.exp(rng.normal(math.log(mean_length) - sigma**2 / 2, sigma, n)).astype(np.int64)
    want = np.maximum(want, min_length)
    parts = np.where(rng.random(n) < chimeras, 2, 1)
    seg_read = np.repeat(np.arange(n), parts)
    seg_part = np.concatenate([np.arange(p) for p in parts]) if n else np.zeros(0, np.int64)
    seg_len = np.maximum(want[seg_read] // parts[seg_read], min_length // 2)
    ctg = rng.choice(len(contigs), size=len(seg_read), p=lengths / lengths.sum())
    seg_len = np.minimum(seg_len, lengths[ctg])
    start = (rng.random(len(seg_read)) * (lengths[ctg] - seg_len + 1)).astype(np.int64)
    rc = rng.random(len(seg_read)) < 0.5
    genome = np.concatenate([c for _, c in contigs])
    ctg_off = np.concatenate([[0], np.cumsum(lengths)])
    room = seg_len + seg_len // 2 + 16
    out_off = np.concatenate([[0], np.cumsum(room)])
    out = np.empty(out_off[-1], dtype=np.uint8)
    written = np.zeros(len(seg_read), dtype=np.int64)
    _draw(genome, ctg_off[ctg] + start, seg_len, rc, profile.sub, profile.ins, profile.dele, out, out_off, written)
    keep = np.concatenate([np.arange(out_off[k], out_off[k] + written[k]) for k in range(len(seg_read))]) \
        if len(seg_read) else np.zeros(0, np.int64)
    seg_pos = np.concatenate([[0], np.cumsum(written)])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.add.at(offsets, seg_read + 1, written)
    offsets = np.cumsum(offsets)
    names = [f"{prefix}{profile.name}_{i:07d}" for i in range(n)]
    truth = [(names[r], int(p), contigs[c][0], int(s), int(s + ln), "-" if neg else "+",
              int(seg_pos[k] - offsets[r]), int(seg_pos[k + 1] - offsets[r]))
             for k, (r, p, c, s, ln, neg) in enumerate(zip(seg_read, seg_part, ctg, start, seg_len, rc))]
    return Reads(names, out[keep], offsets, truth)


def write_fastq(path: Path, reads: Reads, profile: ErrorProfile) -> None:
    """FASTQ whose qualities all say the profile's error rate."""
    q = chr(33 + min(60, round(-10 * math.log10(profile.error_rate))))
    with open(path, "w") as fh:
        for i, name in enumerate(reads.names):
            seq = LETTERS[reads.seq(i)].tobytes().decode()
            fh.write(f"@{name}\n{seq}\n+\n{q * len(seq)}\n")


def write_truth(path: Path, reads: Reads) -> None:
    with open(path, "w") as fh:
        fh.write("\t".join(TRUTH_COLUMNS) + "\n")
        fh.writelines("\t".join(map(str, row)) + "\n" for row in reads.truth)


def read_truth(path: Path) -> dict[str, list[tuple]]:
    """Truth rows by read id, as written by `write_truth` (numbers as ints)."""
    out: dict[str, list[tuple]] = {}
    with open(path) as fh:
        next(fh)
        for line in fh:
            rid, part, ctg, start, end, strand, rs, re_ = line.rstrip("\n").split("\t")
            out.setdefault(rid, []).append((rid, int(part), ctg, int(start), int(end), strand, int(rs), int(re_)))
    return out


def bases(text: str) -> int:
    """A count of bases written 200M, 1.5G, 50k or 1000 (decimal multiples: bases, not bytes)."""
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(text[-1:].lower(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of bases: {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m streamer.align.simulate", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("genome", help="a synthetic genome with realistic repeats, as FASTA")
    g.add_argument("--size", type=bases, default=bases("200M"), help="bases in all [200M]")
    g.add_argument("--contigs", type=int, help="number of contigs [one per ~25 Mb]")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("-o", "--output", type=Path, required=True)
    r = sub.add_parser("reads", help="ONT-like reads from a reference, as FASTQ, with a truth TSV")
    r.add_argument("-g", "--genome", type=Path, required=True)
    r.add_argument("-n", "--number", type=int, default=10_000)
    r.add_argument("--profile", choices=sorted(PROFILES), default="r9")
    r.add_argument("--mean-length", type=int, default=8000)
    r.add_argument("--chimeras", type=float, default=0.02, help="share of reads joined from two slices [0.02]")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("-o", "--output", type=Path, required=True)
    r.add_argument("--truth", type=Path, help="truth TSV [OUTPUT with .truth.tsv]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.what == "genome":
        write_fasta(args.output, synth_genome(args.size, seed=args.seed, contigs=args.contigs))
        return 0
    try:
        contigs = read_fasta(args.genome)
    except InputError as exc:
        print(exc, file=sys.stderr)
        return 1
    profile = PROFILES[args.profile]
    reads = simulate_reads(contigs, args.number, profile, mean_length=args.mean_length, chimeras=args.chimeras,
                           seed=args.seed)
    write_fastq(args.output, reads, profile)
    write_truth(args.truth or args.output.with_suffix(".truth.tsv"), reads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
