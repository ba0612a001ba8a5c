"""A synthetic genome with the repeats that make read placement hard, for alignment benchmarks at a
scale (>= 200 Mb) where no large real genome can be fetched.

The background is an order-1 Markov chain with a genome-wide GC content and CpG depleted as in
mammals. Repeats are written over it, in this order (each class's share of the genome is a field of
`Recipe`; later classes overwrite earlier ones, so the shares are approximate):

- interspersed families, each copy on a random strand and diverged from its family's consensus by
  5-20% (85% substitutions, the rest short insertions and deletions): SINE-like (~300 bp with an
  A-rich tail), LINE-like (6 kb, most copies 5'-truncated to ~1 kb), DNA-transposon-like
  (1.5-3 kb between terminal inverted repeats);
- tandem repeats: microsatellites (units of 1-6 bp, arrays of 20-300 bp) and satellites (units of
  20-250 bp, arrays of 5-60 kb), copies 1-10% diverged;
- segmental duplications: 10-100 kb stretches of the genome as made so far, copied elsewhere 1-5%
  diverged.

Everything is drawn from one seed (numpy's generator for the layout, numba's for the bases, seeded
from it), so a seed and a recipe give the same genome byte for byte; 200 Mb take about a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from streamer.align.bases import LETTERS, encode
from streamer.io.reference import Reference

INDEL_EXTEND = 0.3  # an indel of the simulated kinds goes on one more base with this odds (mean 1.4 bases)


@dataclass(frozen=True)
class Recipe:
    """What a synthetic genome is made of: shares of the genome per repeat class."""

    gc: float = 0.41
    cpg_odds: float = 0.25  # CpG observed/expected, as in mammalian genomes
    sine: float = 0.10  # short interspersed elements (Alu-like, about 300 bases)
    line: float = 0.15  # long interspersed elements (L1-like, kilobases, mostly truncated)
    dna: float = 0.04  # DNA transposons
    micro: float = 0.01  # microsatellites (short tandem repeats)
    satellite: float = 0.02  # satellite arrays (long tandem repeats of longer units)
    segdup: float = 0.04  # segmental duplications (long near-identical copies)


@numba.njit(nogil=True, cache=True)
def seed_bases(seed: int) -> None:
    """Seed numba's generator, which draws every base (per thread: call from the drawing thread)."""
    np.random.seed(seed)


@numba.njit(nogil=True, cache=True)
def mutate(src: np.ndarray, sub: float, ins: float, dele: float, out: np.ndarray) -> int:
    """Copy `src` into `out` with substitutions, insertions and deletions at these per-base odds
    (indels extended by INDEL_EXTEND); returns the length written (stops when `out` is full)."""
    n = 0
    i = 0
    while i < len(src) and n < len(out):
        r = np.random.random()
        if r < dele:
            i += 1
            while i < len(src) and np.random.random() < INDEL_EXTEND:
                i += 1
            continue
        if r < dele + ins:
            out[n] = np.random.randint(4)
            n += 1
            while n < len(out) and np.random.random() < INDEL_EXTEND:
                out[n] = np.random.randint(4)
                n += 1
            if n == len(out):
                break
        b = src[i]
        if dele + ins <= r < dele + ins + sub and b < 4:
            b = (b + 1 + np.random.randint(3)) % 4
        out[n] = b
        n += 1
        i += 1
    return n


@numba.njit(nogil=True, cache=True)
def _markov(n: int, cum: np.ndarray) -> np.ndarray:
    """n bases of the order-1 chain with cumulative transition rows `cum` (4 x 4)."""
    out = np.empty(n, dtype=np.uint8)
    b = np.random.randint(4)
    for i in range(n):
        r = np.random.random()
        nb = 0
        while nb < 3 and r >= cum[b, nb]:
            nb += 1
        out[i] = nb
        b = nb
    return out


@numba.njit(nogil=True, cache=True)
def _overlay(genome: np.ndarray, pool: np.ndarray, src: np.ndarray, length: np.ndarray, dst: np.ndarray,
             rc: np.ndarray, div: np.ndarray) -> None:
    """Write diverged copies of `pool[src:src+length]` (reverse-complemented where `rc`) over the genome
    at `dst`; `pool` may be the genome itself (each piece is copied out before it is written)."""
    for k in range(len(src)):
        piece = pool[src[k]:src[k] + length[k]].copy()
        if rc[k]:
            piece = piece[::-1].copy()
            for i in range(len(piece)):
                piece[i] = 3 - piece[i] if piece[i] < 4 else piece[i]
        out = np.empty(len(piece) + len(piece) // 2 + 16, dtype=np.uint8)
        d = div[k]
        m = mutate(piece, 0.85 * d, 0.075 * d, 0.075 * d, out)
        m = min(m, len(genome) - dst[k])
        genome[dst[k]:dst[k] + m] = out[:m]


@numba.njit(nogil=True, cache=True)
def _tandem(genome: np.ndarray, dst: np.ndarray, unit: np.ndarray, length: np.ndarray, div: np.ndarray) -> None:
    """Write tandem arrays (a random unit repeated to `length`, then diverged) over the genome at `dst`."""
    for k in range(len(dst)):
        u = np.empty(unit[k], dtype=np.uint8)
        for i in range(unit[k]):
            u[i] = np.random.randint(4)
        arr = np.empty(length[k], dtype=np.uint8)
        for i in range(length[k]):
            arr[i] = u[i % unit[k]]
        out = np.empty(length[k] + length[k] // 2 + 16, dtype=np.uint8)
        d = div[k]
        m = min(mutate(arr, 0.85 * d, 0.075 * d, 0.075 * d, out), len(genome) - dst[k])
        genome[dst[k]:dst[k] + m] = out[:m]


def _transitions(recipe: Recipe) -> np.ndarray:
    at, gc = (1 - recipe.gc) / 2, recipe.gc / 2
    t = np.tile([at, gc, gc, at], (4, 1))
    t[1, 2] *= recipe.cpg_odds
    t /= t.sum(axis=1, keepdims=True)
    return np.cumsum(t, axis=1)


def _families(rng: np.random.Generator, cum: np.ndarray, lengths: np.ndarray, kind: str) -> np.ndarray:
    """Consensus sequences of one class laid end to end (each `lengths[i]` long)."""
    pool = _markov(int(lengths.sum()), cum)
    ends = np.cumsum(lengths)
    for start, end in zip(ends - lengths, ends):
        if kind == "sine":  # an A-rich tail
            tail = int(rng.integers(15, 30))
            pool[end - tail:end] = np.where(rng.random(tail) < 0.85, 0, pool[end - tail:end])
        elif kind == "dna":  # terminal inverted repeats
            tir = int(rng.integers(20, 40))
            pool[end - tir:end] = 3 - pool[start:start + tir][::-1]
    return pool


def _interspersed(rng, genome, cum, share: float, kind: str) -> None:
    size = len(genome)
    fam_len = {"sine": rng.integers(280, 330, 6), "line": rng.integers(5800, 6400, 4),
               "dna": rng.integers(1500, 3000, 8)}[kind]
    pool = _families(rng, cum, fam_len, kind)
    starts = np.cumsum(fam_len) - fam_len
    mean_copy = {"sine": 300, "line": 1100, "dna": 1800}[kind]
    n = int(share * size / mean_copy)
    fam = rng.integers(0, len(fam_len), n)
    full = fam_len[fam]
    if kind == "line":  # mostly 5'-truncated: the copy is the consensus's 3' end
        length = np.minimum(full, (rng.exponential(900, n) + 100).astype(np.int64))
    else:
        length = np.where(rng.random(n) < 0.8, full, rng.integers(50, full + 1))
    src = starts[fam] + full - length
    _overlay(genome, pool, src, length, rng.integers(0, size - length), rng.random(n) < 0.5,
             rng.uniform(0.05, 0.20, n))


def _tandems(rng, genome, share: float, units: tuple[int, int], arrays: tuple[int, int]) -> None:
    n = int(share * len(genome) / (sum(arrays) / 2))
    length = rng.integers(*arrays, n)
    _tandem(genome, rng.integers(0, len(genome) - length), rng.integers(*units, n), length,
            rng.uniform(0.01, 0.10, n))


def _segdups(rng, genome, share: float) -> None:
    length = np.exp(rng.uniform(np.log(10_000), np.log(100_000), max(1, int(share * len(genome) / 40_000))))
    length = np.minimum(length.astype(np.int64), len(genome) // 4)
    n = len(length)
    _overlay(genome, genome, rng.integers(0, len(genome) - length), length, rng.integers(0, len(genome) - length),
             rng.random(n) < 0.5, rng.uniform(0.01, 0.05, n))


def synth_genome(size: int, *, seed: int = 1, contigs: int | None = None,
                 recipe: Recipe = Recipe()) -> list[tuple[str, np.ndarray]]:
    """(name, base codes) of each contig of a synthetic genome of `size` bases in all; by default one
    contig per ~25 Mb (at least one), of unequal lengths."""
    if size < 10_000:
        raise ValueError(f"a synthetic genome needs at least 10,000 bases, not {size}")
    rng = np.random.default_rng(seed)
    seed_bases(int(rng.integers(2**31)))
    cum = _transitions(recipe)
    genome = _markov(size, cum)
    for kind in ("line", "dna", "sine"):
        _interspersed(rng, genome, cum, getattr(recipe, kind), kind)
    _tandems(rng, genome, recipe.micro, (1, 7), (20, 300))
    _tandems(rng, genome, recipe.satellite, (20, 251), (5_000, 60_000) if size >= 10_000_000 else (500, 3_000))
    _segdups(rng, genome, recipe.segdup)
    n = contigs or max(1, round(size / 25e6))
    weights = rng.uniform(0.5, 1.5, n)
    cuts = np.concatenate([[0], np.round(np.cumsum(weights) / weights.sum() * size).astype(np.int64)])
    return [(f"chr{i + 1}", genome[cuts[i]:cuts[i + 1]]) for i in range(n)]


def write_fasta(path: Path, contigs: list[tuple[str, np.ndarray]], width: int = 80) -> None:
    """FASTA with `width` bases a line."""
    with open(path, "wb") as fh:
        for name, codes in contigs:
            fh.write(b">" + name.encode() + b"\n")
            text = LETTERS[codes]
            full = len(text) // width * width
            block = np.empty((full // width, width + 1), dtype=np.uint8)
            block[:, :width] = text[:full].reshape(-1, width)
            block[:, width] = ord("\n")
            fh.write(block.tobytes())
            if full < len(text):
                fh.write(text[full:].tobytes() + b"\n")


def read_fasta(path: Path) -> list[tuple[str, np.ndarray]]:
    """(name, base codes) of each contig of a FASTA (plain, bgzip or gzip)."""
    ref = Reference(path)
    try:
        return [(name, encode(ref.fetch(name, 0, ref.length(name)))) for name in ref.names]
    finally:
        ref.close()
