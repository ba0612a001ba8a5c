"""Input files parsed in a reader process: the daemon's basecall files and `call`'s BAM records come back as
the calling thread would parse them, with the same errors, and are parsed in the caller once that process
is gone (for records, from where it stopped)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pysam
import pytest

from streamer.daemon.basecall_cache import read_basecall_file
from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter, iter_alignments
from streamer.pipeline import parsing, shared_samples
from streamer.pipeline.parsing import ParseProcess
from streamer.skips import Skipped


needs_shm = pytest.mark.skipif(not os.access(shared_samples.SHM, os.W_OK), reason="no writable /dev/shm")


def rec(r):
    """Every field of a record (CIGAR arrays do not compare with ==)."""
    if isinstance(r, Skipped):
        return ("skipped", r.read_id, r.reason, r.detail)
    return (r.read_id, r.ref_name, r.ref_start, r.ref_end, r.rc, r.mapq, r.cigar.dtype.str, r.cigar.tolist())


def parts(reads: dict) -> dict:
    return {rid: (bc.seq, None if bc.records is None else [rec(r) for r in bc.records]) for rid, bc in reads.items()}


@pytest.fixture
def parser():
    p = ParseProcess(processes=True)
    yield p
    p.close()


def test_basecall_files_come_back_as_parsed_here(ecoli, parser):
    for filt in (AlignmentFilter(), AlignmentFilter(min_mapq=61)):
        want = read_basecall_file(ecoli / "reads.bam", "bam", filt)
        assert parts(parser.run(read_basecall_file, ecoli / "reads.bam", "bam", filt)) == parts(want)
    some = set(list(want)[:3])
    assert parts(parser.run(read_basecall_file, ecoli / "reads.fasta", "fasta", AlignmentFilter(), some)) == parts(
        read_basecall_file(ecoli / "reads.fasta", "fasta", AlignmentFilter(), some))
    assert parser._pool is not None  # it did run in a process


def copies_of(bam: Path, out: Path, n: int) -> Path:
    """`bam`'s records `n` times over, under new read names: a file whose reads pickle past a pipe-full."""
    with pysam.AlignmentFile(str(bam)) as src, pysam.AlignmentFile(str(out), "wb", template=src) as dst:
        records = list(src.fetch(until_eof=True))
        for i in range(n):
            for r in records:
                r.query_name = f"{r.query_name.split('~')[0]}~{i}"
                dst.write(r)
    return out


@needs_shm
def test_a_large_result_comes_back_through_a_file_and_leaves_none(ecoli, tmp_path, parser):
    bam = copies_of(ecoli / "reads.bam", tmp_path / "copies.bam", 4)
    want = read_basecall_file(bam, "bam", AlignmentFilter())
    shared = shared_samples.place(tmp_path)
    handed = parsing._handed_back(shared, read_basecall_file, (bam, "bam", AlignmentFilter()))
    assert isinstance(handed, parsing._InFile) and shared.left()  # what the process hands back for it
    assert parts(parsing._taken_back(handed)) == parts(want) and not shared.left()
    assert parts(parser.run(read_basecall_file, bam, "bam", AlignmentFilter())) == parts(want) and len(want) == 32
    assert not parser._pool.shared.left()


def test_records_come_back_in_file_order_in_chunks(ecoli):
    parser = ParseProcess(processes=True, chunk=2)  # the fixture's 9 records over five tasks
    try:
        for filt in (AlignmentFilter(), AlignmentFilter(min_mapq=61, secondary=True)):
            want = [rec(r) for r in iter_alignments(ecoli / "reads.bam", filt)]
            assert [rec(r) for r in parser.records(ecoli / "reads.bam", filt)] == want and len(want) == 9
        records = parser.records(ecoli / "reads.bam", AlignmentFilter())
        assert rec(next(records)) == rec(next(iter_alignments(ecoli / "reads.bam", AlignmentFilter())))
        records.close()  # left midway: the process lets that file go
    finally:
        parser.close()


def test_a_bad_file_raises_the_same_input_error(tmp_path, parser):
    bad = tmp_path / "bad.bam"
    bad.write_bytes(b"\x1f\x8bnot really")
    with pytest.raises(InputError) as here:
        read_basecall_file(bad, "bam", AlignmentFilter())
    with pytest.raises(InputError) as there:
        parser.run(read_basecall_file, bad, "bam", AlignmentFilter())
    assert (there.value.path, there.value.reason, str(there.value)) == (here.value.path, here.value.reason,
                                                                        str(here.value))
    with pytest.raises(InputError) as here:
        list(iter_alignments(bad, AlignmentFilter()))
    with pytest.raises(InputError) as there:
        list(parser.records(bad, AlignmentFilter()))
    assert str(there.value) == str(here.value)


@pytest.mark.parametrize("kill_after", [0, 1, 4])
def test_the_caller_parses_once_the_process_is_gone(ecoli, caplog, kill_after):
    """Killed before a file (the pool already broken) or midway through one, wherever the chunks then are."""
    filt = AlignmentFilter()
    want = [rec(r) for r in iter_alignments(ecoli / "reads.bam", filt)]
    parser = ParseProcess(processes=True, chunk=2)
    try:
        assert len(parser.run(read_basecall_file, ecoli / "reads.bam", "bam", filt)) == 8  # the process is up
        records = parser.records(ecoli / "reads.bam", filt)
        got = [rec(next(records)) for _ in range(kill_after)]
        for pid in list(parser._pool._processes):
            os.kill(pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING):
            got += [rec(r) for r in records]  # what the process had handed back, then the rest parsed here
            again = parser.run(read_basecall_file, ecoli / "reads.bam", "bam", filt)
        assert got == want
        assert parts(again) == parts(read_basecall_file(ecoli / "reads.bam", "bam", filt))
        assert sum("parsing process stopped" in r.getMessage() for r in caplog.records) == 1
    finally:
        parser.close()


def test_without_processes_no_process_starts(ecoli):
    parser = ParseProcess(processes=False)
    assert len(list(parser.records(ecoli / "reads.bam", AlignmentFilter()))) == 9
    assert len(parser.run(read_basecall_file, ecoli / "reads.bam", "bam", AlignmentFilter())) == 8
    assert parser._pool is None
    parser.close()
