"""Seeding: every super-maximal exact match of at least min_len bases, at every occurrence (up to
max_occ), on both strands, against a brute-force search of small random references with repeats and
N runs; the seeds' order; and reads of the E. coli reference."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.align import fmindex as F
from streamer.align.seeds import both_strands, find_seeds

from conftest import REFERENCE

COMP = bytes.maketrans(b"ACGT", b"TGCA")


def random_reference(rng, n_contigs=3, length=1500) -> list[tuple[str, bytes]]:
    contigs = []
    for c in range(n_contigs):
        seq = bytearray(rng.choice(np.frombuffer(b"ACGT", np.uint8), length).tobytes())
        seq[300:500] = seq[0:200]  # exact copies, one diverged
        seq[900:1100] = bytes(b if rng.random() > 0.05 else ord("A") for b in seq[0:200])
        seq[600:620] = b"N" * 20
        seq[700:760] = b"CA" * 30
        contigs.append((f"c{c}", bytes(seq)))
    return contigs


def simulated_reads(rng, contigs, n_reads=30) -> list[bytes]:
    """Slices of either strand with 5% errors, random reads, and reads with N in them."""
    reads = []
    for i in range(n_reads):
        seq = contigs[int(rng.integers(len(contigs)))][1]
        a = int(rng.integers(0, len(seq) - 50))
        read = bytearray(seq[a : a + int(rng.integers(20, 400))])
        for j in range(len(read)):
            if rng.random() < 0.05:
                read[j] = int(rng.choice(np.frombuffer(b"ACGT", np.uint8)))
        if i % 2:
            read = bytearray(bytes(read)[::-1].translate(COMP))
        if i % 7 == 3:
            read[len(read) // 2] = ord("N")
        reads.append(bytes(read))
    reads += [rng.choice(np.frombuffer(b"ACGT", np.uint8), 100).tobytes(), b"", b"ACG", b"N" * 30]
    return reads


def brute_force(contigs, reads, min_len, max_occ) -> list[tuple[int, int, int, int, bool]]:
    """Every seed by plain substring search, in the Seeds record's order."""
    offsets = np.cumsum([0] + [len(s) for _, s in contigs])
    segments = []  # (bases, where they start in the contigs end to end)
    for (_, seq), off in zip(contigs, offsets):
        for part in __import__("re").finditer(rb"[ACGT]+", seq.upper()):
            segments.append((part.group(), int(off) + part.start()))

    def occurrences(s: bytes) -> list[int]:
        found = []
        for bases, at in segments:
            i = bases.find(s)
            while i >= 0:
                found.append(at + i)
                i = bases.find(s, i + 1)
        return found

    seeds = []
    for r, read in enumerate(reads):
        for rc, q in ((False, read), (True, read[::-1].translate(COMP))):
            m = len(q)
            start = {}  # the longest match ending at each e: its start
            for e in range(1, m + 1):
                s = e
                while s > 0 and occurrences(q[s - 1 : e]):
                    s -= 1
                start[e] = s
            for e in range(1, m + 1):
                s = start[e]
                if e - s >= min_len and (e == m or start[e + 1] > s):
                    hits = occurrences(q[s:e])
                    if len(hits) <= max_occ:
                        seeds += [(r, rc, p - s, s, p, e - s) for p in hits]
    seeds.sort()
    return [(r, s, p, n, rc) for r, rc, _, s, p, n in seeds]


def as_tuples(seeds) -> list[tuple[int, int, int, int, bool]]:
    return list(zip(seeds.read.tolist(), seeds.qpos.tolist(), seeds.rpos.tolist(), seeds.length.tolist(),
                    seeds.rc.tolist()))  # fmt: skip


def pack(reads: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(reads) + 1, np.int64)
    np.cumsum([len(r) for r in reads], out=offsets[1:])
    return F.encode(b"".join(reads)), offsets


@pytest.mark.parametrize("seed, min_len, max_occ, kmer_len", [(0, 12, 500, 3), (1, 15, 2, 5), (2, 9, 4, 8),
                                                              (3, 20, 500, 10)])  # fmt: skip
def test_seeds_are_every_smem_at_every_occurrence(seed, min_len, max_occ, kmer_len):
    rng = np.random.default_rng(seed)
    contigs = random_reference(rng)
    reads = simulated_reads(rng, contigs)
    index = F.build_index(F.reference_text(contigs), kmer_len=kmer_len)
    codes, offsets = pack(reads)
    seeds = find_seeds(index, codes, offsets, min_len=min_len, max_occ=max_occ, chunk_ends=997)
    expected = brute_force(contigs, reads, min_len, max_occ)
    assert len(expected) > 100
    assert as_tuples(seeds) == expected
    assert seeds.read.dtype == np.int32 and seeds.rpos.dtype == np.int64 and seeds.rc.dtype == np.bool_


def test_both_strands():
    codes, offsets = pack([b"ACCGN", b"", b"GT"])
    q, job_off = both_strands(codes, offsets)
    assert job_off.tolist() == [0, 5, 10, 10, 10, 12, 14]
    assert q.tobytes() == bytes([0, 1, 1, 2, 4, 4, 1, 2, 2, 3, 2, 3, 0, 1])


def test_no_reads_and_bad_options():
    index = F.build_index(F.reference_text([("a", "ACGTTGCA" * 10)]))
    assert len(find_seeds(index, np.zeros(0, np.uint8), np.zeros(1, np.int64))) == 0
    with pytest.raises(ValueError, match="min_len"):
        find_seeds(index, np.zeros(0, np.uint8), np.zeros(1, np.int64), min_len=0)


def test_reads_of_the_ecoli_reference(tmp_path):
    """Slices of the genome on either strand, exact: one seed each, the whole read at its place."""
    dst = tmp_path / REFERENCE.name
    dst.write_bytes(REFERENCE.read_bytes())
    index = F.load_or_build(dst)
    genome = F.fasta_text(dst).codes[:-1]
    rng = np.random.default_rng(11)
    starts = rng.integers(0, len(genome) - 2000, 40)
    reads = [genome[a : a + 1000] for a in starts]
    reads = [r if i % 2 == 0 else (3 - r)[::-1] for i, r in enumerate(reads)]
    offsets = np.arange(0, 1001 * len(reads), 1000)[: len(reads) + 1]
    seeds = find_seeds(index, np.concatenate(reads), offsets)
    whole = seeds.length == 1000
    assert whole.sum() == 40
    assert seeds.rpos[whole].tolist() == starts.tolist()
    assert seeds.rc[whole].tolist() == [i % 2 == 1 for i in range(40)]
