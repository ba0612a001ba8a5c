"""Basecalls from dorado/MinKNOW BAM: `streamer call -r` on BAM gives the FASTA route's output."""

import array
import shutil
import subprocess
import sys

import pysam
import pytest
from conftest import ECOLI, REFERENCE

from streamer.io.bamreads import is_bam, open_basecalls
from streamer.io.fastx import load_basecalls


def unaligned_bam(path, fasta, aligned) -> None:
    """The reads as dorado writes them unaligned: sequences as sequenced, tags of the aligned records kept."""
    with pysam.AlignmentFile(str(aligned)) as fh:
        primary = (r for r in fh if not (r.is_secondary or r.is_supplementary))
        tags = {r.query_name: r.get_tags(with_value_type=True) for r in primary}
    header = {"HD": {"VN": "1.6", "SO": "unknown"}, "RG": [{"ID": "run1", "DS": "basecall_model=dna_r9.4.1"}]}
    with pysam.AlignmentFile(str(path), "wb", header=header) as out:
        for rid, seq in load_basecalls(fasta).items():
            rec = pysam.AlignedSegment(out.header)
            rec.query_name, rec.query_sequence, rec.flag = rid, seq, 4
            rec.set_tags([*tags.get(rid, []), ("mv", array.array("b", [5, 1, 0, 1])), ("MM", "C+m?;", "Z")])
            out.write(rec)


def test_reads_from_bam_equal_the_fasta(tmp_path):
    unaligned_bam(tmp_path / "u.bam", ECOLI / "reads.fasta", ECOLI / "reads.bam")
    fasta = load_basecalls(ECOLI / "reads.fasta")
    assert is_bam(tmp_path / "u.bam") and is_bam(ECOLI / "reads.bam") and not is_bam(ECOLI / "reads.fasta")
    with open_basecalls(tmp_path / "u.bam") as reads:
        assert dict(reads) == fasta
    with open_basecalls(ECOLI / "reads.bam") as aligned:  # reverse-strand records turned back to the read as sequenced
        assert len(aligned) and all(fasta[rid] == seq for rid, seq in aligned.items())


FASTX = {
    "fa": ">r1 run=1\nACGT\nacg\n>empty\n>r2\r\nTTGA\r\n>r1\nGGCC\n\n>last\nN",
    "fq": "@r1 x\nACGT\nAC\n+\n@@@@\nII\n@empty\n\n+\n\n@r2\nttga\n+r2\n@III\n@r3\nC\n+\n@",
}


@pytest.mark.parametrize("fmt", sorted(FASTX))
@pytest.mark.parametrize("compress", [False, True])
def test_fastx_looked_up_equals_loaded(tmp_path, fmt, compress):
    """Sequences read at their offsets (or, gzipped, held) equal the parsed file's: wrapped lines,
    CRLF, lower case, empty records, repeated ids, quality lines that start with '@'."""
    path = tmp_path / f"r.{fmt}"
    path.write_text(FASTX[fmt])
    if compress:
        subprocess.run(["gzip", str(path)], check=True)
        path = tmp_path / f"r.{fmt}.gz"
    with open_basecalls(path) as reads:
        assert dict(reads) == load_basecalls(path)
        assert "empty" not in reads and reads.get("absent") is None


def call(reads, out, *extra) -> None:
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(reads), "-b", str(ECOLI / "reads.bam"),
                           "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"), "-o", str(out), "-t", "2",
                           *map(str, extra)], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("source", ["unaligned", "aligned"])
def test_call_output_identical_to_the_fasta_route(tmp_path, source):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    call(tmp_path / "reads.fasta", tmp_path / "fasta.tsv")
    reads = tmp_path / "reads.bam"
    if source == "unaligned":
        unaligned_bam(reads, ECOLI / "reads.fasta", ECOLI / "reads.bam")
    else:
        shutil.copy(ECOLI / "reads.bam", reads)
    before = reads.read_bytes()
    call(reads, tmp_path / "bam.tsv")
    assert (tmp_path / "bam.tsv").read_bytes() == (tmp_path / "fasta.tsv").read_bytes()
    assert reads.read_bytes() == before  # read only: move tables and MM/ML untouched
