"""Watching: which files count, when a file is complete, and that a half-written one waits."""

from __future__ import annotations

import gzip
import os
import shutil
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pysam

from streamer.io.bamreads import BGZF_EOF
from streamer.io.pod5 import SIGNATURE as POD5_SIGNATURE
from streamer.io.slow5 import BLOW5_EOF, BLOW5_MAGIC
from streamer.daemon.runfolder import Kind, RunLayout, Verdict, check_complete, files_written
from streamer.daemon.watch import Ready, Rejected, Watcher, WatchTimings

from daemon_support import no_leaks  # noqa: F401


def touch(path: Path, data: bytes = b"x\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------- layouts


def test_minknow_layout(tmp_path):
    run = tmp_path / "20240101_1200_MN1_FAK1_abcd1234"
    (run / "bam_pass").mkdir(parents=True)
    lay = RunLayout(tmp_path, exclude=(tmp_path / "out",))
    f = lay.classify(run / "fast5_pass" / "FAK1_pass_abcd1234_0.fast5")
    assert (f.kind, f.fmt, f.run_root) == (Kind.SIGNAL, "fast5", run)
    f = lay.classify(run / "bam_pass" / "barcode01" / "FAK1_pass_barcode01_abcd1234_0.bam")
    assert (f.kind, f.fmt, f.run_root) == (Kind.BASECALLS, "bam", run)
    f = lay.classify(run / "pod5" / "x.pod5")
    assert (f.kind, f.fmt) == (Kind.SIGNAL, "pod5")
    assert lay.classify(run / "fastq_pass" / "x.fastq.gz").spare  # auto: this run writes BAM
    assert not f.spare and not lay.classify(run / "bam_pass" / "x.bam").spare
    assert lay.classify(run / "fast5_fail" / "x.fast5") is None
    assert lay.classify(run / "fast5_skip" / "x.fast5") is None
    assert lay.classify(run / "fast5_pass" / ".x.fast5") is None
    assert lay.classify(run / ".replay" / "x.fast5") is None
    assert lay.classify(run / "fast5_pass" / "x.fast5.tmp") is None
    assert lay.classify(run / "sequencing_summary_FAK1.txt") is None
    assert lay.classify(tmp_path / "out" / "meth.tsv") is None
    assert lay.classify(tmp_path.parent / "elsewhere.fast5") is None
    f = lay.classify(run / "final_summary_FAK1_abcd1234.txt")
    assert (f.kind, f.run_root) == (Kind.FINAL_SUMMARY, run)
    assert lay.classify(tmp_path / "STOP").kind is Kind.STOP
    assert lay.classify(run / "STOP") is None
    with_fail = RunLayout(tmp_path, include_fail=True)
    assert with_fail.classify(run / "fast5_fail" / "x.fast5").kind is Kind.SIGNAL


def test_plain_folder_and_basecall_choice(tmp_path):
    lay = RunLayout(tmp_path)
    f = lay.classify(tmp_path / "reads.fastq")
    assert (f.kind, f.fmt, f.run_root, f.spare) == (Kind.BASECALLS, "fastq", tmp_path, False)
    assert lay.classify(tmp_path / "reads.fa.gz").fmt == "fasta"
    assert lay.classify(tmp_path / "sub" / "x.fast5").run_root == tmp_path / "sub"
    lay.note_listing([tmp_path / "reads.bam"])
    assert lay.classify(tmp_path / "reads.fastq").spare  # a BAM beside it comes first in auto mode
    assert not RunLayout(tmp_path, basecalls="fastq").classify(tmp_path / "reads.fastq").spare
    assert RunLayout(tmp_path, basecalls="fastq").classify(tmp_path / "reads.bam") is None
    assert RunLayout(tmp_path, basecalls="bam").classify(tmp_path / "reads.fastq") is None


def test_a_final_summary_says_how_many_files_the_run_wrote_where_it_says_so():
    text = ("instrument=MN1\nfast5_files_in_final_dest=0\nfast5_files_in_fallback=0\npod5_files_in_final_dest=12\n"
            "pod5_files_in_fallback=2\nfastq_files_in_final_dest= 24\nbam_files_in_final_dest=unknown\n"
            "txt_files_in_final_dest=3\nsequencing_summary_file=sequencing_summary_FAK1.txt\n")
    written = files_written(text)
    assert written.final_dest == {"fast5": 0, "pod5": 12, "fastq": 24}  # not a count, or not a run's file: left out
    assert written.fallback == {"fast5": 0, "pod5": 2}
    older = files_written("instrument=MN1\nprotocol_run_id=x\n")  # an older MinKNOW counts nothing
    assert older.final_dest == older.fallback == {}


def test_the_files_of_a_run_left_alone_by_choice(tmp_path):
    run = tmp_path / "20240101_1200_MN1_FAK1_abcd1234"
    for name in ("pod5_pass/a.pod5", "pod5_fail/b.pod5", "pod5_skip/c.pod5", "fastq_pass/a.fastq.gz",
                 "fastq_fail/barcode01/b.fastq.gz", "bam_pass/a.bam", "bam_fail/b.bam", "bam_fail/.c.bam",
                 "bam_fail/d.bam.tmp", ".replay/e.bam", "out/f.bam", "sequencing_summary_FAK1.txt"):
        touch(run / name)
    lay = RunLayout(tmp_path, exclude=(run / "out",))
    assert lay.left_alone(run) == {"pod5": 2, "fastq": 1, "bam": 1}
    assert RunLayout(tmp_path, include_fail=True, exclude=(run / "out",)).left_alone(run) == {}
    assert RunLayout(tmp_path, basecalls="fastq", exclude=(run / "out",)).left_alone(run) == {"pod5": 2, "fastq": 1,
                                                                                               "bam": 2}


# ---------------------------------------------------------------------------- completeness


def test_end_markers(tmp_path):
    assert check_complete(touch(tmp_path / "a.pod5", POD5_SIGNATURE + b"data" + POD5_SIGNATURE), "pod5")[0] \
        is Verdict.COMPLETE
    assert check_complete(touch(tmp_path / "b.pod5", POD5_SIGNATURE + b"data"), "pod5")[0] is Verdict.INCOMPLETE
    assert check_complete(touch(tmp_path / "a.blow5", BLOW5_MAGIC + b"x" * 10 + BLOW5_EOF), "blow5")[0] \
        is Verdict.COMPLETE
    assert check_complete(touch(tmp_path / "b.blow5", BLOW5_MAGIC + b"x" * 10), "blow5")[0] is Verdict.INCOMPLETE
    assert check_complete(touch(tmp_path / "empty.bam", b""), "bam") == (Verdict.INCOMPLETE, "empty file")


def test_bam_needs_its_eof_block(ecoli, tmp_path):
    whole = tmp_path / "whole.bam"
    shutil.copy(ecoli / "reads.bam", whole)
    assert whole.read_bytes().endswith(BGZF_EOF)
    assert check_complete(whole, "bam") == (Verdict.COMPLETE, "")
    cut = touch(tmp_path / "cut.bam", whole.read_bytes()[:-28])
    assert check_complete(cut, "bam") == (Verdict.INCOMPLETE, "no BGZF end-of-file block")


def test_gzip_needs_its_trailer(tmp_path):
    data = gzip.compress(b"@r1\nACGT\n+\nIIII\n" * 1000)
    assert check_complete(touch(tmp_path / "a.fastq.gz", data), "fastq")[0] is Verdict.COMPLETE
    two = touch(tmp_path / "two.fastq.gz", data + gzip.compress(b"@r2\nAC\n+\nII\n"))
    assert check_complete(two, "fastq")[0] is Verdict.COMPLETE
    verdict, reason = check_complete(touch(tmp_path / "cut.fastq.gz", data[:-4]), "fastq")
    assert verdict is Verdict.INCOMPLETE and "no trailer" in reason
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    verdict, reason = check_complete(touch(tmp_path / "bad.fastq.gz", bytes(bad)), "fastq")
    assert verdict is Verdict.CORRUPT and "corrupt gzip" in reason
    verdict, reason = check_complete(touch(tmp_path / "plain.fastq.gz", b"@r1\nACGT\n"), "fastq")
    assert verdict is Verdict.CORRUPT and "magic" in reason


def test_fast5_must_open(ecoli, tmp_path):
    src = sorted((ecoli / "fast5").glob("*.fast5"))[0]
    good = tmp_path / "good.fast5"
    shutil.copy(src, good)
    assert check_complete(good, "fast5") == (Verdict.COMPLETE, "")
    cut = touch(tmp_path / "cut.fast5", good.read_bytes()[: good.stat().st_size // 3])
    verdict, reason = check_complete(cut, "fast5")
    assert verdict is Verdict.INCOMPLETE and reason


def test_plain_text_needs_its_last_newline(tmp_path):
    assert check_complete(touch(tmp_path / "a.fastq", b"@r\nA\n+\nI\n"), "fastq")[0] is Verdict.COMPLETE
    assert check_complete(touch(tmp_path / "b.fastq", b"@r\nA\n+\nI"), "fastq")[0] is Verdict.INCOMPLETE


# ---------------------------------------------------------------------------- the watcher's rules (no observer)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_file_without_marker_waits_to_settle(ecoli, tmp_path):
    clock = Clock()
    f5 = tmp_path / "x.fast5"
    shutil.copy(sorted((ecoli / "fast5").glob("*.fast5"))[0], f5)
    w = Watcher(RunLayout(tmp_path), WatchTimings(poll_interval=1, settle=5, incomplete_timeout=60), clock=clock)
    w.scan(tmp_path)
    assert w.poll(0) == [] and w.pending == [f5]
    clock.t += 5
    (got,) = w.poll(0)
    assert isinstance(got, Ready) and got.file.path == f5 and w.pending == []


def test_file_with_marker_is_ready_at_once_and_known_files_are_skipped(ecoli, tmp_path):
    clock = Clock()
    bam = touch(tmp_path / "a" / "a.bam", (ecoli / "reads.bam").read_bytes())
    old = touch(tmp_path / "a" / "old.bam", (ecoli / "reads.bam").read_bytes())
    gz = touch(tmp_path / "b" / "b.fastq.gz", gzip.compress(b"@r\nA\n+\nI\n"))
    known = {old}
    w = Watcher(RunLayout(tmp_path), WatchTimings(poll_interval=2, settle=5, incomplete_timeout=300), known=lambda p, s, m: p in known, clock=clock)
    w.scan(tmp_path)
    assert [r.file.path for r in w.poll(0)] == [bam]  # the gzip is read in full only once settled
    clock.t += 5
    assert [r.file.path for r in w.poll(0)] == [gz]
    assert w.run_roots == {tmp_path / "a", tmp_path / "b"}


def test_incomplete_file_is_rejected_after_the_timeout_and_looked_at_again_when_it_changes(tmp_path):
    clock = Clock()
    data = gzip.compress(b"@r\nACGT\n+\nIIII\n" * 100)
    gz = touch(tmp_path / "a.fastq.gz", data[:-8])
    rejected: dict[Path, tuple[int, int]] = {}
    w = Watcher(RunLayout(tmp_path), WatchTimings(poll_interval=1, settle=5, incomplete_timeout=60),
                known=lambda p, s, m: rejected.get(p) == (s, m), clock=clock)
    w.scan(tmp_path)
    assert w.poll(0) == []
    clock.t += 30
    assert w.poll(0) == []
    clock.t += 31
    (got,) = w.poll(0)
    assert isinstance(got, Rejected) and "no trailer" in got.reason and "unchanged for 61 s" in got.reason
    rejected[gz] = (got.size, got.mtime_ns)
    w.scan(tmp_path)
    assert w.pending == []  # known as rejected, as it is
    gz.write_bytes(data)
    w.scan(tmp_path)
    clock.t += 5
    (got,) = w.poll(0)
    assert isinstance(got, Ready)


def test_reject_pending_at_the_end_of_a_run(tmp_path):
    touch(tmp_path / "a.bam", b"\x1f\x8b partial")
    w = Watcher(RunLayout(tmp_path), WatchTimings(poll_interval=2, settle=5, incomplete_timeout=300), clock=Clock())
    w.scan(tmp_path)
    assert w.poll(0) == []
    (got,) = w.reject_pending("run over")
    assert got.reason == "no BGZF end-of-file block (run over)" and w.pending == []


# ---------------------------------------------------------------------------- with the observer (real events)


def wait_for(w: Watcher, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = w.poll(0.05)
        if got:
            return got
    return []


FAST = WatchTimings(poll_interval=0.05, settle=60, incomplete_timeout=60)


def test_half_written_gzip_is_not_read_until_complete(tmp_path, no_leaks):
    """A FASTQ.gz appended slowly in place (flushes, no trailer yet) waits for its last byte."""
    path = tmp_path / "fastq_pass" / "FAK1_pass_r_0.fastq.gz"
    path.parent.mkdir()
    proceed, flushed = threading.Event(), threading.Event()

    def writer():
        with gzip.open(path, "wb") as fh:
            for i in range(5):
                fh.write(f"@r{i}\nACGT\n+\nIIII\n".encode())
                fh.flush()  # a sync flush: the bytes are on disk, the trailer is not
                flushed.set()
                proceed.wait(30)
                proceed.clear()

    with Watcher(RunLayout(tmp_path), FAST) as w:
        t = threading.Thread(target=writer)
        t.start()
        for _ in range(4):
            assert flushed.wait(30)
            flushed.clear()
            assert wait_for(w, 0.3) == []  # half written: never handed on
            proceed.set()
        assert flushed.wait(30)
        proceed.set()
        t.join()
        (got,) = wait_for(w, 5)
        assert isinstance(got, Ready) and got.file.path == path
        assert got.size == path.stat().st_size


def test_fast5_written_in_place_waits_for_its_close(ecoli, tmp_path, no_leaks):
    src = sorted((ecoli / "fast5").glob("*.fast5"))[0]
    path = tmp_path / "fast5_pass" / "x.fast5"
    path.parent.mkdir()
    with Watcher(RunLayout(tmp_path), FAST) as w:
        with h5py.File(path, "w") as out, h5py.File(src) as f:
            for i in range(3):
                out.create_dataset(f"read_{i}/Raw/Signal", data=np.arange(1000, dtype=np.int16))
                out.flush()
                assert wait_for(w, 0.2) == []
            f.copy(f["UniqueGlobalKey"], out, "UniqueGlobalKey")
        (got,) = wait_for(w, 5)
        assert isinstance(got, Ready) and got.file.path == path


def test_moved_in_file_is_ready_at_once(tmp_path, no_leaks):
    """A move is the writer saying it is done: no settling even for a format without a marker."""
    staging = tmp_path / ".staging"
    staging.mkdir()
    dest = tmp_path / "run" / "fastq_pass" / "r.fastq"
    dest.parent.mkdir(parents=True)
    with Watcher(RunLayout(tmp_path), FAST) as w:
        tmp = touch(staging / "r.fastq", b"@r\nA\n+\nI\n")
        os.replace(tmp, dest)
        (got,) = wait_for(w, 5)
        assert isinstance(got, Ready) and got.file.path == dest
        assert w.run_roots == {tmp_path / "run"}


def test_files_in_a_new_folder_are_found(tmp_path, no_leaks):
    timings = WatchTimings(poll_interval=0.05, settle=0.2, incomplete_timeout=60)
    with Watcher(RunLayout(tmp_path), timings) as w:
        staging = tmp_path / ".staging" / "run2"
        touch(staging / "fastq_pass" / "a.fastq", b"@r\nA\n+\nI\n")
        os.replace(staging, tmp_path / "run2")  # a whole run folder moved in
        (got,) = wait_for(w, 5)
        assert got.file.path == tmp_path / "run2" / "fastq_pass" / "a.fastq"


def test_polling_observer_sees_files_once_settled(tmp_path, no_leaks):
    timings = WatchTimings(poll_interval=0.05, settle=0.3, incomplete_timeout=60)
    with Watcher(RunLayout(tmp_path), timings, poll=True) as w:
        path = touch(tmp_path / "r.fastq", b"@r\nA\n+\nI\n")
        t0 = time.monotonic()
        (got,) = wait_for(w, 5)
        assert isinstance(got, Ready) and got.file.path == path
        assert time.monotonic() - t0 >= 0.25


def test_rejects_nothing_while_a_bam_is_still_written(ecoli, tmp_path, no_leaks):
    """A BAM written record by record has no EOF block until it is closed."""
    with pysam.AlignmentFile(str(ecoli / "reads.bam")) as src:
        recs = list(src)
        header = src.header
    with Watcher(RunLayout(tmp_path), FAST) as w:
        path = tmp_path / "a.bam"
        with pysam.AlignmentFile(str(path), "wb", header=header) as out:
            for rec in recs:
                out.write(rec)
            assert wait_for(w, 0.2) == []
        (got,) = wait_for(w, 5)
        assert isinstance(got, Ready)
