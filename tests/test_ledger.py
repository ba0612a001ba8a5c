"""The ledger and the outputs it guards: joins by read id, exactly-once commits, repair at start."""

from __future__ import annotations

import sqlite3

import pytest

from streamer.daemon.ledger import BatchRecord, Ledger, LedgerError
from streamer.daemon.journal import Journal as Outputs
from streamer.sinks import write_atomic

from daemon_support import no_leaks  # noqa: F401


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self):
        return self.t


@pytest.fixture
def ledger(tmp_path):
    clock = Clock()
    with Ledger(tmp_path / "state", watch_dir=tmp_path, clock=clock) as led:
        led.clock = clock
        yield led


def test_signal_then_basecalls_match(ledger, tmp_path):
    reg = ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 10, 1, ["r1", "r2", "r3"])
    assert (reg.n_reads, reg.newly_matched, reg.duplicates) == (3, 0, 0)
    assert ledger.read_counts()["waiting_for_basecalls"] == 3
    ledger.clock.t += 5
    reg = ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 20, 2, [("r2", 100), ("r3", 50), ("r9", 7)])
    assert reg.newly_matched == 2
    picks, full = ledger.matched(10, 10_000)
    assert [p.read_id for p in picks] == ["r2", "r3"] and not full
    assert picks[0].signal_path == tmp_path / "a.fast5" and picks[0].basecall_path == tmp_path / "a.fastq"
    assert picks[0].n_bases == 100 and picks[0].matched == ledger.clock.t
    assert ledger.read_counts() == {"done": 0, "matched": 2, "waiting_for_basecalls": 1, "waiting_for_signal": 1}
    assert ledger.open_reads_of(tmp_path / "a.fastq") == {"r2", "r3", "r9"}


def test_basecalls_then_signal_match_and_duplicates_are_counted(ledger, tmp_path):
    ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10), ("r2", 10)])
    reg = ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1", "r2"])
    assert reg.newly_matched == 2
    reg = ledger.register_signal_file(tmp_path / "b.fast5", "fast5", 1, 1, ["r2", "r3"])
    assert (reg.newly_matched, reg.duplicates) == (0, 1)
    picks, _ = ledger.matched(10, 100)
    assert {p.signal_path.name for p in picks} == {"a.fast5"}


def test_batches_are_capped_by_reads_and_bases(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, [f"r{i}" for i in range(5)])
    ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [(f"r{i}", 100) for i in range(5)])
    picks, full = ledger.matched(2, 10_000)
    assert len(picks) == 2 and full
    picks, full = ledger.matched(10, 250)
    assert len(picks) == 2 and full
    picks, full = ledger.matched(10, 50)  # one read larger than the cap still goes alone
    assert len(picks) == 1 and full


def test_commit_is_all_or_nothing(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1", "r2"])
    ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10), ("r2", 10)])
    batch = BatchRecord(2, 2, 3, 20, 0.5, 1.0, 0.6)
    ledger.commit([("r1", "called"), ("r2", "no events")], {"meth.tsv": 300}, {"calls": 3}, batch)
    assert ledger.outcome("r1") == "called" and ledger.outcome("r2") == "no events"
    assert ledger.offsets() == {"meth.tsv": 300} and ledger.counters() == {"calls": 3}
    assert ledger.batch_totals()["latency_max"] == 0.6
    assert ledger.matched(10, 100) == ([], False)
    with pytest.raises(sqlite3.Error):
        ledger.commit([("r1", "again")], {"meth.tsv": 400}, {"calls": object()})  # fails half way
    assert ledger.offsets() == {"meth.tsv": 300} and ledger.counters() == {"calls": 3}
    assert ledger.batch_totals()["batches"] == 1 and ledger.read_counts()["done"] == 2


def test_the_counts_asked_at_every_commit_are_kept_across_a_reopening(tmp_path):
    """Reads done and the batches' totals are kept as they change, not counted over the run at each commit:
    a reopened ledger has them as the last one left them."""
    with Ledger(tmp_path / "state", watch_dir=tmp_path) as led:
        led.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1", "r2", "r3"])
        led.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10), ("r2", 10), ("r3", 10)])
        led.commit([("r1", "called"), ("r2", "called"), ("r1", "called")], {}, {}, BatchRecord(2, 2, 3, 20, 0.5, 1, 0.6))
        led.commit([("r2", "called"), ("r3", "no events")], {}, {}, BatchRecord(1, 1, 0, 10, 0.25, 2, 2.0))
    with Ledger(tmp_path / "state", watch_dir=tmp_path) as led:
        assert led.read_counts() == {"done": 3, "matched": 0, "waiting_for_basecalls": 0, "waiting_for_signal": 0}
        assert led.batch_totals() == {"batches": 2, "reads": 3, "bases": 30, "seconds": 0.75, "latency_sum": 3,
                                      "latency_max": 2.0}


def test_the_counts_a_commit_asks_for_read_only_the_open_reads(ledger):
    """summary.json's counts are asked at every commit: none of their queries may walk the run's reads, which a
    day's run has millions of (each query over an index of the open or the reopened reads alone)."""
    asked: list[str] = []
    ledger._db.set_trace_callback(asked.append)
    ledger.read_counts(), ledger.recovered(), ledger.batch_totals(), ledger.counters()
    ledger._db.set_trace_callback(None)
    plans = [row[-1] for sql in asked for row in ledger._db.execute("EXPLAIN QUERY PLAN " + sql)]
    on_reads = [p for p in plans if " reads" in p]
    assert on_reads and all("USING INDEX reads_matched" in p or "USING INDEX reads_waiting" in p
                            or "USING INDEX reads_superseded" in p for p in on_reads), plans
    assert not any("batches" in p for p in plans)


def test_waiting_reads_and_late_partners(ledger, tmp_path):
    ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10)])
    ledger.clock.t += 100
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r2"])
    assert [w.read_id for w in ledger.waiting(since_before=ledger.clock.t - 50)] == ["r1"]
    (w1, w2) = ledger.waiting()
    assert (w1.has_signal, w1.path.name, w2.has_signal) == (False, "a.fastq", True)
    ledger.commit([("r1", "no signal"), ("r2", "no basecall")], {}, {"records_in": 2, "skipped.no signal": 1,
                                                                       "skipped.no basecall": 1})
    assert ledger.read_counts()["done"] == 2
    reg = ledger.register_signal_file(tmp_path / "b.fast5", "fast5", 1, 1, ["r1"])
    # the late signal reopens r1: matched again, its report superseded and taken out of the counts
    assert (reg.late, reg.newly_matched) == (1, 1) and ledger.outcome("r1") is None
    assert ledger.counters() == {"records_in": 1, "skipped.no basecall": 1}
    assert ledger.read_counts() == {"done": 1, "matched": 1, "waiting_for_basecalls": 0, "waiting_for_signal": 0}
    (pick,), _ = ledger.matched(10, 100)
    assert (pick.read_id, pick.superseded, pick.signal_path.name) == ("r1", "no signal", "b.fast5")
    assert ledger.recovered() == 0
    ledger.commit([("r1", "called")], {}, {"reads_called": 1})
    assert ledger.outcome("r1") == "called" and ledger.recovered() == 1 and ledger.read_counts()["done"] == 2
    reg = ledger.register_signal_file(tmp_path / "c.fast5", "fast5", 1, 1, ["r1"])
    assert (reg.late, reg.duplicates) == (0, 1)  # once it has both files, another copy is a duplicate


def test_a_late_read_of_a_copied_bam_has_the_copy_made_again(ledger, tmp_path):
    ledger.register_basecall_file(tmp_path / "a.bam", "bam", 1, 1, [("r1", 10), ("r2", 10)])
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1"])
    ledger.commit([("r1", "called"), ("r2", "no signal")], {}, {})
    ((fid, _),) = ledger.finished_bams()
    ledger.record_modbam(fid, tmp_path / "modbam" / "a.bam")
    reg = ledger.register_signal_file(tmp_path / "b.fast5", "fast5", 1, 1, ["r2"])
    assert reg.reopened_bams == (fid,) and ledger.reads_awaiting_modbam() == {"r1", "r2"}
    assert ledger.finished_bams() == []
    ledger.commit([("r2", "called")], {}, {})
    assert [f for f, _ in ledger.finished_bams()] == [fid]


def test_a_version_1_ledger_is_upgraded_in_place(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    db = sqlite3.connect(state / "ledger.sqlite")
    db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                     "CREATE TABLE reads (id INTEGER PRIMARY KEY, read_id TEXT NOT NULL UNIQUE, signal_file INTEGER, "
                     "basecall_file INTEGER, n_bases INTEGER NOT NULL DEFAULT 0, since REAL NOT NULL, matched REAL, "
                     "outcome TEXT, batch INTEGER);"
                     "INSERT INTO reads (read_id, since, outcome) VALUES ('r1', 0, 'called');")
    db.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("watch_dir", str(tmp_path.resolve()))])
    db.commit()
    db.close()
    with Ledger(state, watch_dir=tmp_path) as led:
        assert led.outcome("r1") == "called" and led.recovered() == 0
        assert led.register_spare_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r2", 5)], use=True) == 1
    with Ledger(state, watch_dir=tmp_path) as led:
        assert led.read_counts()["done"] == 1


def test_a_spare_fastq_gives_only_the_reads_no_bam_record_was_read_for(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1", "r2", "r3"])
    assert ledger.register_spare_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10), ("r2", 20), ("r4", 5)]) == 0
    assert ledger.read_counts()["waiting_for_basecalls"] == 3 and ledger.is_known(tmp_path / "a.fastq", 0, 0)
    ledger.register_basecall_file(tmp_path / "a.bam", "bam", 1, 1, [("r1", 11)])
    assert [(p.read_id, p.n_bases, p.basecall_fmt) for p in ledger.matched(10, 1000)[0]] == [("r1", 11, "bam")]
    ledger.commit([("r1", "called")], {}, {})
    assert ledger.file_counts() == {"signal_registered": 1, "basecalls_registered": 1, "basecalls_spare": 1}
    # the other BAM cannot be read: r2 takes the FASTQ, r1 (done) and r3 (not in it) do not
    assert ledger.reject_file(tmp_path / "b.bam", "basecalls", "bam", 1, 1, "corrupt",
                              [tmp_path / "a.fastq"]) == {tmp_path / "a.fastq": 2}
    assert [(p.read_id, p.n_bases, p.basecall_path.name) for p in ledger.matched(10, 1000)[0]] == \
        [("r2", 20, "a.fastq")]
    assert ledger.read_counts()["waiting_for_signal"] == 1  # r4: now it is reported if its signal never comes
    assert ledger.file_counts()["basecalls_registered"] == 2 and ledger.use_spares() == {}


def test_reads_whose_basecall_file_fails_later_take_their_spare(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1", "r2", "r3"])
    ledger.register_basecall_file(tmp_path / "a.bam", "bam", 1, 1, [("r1", 11), ("r2", 12), ("r3", 13)])
    ledger.register_spare_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10), ("r2", 20)])
    assert [(p.spare_path.name, p.spare_fmt) for p in ledger.matched(10, 1000)[0][:2]] == [("a.fastq", "fastq")] * 2
    assert ledger.matched(10, 1000)[0][2].spare_path is None
    ledger.commit([("r1", "called")], {}, {})
    assert ledger.take_spares(["r1", "r2", "r3"]) == {tmp_path / "a.fastq": ["r2"]}  # r1 is done, r3 has none
    assert [(p.read_id, p.basecall_path.name, p.basecall_fmt, p.spare_path) for p in ledger.matched(10, 1000)[0]] == \
        [("r2", "a.fastq", "fastq", None), ("r3", "a.bam", "bam", None)]
    assert ledger.file_counts()["basecalls_registered"] == 2 and ledger.take_spares(["r2"]) == {}
    assert ledger.use_spares() == {}  # r2 has its basecalls already


def test_the_end_of_the_run_uses_spares_even_for_reads_reported_without_basecalls(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, ["r1"])
    ledger.commit([("r1", "no basecall")], {}, {"records_in": 1, "skipped.no basecall": 1})
    ledger.register_spare_file(tmp_path / "a.fastq", "fastq", 1, 1, [("r1", 10)])
    assert ledger.use_spares() == {tmp_path / "a.fastq": 1}
    assert [p.superseded for p in ledger.matched(10, 1000)[0]] == ["no basecall"] and ledger.counters() == {}


def test_files_known_and_rejected(ledger, tmp_path):
    p = tmp_path / "a.fast5"
    assert not ledger.is_known(p, 1, 1)
    ledger.reject_file(p, "signal", "fast5", 1, 1, "truncated")
    assert ledger.is_known(p, 1, 1) and not ledger.is_known(p, 2, 2)
    assert ledger.rejected_files() == [(str(p), "signal", "truncated")]
    ledger.register_signal_file(p, "fast5", 2, 2, ["r1"])
    assert ledger.is_known(p, 3, 3)  # registered: whatever happens to it later
    assert ledger.rejected_files() == []
    assert ledger.file_counts() == {"signal_registered": 1}


def test_one_daemon_per_state_folder(tmp_path, no_leaks):
    with Ledger(tmp_path / "s", watch_dir=tmp_path):
        with pytest.raises(LedgerError, match="another streamer daemon"):
            Ledger(tmp_path / "s", watch_dir=tmp_path)
    with Ledger(tmp_path / "s", watch_dir=tmp_path):  # the lock goes with the first
        pass


def test_state_folder_belongs_to_one_run(tmp_path):
    (tmp_path / "a").mkdir()
    Ledger(tmp_path / "s", watch_dir=tmp_path).close()
    with pytest.raises(LedgerError, match="belongs to the run in"):
        Ledger(tmp_path / "s", watch_dir=tmp_path / "a")


# ---------------------------------------------------------------------------- outputs


HEADERS = {"meth.tsv": "h1\th2\n", "skipped.tsv": "read_id\treason\tdetail\n"}


def test_outputs_start_with_headers_and_append(tmp_path, no_leaks):
    out = Outputs(tmp_path / "out", HEADERS, {})
    assert out.fresh == {"meth.tsv": 6, "skipped.tsv": 22}
    offsets = out.append({"meth.tsv": ["a\tb\n", "c\td\n"], "skipped.tsv": []})
    assert offsets == {"meth.tsv": 14, "skipped.tsv": 22}
    out.close()
    assert (tmp_path / "out" / "meth.tsv").read_text() == "h1\th2\na\tb\nc\td\n"


def test_crash_between_write_and_commit_is_repaired(tmp_path, no_leaks):
    """Rows of a batch that was written but never committed are cut off at the next start."""
    with Ledger(tmp_path / "state", watch_dir=tmp_path) as led:
        out = Outputs(tmp_path / "out", HEADERS, led.offsets())
        led.commit([], out.fresh, {})
        led.commit([], out.append({"meth.tsv": ["batch1\n"]}), {})
        out.append({"meth.tsv": ["batch2\n"]})  # ... and the process dies before the commit
        out.close()
    with Ledger(tmp_path / "state", watch_dir=tmp_path) as led:
        out = Outputs(tmp_path / "out", HEADERS, led.offsets())
        assert out.fresh == {}
        out.append({"meth.tsv": ["batch2 again\n"]})
        out.close()
    assert (tmp_path / "out" / "meth.tsv").read_text() == "h1\th2\nbatch1\nbatch2 again\n"


def test_outputs_refuse_what_the_ledger_does_not_explain(tmp_path, no_leaks):
    d = tmp_path / "out"
    d.mkdir()
    (d / "meth.tsv").write_text("h1\th2\nold rows\n")
    with pytest.raises(LedgerError, match="no record of it"):
        Outputs(d, HEADERS, {})
    (d / "meth.tsv").write_text("h1\t")  # a header cut short by a crash is fine
    Outputs(d, HEADERS, {}).close()
    with pytest.raises(LedgerError, match="shorter than"):
        Outputs(d, HEADERS, {"meth.tsv": 100, "skipped.tsv": 22})
    (d / "skipped.tsv").unlink()
    with pytest.raises(LedgerError, match="missing"):
        Outputs(d, HEADERS, {"meth.tsv": 6, "skipped.tsv": 22})


def test_write_atomic(tmp_path):
    p = tmp_path / "summary.json"
    write_atomic(p, "{}\n")
    write_atomic(p, '{"a": 1}\n')
    assert p.read_text() == '{"a": 1}\n' and sorted(x.name for x in tmp_path.iterdir()) == ["summary.json"]


def test_matched_after_a_pick_passes_over_the_batches_in_flight_and_sees_every_write(ledger, tmp_path):
    ledger.register_signal_file(tmp_path / "a.fast5", "fast5", 1, 1, [f"r{i}" for i in range(6)])
    ledger.register_basecall_file(tmp_path / "a.fastq", "fastq", 1, 1, [(f"r{i}", 10) for i in range(4)])
    first, _ = ledger.matched(2, 10_000)
    second, _ = ledger.matched(2, 10_000, after=first[-1])  # the first batch is in flight
    assert [p.read_id for p in first + second] == ["r0", "r1", "r2", "r3"]
    assert ledger.matched(2, 10_000, after=second[-1]) == ([], False)
    ledger.clock.t += 1
    ledger.register_basecall_file(tmp_path / "b.fastq", "fastq", 1, 1, [("r4", 10), ("r5", 10)])  # a write: asked anew
    third, full = ledger.matched(2, 10_000, after=second[-1])
    assert [p.read_id for p in third] == ["r4", "r5"] and full



def _one_file_and_its_batch(state, watch, n_reads: int) -> int:
    """The statements a file's signal and basecalls, its batch's pick and its commit took."""
    statements: list[str] = []
    with Ledger(state, watch_dir=watch, clock=lambda: 1_764_245_926.123_456_7) as ledger:
        ledger._db.set_trace_callback(statements.append)
        ids = [f"r{i}" for i in range(n_reads)]
        ledger.register_signal_file(watch / "a.pod5", "pod5", 1, 1, ids)
        ledger.register_basecall_file(watch / "a.bam", "bam", 1, 1, [(r, 10) for r in ids])
        assert ledger.open_reads_of(watch / "a.bam") == set(ids)
        picks, _ = ledger.matched(n_reads, 10**9)
        outcomes = [(p.read_id, "called" if i % 2 else "low_mapq") for i, p in enumerate(picks)]
        ledger.commit(outcomes + [("r0", "called")], {"meth.tsv": 10}, {"called": n_reads // 2})
        taken = len(statements)
        assert [p.read_id for p in picks] == ids and picks[-1].matched == 1_764_245_926.123_456_7  # every digit
        assert ledger.matched(n_reads, 10**9, after=picks[0]) == ([], False)
        assert ledger.read_counts()["done"] == n_reads
        assert (ledger.outcome("r0"), ledger.outcome("r1")) == ("low_mapq", "called")  # a read's first outcome
    return taken


def test_a_file_and_a_batch_take_as_many_statements_whatever_their_reads(tmp_path):
    """Each statement's steps let go of the GIL: a file's reads go in, and a batch's come out and are
    committed, in statements whose number does not grow with the reads (`benchmarks/bench_ledger.py`)."""
    assert _one_file_and_its_batch(tmp_path / "s3", tmp_path, 3) == _one_file_and_its_batch(tmp_path / "s300",
                                                                                           tmp_path, 300)
