"""The seed-chain-extend aligner against minimap2 (mappy, map-ont) on simulated and real reads, its
SAM records shaped as minimap2's, and the mappy aligner's interface kept."""

from __future__ import annotations

import mappy
import numpy as np
import pytest

from align_seeder import KmerSeeder
from conftest import REFERENCE, SHARED, needs_shared
from streamer.align.bases import decode
from streamer.align.engine import SeedAligner
from streamer.align.genome import read_fasta, synth_genome, write_fasta
from streamer.align.records import agree, primary_of
from streamer.align.simulate import PROFILES, simulate_reads
from streamer.daemon.aligner import ReadAligner
from streamer.io.alignments import AlignmentFilter, AlignmentRecord
from streamer.skips import Skip, Skipped


def _on_truth(rec, rows) -> bool:
    return any(rec.reference_name == ctg and rec.is_reverse == (strand == "-") and
               min(rec.reference_end, end) - max(rec.reference_start, start) >
               0.5 * min(end - start, rec.reference_length) for _, _, ctg, start, end, strand, _, _ in rows)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    contigs = synth_genome(1_000_000, seed=13, contigs=2)
    path = tmp_path_factory.mktemp("genome") / "g.fa"
    write_fasta(path, contigs)
    return contigs, path


@pytest.mark.parametrize("profile", ["r9", "r10"])
def test_agrees_with_minimap2_on_simulated_reads(synthetic, profile):
    contigs, path = synthetic
    reads = simulate_reads(contigs, 120, PROFILES[profile], mean_length=3000, chimeras=0.05, seed=6)
    pairs = [(name, decode(reads.seq(i))) for i, name in enumerate(reads.names)]
    mine = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter()).records_all(pairs)
    mm = ReadAligner(path, AlignmentFilter(), threads=1)
    theirs = [mm.records(rid, seq) for rid, seq in pairs]
    truth = {}
    for row in reads.truth:
        truth.setdefault(row[0], []).append(row)
    confident = agreeing = wrong_mine = wrong_theirs = 0
    for (rid, _), a, b in zip(pairs, mine, theirs):
        pa, pb = primary_of(a), primary_of(b)
        wrong_mine += pa is not None and pa.mapping_quality >= 20 and not _on_truth(pa, truth[rid])
        wrong_theirs += pb is not None and pb.mapping_quality >= 20 and not _on_truth(pb, truth[rid])
        if pb is None or pb.mapping_quality < 20:
            continue
        confident += 1
        agreeing += pa is not None and agree(pa, pb)
    assert confident >= 100
    assert agreeing >= 0.98 * confident
    assert wrong_mine <= wrong_theirs + 1


def test_records_are_shaped_as_minimap2s(synthetic):
    contigs, _ = synthetic
    reads = simulate_reads(contigs, 40, PROFILES["r10"], mean_length=3000, chimeras=0.5, seed=12)
    pairs = [(name, decode(reads.seq(i))) for i, name in enumerate(reads.names)]
    aligner = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter(), threads=2)
    all_recs = aligner.records_all(pairs)
    assert [[r.to_string() for r in recs] for recs in all_recs[:5]] == \
        [[r.to_string() for r in aligner.records(rid, seq)] for rid, seq in pairs[:5]]
    supplementary = 0
    for (rid, seq), recs in zip(pairs, all_recs):
        first = recs[0]
        assert first.query_name == rid and not first.is_secondary and not first.is_supplementary
        assert first.query_sequence == (mappy.revcomp(seq) if first.is_reverse else seq)
        assert first.infer_read_length() == len(seq)
        assert {op for op, _ in first.cigartuples} <= {0, 1, 2, 4}
        ref = dict(contigs)[first.reference_name]
        mismatches = sum(first.query_sequence[q] != "ACGT"[ref[r]]
                         for q, r in first.get_aligned_pairs(matches_only=True))
        indels = sum(n for op, n in first.cigartuples if op in (1, 2))
        assert first.get_tag("NM") == mismatches + indels
        for rec in recs[1:]:
            assert rec.is_secondary or rec.is_supplementary
            if rec.is_supplementary:
                supplementary += 1
                assert {op for op, _ in rec.cigartuples} <= {0, 1, 2, 5}
                assert rec.infer_read_length() == len(seq) and rec.query_sequence is None
            else:
                assert rec.mapping_quality == 0
    assert supplementary >= 10


def test_unmapped_and_judged_reads(synthetic):
    contigs, _ = synthetic
    rng = np.random.default_rng(3)
    noise = "".join("ACGT"[c] for c in rng.integers(0, 4, 3000))
    reads = simulate_reads(contigs, 1, PROFILES["r10"], mean_length=3000, chimeras=0, seed=1)
    good = decode(reads.seq(0))
    aligner = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter(min_mapq=20))
    (lost,), found = aligner.align_all([("noise", noise), ("good", good)])
    assert isinstance(lost, Skipped) and lost.reason == Skip.UNMAPPED and "found no alignment" in lost.detail
    assert isinstance(found[0], AlignmentRecord) and found[0].read_id == "good"
    assert aligner.align_all([]) == []
    assert aligner.align("short", "ACGT")[0].reason == Skip.UNMAPPED


@needs_shared
def test_agrees_with_minimap2_on_the_shared_ecoli_reads():
    contigs = read_fasta(REFERENCE)
    reads = [(name, seq) for name, seq, _ in mappy.fastx_read(str(SHARED / "reads.fasta"))]
    mine = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter(), threads=2).records_all(reads)
    mm = ReadAligner(REFERENCE, AlignmentFilter(), threads=1)
    confident = agreeing = same_cigar = 0
    for (rid, seq), recs in zip(reads, mine):
        theirs = primary_of(mm.records(rid, seq))
        if theirs is None or theirs.mapping_quality < 20:
            continue
        confident += 1
        ours = primary_of(recs)
        agreeing += agree(ours, theirs)
        same_cigar += ours.reference_start == theirs.reference_start and ours.cigartuples == theirs.cigartuples
    assert confident >= 100 and agreeing == confident
    assert same_cigar >= 0.85 * confident  # the same scores and gap placement: most CIGARs are minimap2's own
