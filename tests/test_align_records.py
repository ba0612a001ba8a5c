"""SAM records of a batch's alignments, written as text in one pass: byte for byte the records that pysam's
setters make one field at a time from the same alignments (the plainest statement of minimap2's record),
for the engine's flat arrays and for mappy's hits, with lower-case and ambiguous bases in the reads."""

from __future__ import annotations

import mappy
import numpy as np
import pysam
import pytest

from align_seeder import KmerSeeder
from streamer.align.bases import decode
from streamer.align.engine import SeedAligner
from streamer.align.genome import synth_genome, write_fasta
from streamer.align.records import Hit, Texts, hit_arrays, sam_records
from streamer.align.simulate import PROFILES, simulate_reads
from streamer.io.alignments import AlignmentFilter

_COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


def _plain(header: pysam.AlignmentHeader, read_id: str, seq: str, hits) -> list[pysam.AlignedSegment]:
    """One read's records made field by field."""
    out, primary_seen = [], False
    for hit in hits:
        rec = pysam.AlignedSegment(header)
        rec.query_name = read_id
        rec.reference_id = header.get_tid(hit.ctg)
        rec.reference_start = hit.r_st
        rec.mapping_quality = hit.mapq if hit.is_primary else 0
        reverse = hit.strand < 0
        supplementary = hit.is_primary and primary_seen
        primary_seen = primary_seen or hit.is_primary
        rec.flag = (16 if reverse else 0) | (0 if hit.is_primary else 256) | (2048 if supplementary else 0)
        lead, trail = (len(seq) - hit.q_en, hit.q_st) if reverse else (hit.q_st, len(seq) - hit.q_en)
        clip = 5 if supplementary else 4
        rec.cigartuples = ([(clip, lead)] if lead else []) + [(op, n) for n, op in hit.cigar] + \
            ([(clip, trail)] if trail else [])
        rec.set_tag("NM", hit.NM, "i")
        if hit.is_primary and not supplementary:
            rec.query_sequence = seq.translate(_COMPLEMENT)[::-1] if reverse else seq
        out.append(rec)
    return out


def _bam_bytes(path, header, records) -> bytes:
    with pysam.AlignmentFile(str(path), "wbu", header=header) as bam:
        for rec in records:
            bam.write(rec)
    return path.read_bytes()


@pytest.fixture(scope="module")
def batch():
    contigs = synth_genome(400_000, seed=21, contigs=3)
    rng = np.random.default_rng(5)
    copy = contigs[0][1][20_000:80_000].copy()  # a repeat, for secondaries
    copy[rng.integers(0, len(copy), 300)] = rng.integers(0, 4, 300)
    contigs.append(("repeat", copy))
    reads = simulate_reads(contigs, 60, PROFILES["r9"], mean_length=2500, chimeras=0.5, seed=4)
    pairs = [(name, decode(reads.seq(i))) for i, name in enumerate(reads.names)]
    # lower case, an ambiguous base kept as it is (not complemented) and an N, as basecalls may hold them
    pairs[1] = (pairs[1][0], pairs[1][1].lower())
    pairs[2] = (pairs[2][0], pairs[2][1][:500] + "RN" + pairs[2][1][502:])
    pairs.append(("unmapped", "ACGT" * 50))
    return contigs, pairs


def test_the_engines_records_are_those_made_field_by_field(batch, tmp_path):
    contigs, pairs = batch
    aligner = SeedAligner(contigs, KmerSeeder.of(contigs, k=15), AlignmentFilter(), threads=2)
    placed = aligner.placed(Texts.of([seq for _, seq in pairs]))
    hits = [[] for _ in pairs]
    for i, read in enumerate(placed.read.tolist()):
        cig = placed.cigar[placed.cigar_start[i]:placed.cigar_end[i]]
        hits[read].append(Hit(aligner.header.get_reference_name(int(placed.contig[i])), int(placed.r_st[i]), 0,
                              int(placed.q_st[i]), int(placed.q_en[i]), -1 if placed.reverse[i] else 1,
                              int(placed.mapq[i]), bool(placed.is_primary[i]), [(n, op) for op, n in cig.tolist()],
                              int(placed.nm[i])))  # fmt: skip
    mine = aligner.records_all(pairs)
    plain = [_plain(aligner.header, rid, seq, h) for (rid, seq), h in zip(pairs, hits)]
    assert [len(r) for r in mine] == [len(r) for r in plain] and mine[-1] == []
    flags = {rec.flag & 0x900 for recs in mine for rec in recs}
    assert flags == {0, 256, 2048} and any(rec.is_reverse for recs in mine for rec in recs)
    assert mine[1][0].query_sequence == plain[1][0].query_sequence
    assert "R" in (mine[2][0].query_sequence or "")
    header = aligner.header
    assert _bam_bytes(tmp_path / "mine.bam", header, [r for recs in mine for r in recs]) == \
        _bam_bytes(tmp_path / "plain.bam", header, [r for recs in plain for r in recs])
    assert [r.to_string() for recs in mine for r in recs] == [r.to_string() for recs in plain for r in recs]


def test_mappys_records_are_those_made_field_by_field(batch, tmp_path):
    contigs, pairs = batch
    write_fasta(tmp_path / "g.fa", contigs)
    aligner = mappy.Aligner(str(tmp_path / "g.fa"), preset="map-ont")
    header = pysam.AlignmentHeader.from_references([n for n, _ in contigs], [len(c) for _, c in contigs])
    hits = [list(aligner.map(seq)) for _, seq in pairs]
    mine = [r for recs in sam_records(header, pairs, [hit_arrays(header, h) for h in hits]) for r in recs]
    plain = [r for (rid, seq), h in zip(pairs, hits) for r in _plain(header, rid, seq, h)]
    assert len(mine) > len(pairs) and any(r.is_supplementary for r in mine)
    assert _bam_bytes(tmp_path / "mine.bam", header, mine) == _bam_bytes(tmp_path / "plain.bam", header, plain)
