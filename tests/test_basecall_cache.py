"""Reading basecall files into reads, holding them in bounded memory, and aligning with mappy."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pysam
import pytest

from streamer.daemon.aligner import ReadAligner
from streamer.errors import InputError
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
from streamer.daemon.basecall_cache import BasecallCache, ReadBasecalls, Wanted, read_basecall_file
from streamer.skips import Skip, Skipped

from daemon_support import no_leaks  # noqa: F401

SUPPLEMENTARY_READ = "71408c92"


def fasta(ecoli) -> dict[str, str]:
    with pysam.FastxFile(str(ecoli / "reads.fasta")) as fh:
        return {r.name: r.sequence.upper() for r in fh}


def test_fastq_reads(tmp_path, no_leaks):
    fq = tmp_path / "a.fastq.gz"
    fq.write_bytes(gzip.compress(b"@r1 runid=x\nACGT\n+\nIIII\n@r2\nGG\n+\nII\n"))
    got = read_basecall_file(fq, "fastq", AlignmentFilter())
    assert got == {"r1": ReadBasecalls("r1", "ACGT", None), "r2": ReadBasecalls("r2", "GG", None)}
    assert read_basecall_file(fq, "fastq", AlignmentFilter(), wanted={"r2"}).keys() == {"r2"}


def test_aligned_bam_reads_carry_records_and_the_full_sequence(ecoli, no_leaks):
    got = read_basecall_file(ecoli / "reads.bam", "bam", AlignmentFilter())
    seqs = fasta(ecoli)
    assert {rid: bc.seq for rid, bc in got.items()} == seqs  # reverse-strand reads turned back
    supp = next(bc for rid, bc in got.items() if rid.startswith(SUPPLEMENTARY_READ))
    assert len(supp.records) == 2 and all(isinstance(r, AlignmentRecord) for r in supp.records)
    strict = read_basecall_file(ecoli / "reads.bam", "bam", AlignmentFilter(min_mapq=61))
    rec = next(iter(strict.values())).records[0]
    assert isinstance(rec, Skipped) and rec.reason == Skip.LOW_MAPQ and "reads.bam" in rec.detail


def test_a_bam_s_reads_come_through_pickle_as_they_were_read(ecoli):
    """A parsing process hands a file's reads back pickled, each record's CIGAR as bytes: the same
    records come out, their CIGARs int32 (ops, lengths) arrays the pipeline may write to."""
    got = read_basecall_file(ecoli / "reads.bam", "bam", AlignmentFilter())
    back = pickle.loads(pickle.dumps(got, pickle.HIGHEST_PROTOCOL))
    assert back.keys() == got.keys()
    records = [(a, b) for rid in got for a, b in zip(got[rid].records, back[rid].records, strict=True)]
    assert len(records) > len(got) and all(back[rid].seq == got[rid].seq for rid in got)
    for a, b in records:
        assert (b.read_id, b.ref_name, b.ref_start, b.ref_end, b.rc, b.mapq) == \
            (a.read_id, a.ref_name, a.ref_start, a.ref_end, a.rc, a.mapq)
        assert b.cigar.dtype == np.int32 and b.cigar.shape == a.cigar.shape and np.array_equal(b.cigar, a.cigar)
        assert b.cigar.flags.writeable


def test_unaligned_bam_reads_need_alignment(ecoli, tmp_path, no_leaks):
    path = tmp_path / "unaligned.bam"
    header = pysam.AlignmentHeader.from_dict({"HD": {"VN": "1.6", "SO": "unknown"}})
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        for rid, seq in fasta(ecoli).items():
            rec = pysam.AlignedSegment(header)
            rec.query_name, rec.query_sequence, rec.flag = rid, seq, 4
            out.write(rec)
    got = read_basecall_file(path, "bam", AlignmentFilter())
    assert all(bc.records is None for bc in got.values()) and len(got) == 8


def test_corrupt_files_raise_input_errors(tmp_path):
    bad = tmp_path / "bad.bam"
    bad.write_bytes(b"\x1f\x8bnot really")
    with pytest.raises(InputError, match="bad.bam"):
        read_basecall_file(bad, "bam", AlignmentFilter())


def test_cache_is_bounded_and_reads_files_again(tmp_path, no_leaks):
    fq = tmp_path / "a.fastq"
    fq.write_text("".join(f"@r{i}\n{'A' * 10}\n+\n{'I' * 10}\n" for i in range(5)))
    cache = BasecallCache(max_bases=25, filt=AlignmentFilter())
    cache.add(read_basecall_file(fq, "fastq", AlignmentFilter()).values())
    assert len(cache) == 2 and cache.bases == 20  # the oldest three were dropped
    taken = cache.take([Wanted("r0", fq, "fastq"), Wanted("r4", fq, "fastq"), Wanted("r9", fq, "fastq")])
    assert set(taken.found) == {"r0", "r4"} and cache.reloads == 1
    assert taken.failed == {"r9": f"{fq}: read no longer in the file"} and taken.passed_over == []
    assert len(cache) == 1
    cache.discard(["r3"])
    assert len(cache) == 0 and cache.bases == 0
    taken = cache.take([Wanted("r1", tmp_path / "gone.fastq", "fastq")])
    assert taken.found == {} and "gone.fastq" in taken.failed["r1"]


def test_a_read_its_file_no_longer_gives_is_read_from_its_spare(tmp_path, no_leaks):
    """The file a read was registered from fails when read again: its spare FASTQ gives it, if it can."""
    spare = tmp_path / "a.fastq"
    spare.write_text("".join(f"@r{i}\n{'C' * 10}\n+\n{'I' * 10}\n" for i in range(2)))
    bam, other = tmp_path / "a.bam", tmp_path / "b.fastq"
    bam.write_bytes(b"\x1f\x8bnot really")
    other.write_text("@r5\nACGT\n+\nIIII\n")
    cache = BasecallCache(max_bases=0, filt=AlignmentFilter())
    taken = cache.take([Wanted("r0", bam, "bam", spare, "fastq"), Wanted("r1", bam, "bam"),
                        Wanted("r2", bam, "bam", spare, "fastq"), Wanted("r5", other, "fastq", spare, "fastq")])
    assert taken.found == {"r0": ReadBasecalls("r0", "C" * 10, None), "r5": ReadBasecalls("r5", "ACGT", None)}
    po, = taken.passed_over
    assert (po.path, po.whole, po.spared) == (bam, True, {"r0": spare}) and po.why.startswith("cannot open BAM")
    assert taken.failed["r1"] == f"{bam}: {po.why}"  # no spare
    assert taken.failed["r2"] == f"{bam}: {po.why}; its FASTQ {spare}: read not in it"
    other.write_text("@r6\nACGT\n+\nIIII\n")  # replaced: r5 is no longer in it
    taken = cache.take([Wanted("r5", other, "fastq", spare, "fastq")])
    assert taken.failed == {"r5": f"{other}: read no longer in the file; its FASTQ {spare}: read not in it"}
    spare.unlink()
    taken = cache.take([Wanted("r0", bam, "bam", spare, "fastq")])
    assert taken.found == {} and f"{spare}` not found" in taken.failed["r0"] and taken.passed_over == []


@pytest.fixture(scope="module")
def aligner(reference_path):
    return ReadAligner(reference_path, AlignmentFilter())


def test_mappy_records_equal_minimap2s_bam(aligner, ecoli):
    """Same contig, span, strand, MAPQ and CIGAR (clips included) as the fixture's minimap2 BAM."""
    def key(a: AlignmentRecord):
        return a.read_id, a.ref_name, a.ref_start, a.ref_end, a.rc, a.mapq, a.cigar.tolist()

    theirs = sorted((key(a) for a in iter_alignments(ecoli / "reads.bam", AlignmentFilter())), key=str)
    mine = sorted((key(a) for rid, seq in fasta(ecoli).items() for a in aligner.align(rid, seq)), key=str)
    assert mine == theirs


def test_mappy_on_threads_gives_the_same_records(aligner, ecoli, no_leaks):
    reads = list(fasta(ecoli).items())
    assert aligner.threads >= 2
    assert [[(a.ref_start, a.cigar.tolist()) for a in recs] for recs in aligner.align_all(reads)] == \
        [[(a.ref_start, a.cigar.tolist()) for a in aligner.align(rid, seq)] for rid, seq in reads]


def test_mappy_unmapped_read(aligner):
    (rec,) = aligner.align("junk", "ACGT" * 50)
    assert isinstance(rec, Skipped) and rec.reason == Skip.UNMAPPED


def test_mappy_records_make_a_valid_bam(aligner, ecoli, tmp_path):
    path = tmp_path / "mappy.bam"
    with pysam.AlignmentFile(str(path), "wb", header=aligner.header) as out:
        for rid, seq in fasta(ecoli).items():
            for rec in aligner.records(rid, seq):
                out.write(rec)
    got = read_basecall_file(path, "bam", AlignmentFilter())
    assert {rid: bc.seq for rid, bc in got.items()} == fasta(ecoli)
