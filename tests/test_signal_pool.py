"""The overlapped `streamer call`: signal packed straight from the readers' samples, batch order kept
whatever the threads, readers chosen by format, failures raised rather than hung on."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
import signal
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import ECOLI, REFERENCE
from streamer.pipeline import planned
from streamer.pipeline import signal_pool
from streamer.io.signal_chunks import chunk_records, load_chunk, load_signals
from streamer.pipeline.batching import BatchLimits, assemble_batch, batch_inputs, plan_batches, signal_requests
from streamer.pipeline.batch import pack
from streamer.pipeline.gpu import CudaOptions
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, iter_alignments
from streamer.io.fastx import load_basecalls
from streamer.io.index import SignalIndex, open_index
from streamer.io.reference import Reference
from streamer.pipeline.stages import Pipeline, PipelineOptions
from streamer_plugins.cpg.caller import CpgCaller
from streamer.skips import Skip
from streamer.summary import RunSummary
from test_call import streamer


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("overlap")
    reads = tmp / "reads.fasta"
    shutil.copy(ECOLI / "reads.fasta", reads)
    filt = AlignmentFilter()
    wanted = {a.read_id for a in iter_alignments(ECOLI / "reads.bam", filt) if isinstance(a, AlignmentRecord)}
    index = open_index(reads, [ECOLI / "fast5"])
    basecalls = load_basecalls(reads, wanted)
    return list(plan_batches(iter_alignments(ECOLI / "reads.bam", filt), basecalls, index, BatchLimits(3), "r"))


def test_signal_packed_from_chunks_is_packs_signal(plans):
    """`streamer call`'s batches packed straight from the reader tasks' columns are the batches of the
    `ReadInput`s of the same records, field for field (a read twice, one whose signal is missing, one
    on a contig the reference lacks: skipped with why, in record order)."""
    pending = [p for ps, _ in plans for p in ps]
    pending.insert(3, pending[0])
    missing = pending[5]._replace(aln=replace(pending[5].aln, read_id="no-such-read"))
    elsewhere = pending[7]._replace(aln=replace(pending[7].aln, ref_name="chrX"))
    pending[5:5] = [missing, elsewhere]
    wanted = signal_requests(pending)
    half = dict(list(wanted.items())[: len(wanted) // 2])
    rest = dict(list(wanted.items())[len(wanted) // 2 :])
    chunks = [load_chunk(half), load_chunk(rest)]
    with Reference(REFERENCE) as ref:
        packed, skipped = assemble_batch(pending, chunks, ref)
        via_reads = pack(batch_inputs(pending, *chunk_records(chunks), ref)[0])
        signals, errors = load_signals(wanted)
        reads, skipped_reads = batch_inputs(pending, signals, errors, ref)
        theirs = pack(reads)
    assert [(s.read_id, s.reason) for s in skipped] == [("no-such-read", Skip.BAD_SIGNAL_FILE),
                                                        (elsewhere.aln.read_id, Skip.ALIGNMENT_FAILED)]
    assert skipped == skipped_reads and len(reads) == len(pending) - 2
    assert packed.signal.tobytes() == np.concatenate([r.signal.to_pa() for r in reads]).tobytes()
    for ours in (packed, via_reads):
        for name, value in vars(theirs).items():
            got = getattr(ours, name)
            if isinstance(value, np.ndarray):
                assert got.dtype == value.dtype and got.tobytes() == value.tobytes(), name
            elif isinstance(value, list):
                assert got == value, name


def test_readers_are_processes_unless_threads_are_asked_for():
    fast5 = SignalIndex({"a": Path("x.fast5"), "b": Path("y.blow5")}, [], {})
    pod5 = SignalIndex({"a": Path("x.pod5")}, [], {})
    blow5 = SignalIndex({"a": Path("x.blow5"), "b": Path("y.slow5")}, [], {})
    for index, mode, kind in ((fast5, "auto", ProcessPoolExecutor), (pod5, "auto", ProcessPoolExecutor),
                              (blow5, "auto", ProcessPoolExecutor), (fast5, "threads", ThreadPoolExecutor),
                              (blow5, "processes", ProcessPoolExecutor)):
        pool = signal_pool.reader_pool(index, 1, mode)
        assert isinstance(pool, kind)
        pool.shutdown()
    with pytest.raises(ValueError, match="io mode"):
        signal_pool.reader_pool(pod5, 1, "fibres")


def _same_signal(got, expected):
    assert got.keys() == expected.keys()
    for rid, rec in expected.items():
        assert np.array_equal(got[rid].raw, rec.raw)
        assert got[rid].to_pa().tobytes() == rec.to_pa().tobytes()
        assert (got[rid].offset, got[rid].range, got[rid].digitisation) == (rec.offset, rec.range, rec.digitisation)


def records_of(batch: signal_pool.SignalBatch):
    """A batch's signal records and failures, as the records path takes them (`batch_inputs`)."""
    return chunk_records(batch.chunks(), batch.read_ids)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_signal_read_ahead_gives_what_reading_in_place_gives(plans, mode):
    """The daemon's read-ahead: a batch's reads come from the tasks started ahead, the rest are read now."""
    first = signal_requests(plans[0][0])
    second = signal_requests([p for ps, _ in plans[1:3] for p in ps])
    reads = signal_pool.SignalReads(signal_pool.signal_readers([".fast5"], 2, mode), reads_per_task=2)
    try:
        reads.ahead(first)
        batch = reads.take(second)  # nothing of it was read ahead; the first batch's reads are dropped
        assert reads.hits == 0
        got, errors = records_of(batch)
        _same_signal(got, load_signals(second)[0])
        reads.ahead(first)
        ids = [rid for ids in first.values() for rid in ids]
        part = {path: [r for r in rids if r != ids[0]] for path, rids in first.items() if rids != [ids[0]]}
        got, errors = records_of(reads.take({**part, **second}))
        assert reads.hits == len(ids) - 1 and not errors
        _same_signal(got, load_signals({**part, **second})[0])
    finally:
        reads.close()


def test_signal_reads_set_a_bad_file_apart_and_survive_a_broken_pool(plans, tmp_path):
    wanted = signal_requests(plans[0][0])
    path = next(iter(wanted))
    bad = tmp_path / path.name
    bad.write_bytes(path.read_bytes()[:4096])
    wanted = {bad: wanted[path], **{p: ids for p, ids in wanted.items() if p != path}}
    expected, expected_errors = load_signals(wanted)
    assert set(expected_errors) == set(wanted[bad]) and all(str(bad) in e for e in expected_errors.values())
    in_place = signal_pool.SignalReads(None)
    got, errors = records_of(in_place.take(wanted))
    _same_signal(got, expected)
    assert errors == expected_errors
    pool = signal_pool.signal_readers([".fast5"], 1, "processes")
    reads = signal_pool.SignalReads(pool)
    try:
        worker = pool.submit(os.getpid).result()
        os.kill(worker, signal.SIGKILL)  # the pool breaks: what was asked of it is read here instead
        reads.ahead(wanted)
        got, errors = records_of(reads.take(wanted))
        _same_signal(got, expected)
        assert errors == expected_errors
        got, errors = records_of(reads.take(wanted))  # the broken pool is given up
        _same_signal(got, expected)
        assert errors == expected_errors and reads.pool is None
    finally:
        reads.close()
    assert pool.shared is None or pool.shared.left() == []  # nothing of the killed reader's left in /dev/shm


def test_a_reader_failure_is_raised_in_the_caller(plans, monkeypatch):
    def broken(wanted):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(planned, "load_chunk", broken)
    pipeline = Pipeline(PipelineOptions(threads=1, cuda=CudaOptions(disable=True)), [CpgCaller()])
    with Reference(REFERENCE) as ref, ThreadPoolExecutor(2) as pool, pytest.raises(RuntimeError, match="on fire"):
        planned.run_batches(pipeline, iter(plans), ref, pool, RunSummary(), lambda done: None)


@pytest.mark.parametrize("extra", [["--compute-threads", "1", "--io-workers", "1"], ["--compute-threads", "3"]])
def test_output_in_batch_order_whatever_the_threads(tmp_path, extra):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    outs = []
    for k, more in (("512", []), ("2", extra)):
        out = tmp_path / f"meth{k}.tsv"
        proc = streamer("call", "-r", tmp_path / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                        "--signal", ECOLI / "fast5", "-o", out, "-t", "2", "-K", k, *more)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "calls written:    790" in proc.stderr and "throughput:" in proc.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


_CUT_SHORT = """
import multiprocessing.forkserver, socket, sys
from streamer.pipeline import signal_pool
ctx = signal_pool._fork_server([])
address = multiprocessing.forkserver._forkserver._forkserver_address
for _ in range(3):  # an owner cut short after connecting, before it sends a new reader's descriptors
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)
reader = ctx.Process(target=sys.exit, args=(7,))
reader.start()
reader.join(60)
print(reader.exitcode)
"""


def test_a_request_cut_short_leaves_the_fork_server_serving_without_a_traceback():
    """Ctrl-C between the owner's connecting to the fork server and its sending a new reader's descriptors: the
    server, which printed a traceback and died there, drops the request and still starts the next reader."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _CUT_SHORT], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["7"] and "Traceback" not in run.stderr, run.stderr
