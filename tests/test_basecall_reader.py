"""The daemon's basecall files parsed in a reader process: the same reads and the same errors as in the
daemon's own thread, and the daemon's own thread again once that process is gone."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from streamer.daemon.basecall_cache import read_basecall_file
from streamer.daemon.basecall_reader import BasecallReader
from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.skips import Skipped


def parts(reads: dict) -> dict:
    """Every field of every read and record (records hold CIGAR arrays, which do not compare with ==)."""
    def rec(r):
        if isinstance(r, Skipped):
            return ("skipped", r.read_id, r.reason, r.detail)
        return (r.read_id, r.ref_name, r.ref_start, r.ref_end, r.rc, r.mapq, r.cigar.dtype.str, r.cigar.tolist())

    return {rid: (bc.seq, None if bc.records is None else [rec(r) for r in bc.records]) for rid, bc in reads.items()}


@pytest.fixture
def reader():
    r = BasecallReader(processes=True)
    yield r
    r.close()


def test_a_process_gives_the_reads_the_thread_gives(ecoli, reader):
    for filt in (AlignmentFilter(), AlignmentFilter(min_mapq=61)):
        want = read_basecall_file(ecoli / "reads.bam", "bam", filt)
        got = reader(ecoli / "reads.bam", "bam", filt)
        assert parts(got) == parts(want) and len(got) == 8
    some = set(list(want)[:3])
    assert parts(reader(ecoli / "reads.fasta", "fasta", AlignmentFilter(), some)) == parts(
        read_basecall_file(ecoli / "reads.fasta", "fasta", AlignmentFilter(), some))
    assert reader._pool is not None  # it did run in a process


def test_a_bad_file_raises_the_same_input_error(tmp_path, reader):
    bad = tmp_path / "bad.bam"
    bad.write_bytes(b"\x1f\x8bnot really")
    with pytest.raises(InputError) as here:
        read_basecall_file(bad, "bam", AlignmentFilter())
    with pytest.raises(InputError) as there:
        reader(bad, "bam", AlignmentFilter())
    assert (there.value.path, there.value.reason, str(there.value)) == (here.value.path, here.value.reason,
                                                                        str(here.value))


def test_the_daemons_thread_parses_once_the_process_is_gone(ecoli, reader, caplog):
    reader(ecoli / "reads.bam", "bam", AlignmentFilter())
    for pid in list(reader._pool._processes):
        os.kill(pid, signal.SIGKILL)
    with caplog.at_level(logging.WARNING):
        got = reader(ecoli / "reads.bam", "bam", AlignmentFilter())
        again = reader(ecoli / "reads.bam", "bam", AlignmentFilter())
    assert parts(got) == parts(again) == parts(read_basecall_file(ecoli / "reads.bam", "bam", AlignmentFilter()))
    assert sum("basecall parsing process stopped" in r.getMessage() for r in caplog.records) == 1


def test_without_processes_no_process_starts(ecoli):
    reader = BasecallReader(processes=False)
    assert len(reader(ecoli / "reads.bam", "bam", AlignmentFilter())) == 8 and reader._pool is None
    reader.close()
