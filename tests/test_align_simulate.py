"""The synthetic genome and the read simulator: deterministic, repetitive where they should be, and
reads that minimap2 puts where the truth says, with the stated error rates."""

from __future__ import annotations

import mappy
import numpy as np
import pytest

from streamer.align.bases import decode, encode, revcomp
from streamer.align.genome import Recipe, read_fasta, synth_genome, write_fasta
from streamer.align.simulate import PROFILES, main, read_truth, simulate_reads

NO_REPEATS = Recipe(sine=0, line=0, dna=0, micro=0, satellite=0, segdup=0)


def _repeated_kmer_share(codes: np.ndarray, k: int = 16) -> float:
    """Share of k-mer positions whose k-mer occurs more than once (either strand not folded)."""
    packed = np.zeros(len(codes) - k + 1, dtype=np.uint64)
    for i in range(k):
        packed = (packed << np.uint64(2)) | codes[i:len(codes) - k + 1 + i].astype(np.uint64)
    _, inverse, counts = np.unique(packed, return_inverse=True, return_counts=True)
    return float(np.mean(counts[inverse] > 1))


@pytest.fixture(scope="module")
def genome():
    return synth_genome(1_000_000, seed=7, contigs=2)


def test_genome_is_deterministic_and_sized(genome):
    again = synth_genome(1_000_000, seed=7, contigs=2)
    assert [n for n, _ in genome] == ["chr1", "chr2"]
    assert sum(len(c) for _, c in genome) == 1_000_000
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(genome, again))
    other = synth_genome(1_000_000, seed=8, contigs=2)
    assert not np.array_equal(genome[0][1][:1000], other[0][1][:1000])


def test_genome_composition_and_repeats(genome):
    codes = np.concatenate([c for _, c in genome])
    assert codes.max() <= 3
    gc = np.isin(codes, (1, 2)).mean()
    assert 0.38 < gc < 0.46
    cpg = np.mean((codes[:-1] == 1) & (codes[1:] == 2)) / ((codes == 1).mean() * (codes == 2).mean())
    assert cpg < 0.6  # CpG depleted
    plain = synth_genome(1_000_000, seed=7, contigs=2, recipe=NO_REPEATS)[0][1]
    assert _repeated_kmer_share(plain) < 0.002
    assert _repeated_kmer_share(genome[0][1]) > 0.02  # copies 5-20% diverged still share exact 16-mers


def test_fasta_round_trip(genome, tmp_path):
    path = tmp_path / "g.fa"
    write_fasta(path, genome)
    back = read_fasta(path)
    assert [n for n, _ in back] == ["chr1", "chr2"]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(genome, back))


def test_bases_round_trip():
    codes = encode("ACGTNacgt")
    assert list(codes) == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert decode(revcomp(codes)) == "ACGTNACGT"


@pytest.mark.parametrize("name, identity", [("r9", (0.88, 0.93)), ("r10", (0.955, 0.985))])
def test_reads_land_where_the_truth_says(genome, tmp_path, name, identity):
    write_fasta(tmp_path / "g.fa", genome)
    aligner = mappy.Aligner(str(tmp_path / "g.fa"), preset="map-ont")
    reads = simulate_reads(genome, 150, PROFILES[name], mean_length=3000, chimeras=0.1, seed=5)
    assert len(reads.names) == 150 and reads.offsets[-1] == len(reads.codes)
    placed, idents, chimeric = 0, [], 0
    for i, rid in enumerate(reads.names):
        parts = [t for t in reads.truth if t[0] == rid]
        assert parts[0][6] == 0 and parts[-1][7] == reads.offsets[i + 1] - reads.offsets[i]
        if len(parts) > 1:
            chimeric += 1
            assert parts[0][7] == parts[1][6]
            continue
        _, _, ctg, start, end, strand, _, _ = parts[0]
        hit = next((h for h in aligner.map(decode(reads.seq(i))) if h.is_primary), None)
        if hit is None:
            continue
        idents.append(1 - hit.NM / hit.blen)
        overlap = min(hit.r_en, end) - max(hit.r_st, start)
        placed += hit.ctg == ctg and (hit.strand > 0) == (strand == "+") and overlap > 0.9 * (end - start)
    assert chimeric > 5
    assert placed >= 0.9 * (150 - chimeric)
    assert identity[0] < np.mean(idents) < identity[1]


def test_command_line(tmp_path):
    genome, reads = tmp_path / "g.fa", tmp_path / "r.fq"
    assert main(["genome", "--size", "50k", "--contigs", "2", "--seed", "3", "-o", str(genome)]) == 0
    assert main(["reads", "-g", str(genome), "-n", "20", "--profile", "r10", "--mean-length", "2000",
                 "-o", str(reads)]) == 0
    truth = read_truth(tmp_path / "r.truth.tsv")
    names = [name for name, _, _ in mappy.fastx_read(str(reads))]
    assert names == sorted(truth) and len(names) == 20
    assert all(row[2] in ("chr1", "chr2") and row[5] in "+-" for rows in truth.values() for row in rows)
