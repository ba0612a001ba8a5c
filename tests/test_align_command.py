"""`streamer align`: a sorted, indexed BAM that samtools and `streamer call -b` read, from mappy or
streamer's own engine; the `alignment.engine` key; one clear line when an engine cannot start."""

from __future__ import annotations

import json
import shutil

import pysam
import pytest

import streamer.daemon.aligner
from streamer.daemon.aligner import ReadAligner, aligned_records, why_no_gpu
from align_seeder import KmerSeeder
from conftest import ECOLI, REFERENCE, SHARED, needs_shared
from streamer import cli
from streamer.align.engine import SeedAligner
from streamer.align.genome import read_fasta
from streamer.config import Config, load
from streamer.errors import ConfigError
from streamer.io.alignments import AlignmentFilter
from streamer.io.fastx import iter_fastx
from test_call import agreement, call, load_calls


@pytest.fixture
def brute_force_engine(monkeypatch):
    """The cpu engine with the tests' k-mer seeder standing in for the FM-index's."""

    def fm_aligner(genome, filt, *, target, threads=2, **_):
        contigs = read_fasta(genome)
        return SeedAligner(contigs, KmerSeeder.of(contigs, k=15), filt, threads=threads)

    monkeypatch.setattr(streamer.daemon.aligner, "fm_aligner", fm_aligner)


def _records(bam):
    with pysam.AlignmentFile(str(bam)) as fh:
        assert fh.header.to_dict()["HD"]["SO"] == "coordinate"
        assert fh.check_index()
        return list(fh.fetch(until_eof=True))


def _aligned(tmp_path, engine):
    bam = tmp_path / f"{engine}.bam"
    assert cli.main(["align", "-r", str(SHARED / "reads.fasta"), "-g", str(REFERENCE), "-o", str(bam),
                     "--engine", engine, "-K", "50"]) == 0
    return bam


@needs_shared
@pytest.mark.parametrize("engine", ["mappy", "cpu"])
def test_sorted_indexed_bam(tmp_path, engine, brute_force_engine):
    bam = _aligned(tmp_path, engine)
    recs = _records(bam)
    primaries = [r for r in recs if not r.is_secondary and not r.is_supplementary]
    assert len({r.query_name for r in primaries}) == len(primaries) == 112
    starts = [(r.reference_id, r.reference_start) for r in recs if not r.is_unmapped]
    assert starts == sorted(starts)
    pysam.quickcheck(str(bam))  # samtools' check, as pysam carries it (raises on a bad file); no samtools needed


@needs_shared
def test_call_on_the_engines_bam_gives_f5cs_rows(tmp_path, brute_force_engine):
    proc, out = call(tmp_path, SHARED / "reads.fasta", _aligned(tmp_path, "cpu"), SHARED / "fast5_files")
    assert proc.returncode == 0, proc.stderr
    ours, theirs = load_calls(out), load_calls(SHARED / "expected" / "f5c-1.1" / "meth.tsv")
    assert len(set(ours) & set(theirs)) >= 0.99 * len(theirs)
    shared = {k: theirs[k] for k in set(ours) & set(theirs)}
    assert agreement(ours, shared)[0] >= 0.99


def test_engine_that_cannot_start_is_one_line(tmp_path, capsys):
    reads = tmp_path / "r.fa"
    reads.write_text(">r1\nACGTACGTACGTACGTACGTACGT\n")
    code = cli.main(["align", "-r", str(reads), "-g", str(REFERENCE), "-o", str(tmp_path / "o.bam"),
                     "--engine", "gpu"])
    err = capsys.readouterr().err
    if code == 0:  # the FM-index seeding is installed: then it aligned
        assert (tmp_path / "o.bam.bai").exists()
        return
    assert code == 2 and "gpu alignment engine cannot start" in err and "Traceback" not in err
    assert not (tmp_path / "o.bam").exists()


def test_alignment_engine_key():
    assert Config().alignment.engine == "auto"
    assert load(None, {"alignment.engine": "mappy"}, require=()).alignment.engine == "mappy"
    assert load(None, {"alignment.engine": "cpu"}, require=()).alignment.engine == "cpu"
    with pytest.raises(ConfigError, match="alignment.engine"):
        load(None, {"alignment.engine": "bwa"}, require=())


FIXTURE = (ECOLI / "reads.fasta", ECOLI / "fast5", 700)  # reads, signal, calls at least (790 from the BAM)
SHARED_READS = (SHARED / "reads.fasta", SHARED / "fast5_files", 10_000)


@pytest.mark.parametrize("inputs, engine", [
    (FIXTURE, "mappy"), (FIXTURE, "cpu"),
    pytest.param(SHARED_READS, "auto", marks=needs_shared),
])  # fmt: skip
def test_call_without_bam_gives_the_rows_of_align_then_call(tmp_path, reference_copy, inputs, engine, capsys):
    """`streamer call` with no -b aligns the basecalls itself (chunk by chunk, -K reads at a time): the
    rows of `streamer align` and `streamer call -b` on the same reads, whichever engine."""
    source, signal, at_least = inputs
    ref = reference_copy  # auto keeps its check beside it
    reads = tmp_path / "reads.fasta"
    shutil.copy(source, reads)
    bam = tmp_path / "aligned.bam"
    assert cli.main(["align", "-r", str(reads), "-g", str(ref), "-o", str(bam), "--engine", engine]) == 0
    common = ["call", "-r", str(reads), "-g", str(ref), "--signal", str(signal), "-t", "2", "-K", "16"]
    assert cli.main([*common, "-b", str(bam), "-o", str(tmp_path / "via_bam.tsv")]) == 0
    via_bam = capsys.readouterr().err
    assert cli.main([*common, "--align-engine", engine, "-o", str(tmp_path / "direct.tsv"), "--stats-json",
                     str(tmp_path / "stats.json")]) == 0
    direct = capsys.readouterr().err
    ours, theirs = ((tmp_path / name).read_text().splitlines() for name in ("direct.tsv", "via_bam.tsv"))
    assert ours[0] == theirs[0] and len(ours) > at_least
    assert sorted(ours[1:]) == sorted(theirs[1:])
    assert _report(direct) == _report(via_bam) and len(_report(direct)) == 4
    chosen = json.loads((tmp_path / "stats.json").read_text())["alignment_engine"]
    if engine != "auto":
        assert chosen == {"asked": engine, "engine": engine, "why": "as asked", "check": None, "passed": None}
    elif why_no_gpu():  # this host: mappy, and why
        assert chosen == {"asked": "auto", "engine": "mappy", "why": why_no_gpu(), "check": None, "passed": None}
    else:
        assert chosen["check"] is not None and chosen["engine"] == ("gpu" if chosen["passed"] else "mappy")


def _report(stderr: str) -> list[str]:
    """The counts of a run's report: records considered, called, skipped and why."""
    keys = ("alignment records considered", "records called", "records skipped", "calls written")
    return [line for line in stderr.splitlines() if line.strip().startswith(keys)]


def test_call_without_bam_and_outputs_that_copy_it(tmp_path, capsys):
    reads = tmp_path / "reads.fasta"
    shutil.copy(ECOLI / "reads.fasta", reads)
    code = cli.main(["call", "-r", str(reads), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"),
                     "--modbam", str(tmp_path / "mod.bam"), "-o", str(tmp_path / "m.tsv")])
    err = capsys.readouterr().err
    assert code == 2 and "--modbam and --skip-ultra copy records of the -b BAM: give -b" in err
    assert "Traceback" not in err and not (tmp_path / "m.tsv").exists()


def test_aligned_records_take_a_chunk_at_a_time():
    """`call` without -b holds one chunk's alignments: the next chunk is aligned only when its records are taken."""
    chunks = []

    class Counted(ReadAligner):
        def align_all(self, reads):
            chunks.append([rid for rid, _ in reads])
            return super().align_all(reads)

    reads = list(iter_fastx(ECOLI / "reads.fasta"))
    records = aligned_records(Counted(REFERENCE, AlignmentFilter(), threads=1), iter(reads), 3)
    first = next(records)
    assert chunks == [[rid for rid, _ in reads[:3]]] and first.read_id == reads[0][0]
    rest = [first, *records]
    assert [len(c) for c in chunks] == [3, 3, 2]
    assert [r.read_id for r in rest] == sorted((r.read_id for r in rest), key=[rid for rid, _ in reads].index)
    assert {r.read_id for r in rest} == {rid for rid, _ in reads}
