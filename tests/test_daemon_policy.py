"""The daemon's decisions on their own: no files, no threads, the clock passed in."""

from __future__ import annotations

from pathlib import Path

from streamer.daemon.policy import (
    ALL_FILES_IN,
    CALLED,
    PIPELINE_ERROR,
    EndOfRun,
    JoinTimeout,
    account,
    batch_due,
    files_to_account,
    missing_partner,
    recovered_row,
    skip_counters,
    skip_row,
)
from streamer.skips import Skip, Skipped
from streamer.summary import BatchOutcome

RUN_A, RUN_B = Path("/live/a"), Path("/live/b")


def test_a_full_batch_goes_at_once_a_partial_one_when_nothing_comes_or_it_waited():
    assert not batch_due(0, False, False, 100.0, 5.0)  # nothing matched
    assert batch_due(3, True, True, 0.0, 5.0)  # full
    assert not batch_due(3, False, True, 1.0, 5.0)  # a file is on its way, and it is young
    assert batch_due(3, False, True, 5.0, 5.0)  # waited max_wait
    assert batch_due(3, False, False, 0.0, 5.0)  # nothing on its way
    assert not batch_due(3, False, False, 1.0, 5.0, stages_busy=True)  # it grows while the stages are busy
    assert batch_due(3, False, False, 5.0, 5.0, stages_busy=True)  # until its oldest read waited max_wait
    assert batch_due(3, True, True, 0.0, 5.0, stages_busy=True)  # a full batch goes, busy or not


def test_a_run_ends_on_every_final_summary_plus_grace_of_quiet():
    end = EndOfRun(grace=10.0, idle_timeout=0)
    assert end.check(now=100.0, last_activity=50.0, run_roots={RUN_A, RUN_B}, files_pending=False) is None
    end.final_summary(RUN_A, 100.0)
    assert end.check(200.0, 150.0, {RUN_A, RUN_B}, False) is None  # run b has not finished
    end.final_summary(RUN_B, 200.0)
    assert end.check(205.0, 150.0, {RUN_A, RUN_B}, False) is None  # within the grace period
    assert end.check(211.0, 209.0, {RUN_A, RUN_B}, False) is None  # a file landed 2 s ago
    ending = end.check(221.0, 209.0, {RUN_A, RUN_B}, False)
    assert ending is not None and ending.run_over and ending.reason == "final_summary"


def test_the_files_to_account_are_those_a_run_wrote_less_those_left_alone():
    assert files_to_account({"pod5": 12, "fastq": 24, "bam": 0}, {"fastq": 4, "fast5": 3}) == \
        {"pod5": 12, "fastq": 20, "bam": 0}
    assert files_to_account({"fastq": 2}, {"fastq": 5}) == {"fastq": 0}
    assert files_to_account({}, {"fastq": 5}) == {}


def test_a_run_ends_once_every_file_its_final_summaries_count_is_accounted_for():
    end = EndOfRun(grace=120.0, idle_timeout=0)
    end.final_summary(RUN_A, 100.0, {"pod5": 2, "bam": 2})
    assert end.counting() == [RUN_A]
    assert end.check(100.0, 99.0, {RUN_A}, False, {RUN_A: {"pod5": 2, "bam": 1}}) is None  # a BAM still to come
    assert end.check(100.0, 99.0, {RUN_A}, True, {RUN_A: {"pod5": 2, "bam": 2}}) is None  # a file still settling
    assert end.check(100.0, 99.0, {RUN_A, RUN_B}, False, {RUN_A: {"pod5": 2, "bam": 2}}) is None  # run b goes on
    ending = end.check(100.5, 100.0, {RUN_A}, False, {RUN_A: {"pod5": 2, "bam": 3, "fastq": 1}})
    assert ending is not None and ending.run_over and ending.reason == ALL_FILES_IN


def test_the_grace_remains_the_bound_where_files_are_not_counted_or_never_all_come():
    end = EndOfRun(grace=10.0, idle_timeout=0)
    end.final_summary(RUN_A, 100.0, {"pod5": 2})
    end.final_summary(RUN_B, 100.0)  # a summary without counts
    assert end.counting() == [RUN_A]
    assert end.check(105.0, 100.0, {RUN_A, RUN_B}, False, {RUN_A: {"pod5": 2}}) is None
    assert end.check(110.0, 100.0, {RUN_A, RUN_B}, False, {RUN_A: {"pod5": 2}}).reason == "final_summary"
    short = EndOfRun(grace=10.0, idle_timeout=0)
    short.final_summary(RUN_A, 100.0, {"pod5": 5})  # more than ever come
    assert short.check(105.0, 100.0, {RUN_A}, False, {RUN_A: {"pod5": 2}}) is None
    assert short.check(110.0, 100.0, {RUN_A}, False, {RUN_A: {"pod5": 2}}).reason == "final_summary"
    short.final_summary(RUN_A, 120.0, {})  # a later summary of that run without counts: the grace decides
    assert short.counting() == []


def test_idle_timeout_waits_for_pending_files_and_a_stop_file_ends_even_a_followed_run():
    end = EndOfRun(grace=10.0, idle_timeout=60.0)
    assert end.check(100.0, 30.0, {RUN_A}, files_pending=True) is None
    ending = end.check(100.0, 30.0, {RUN_A}, files_pending=False)
    assert ending.run_over and ending.reason == "no new file for 60 s"
    follow = EndOfRun(grace=0.0, idle_timeout=1.0, follow=True)
    follow.final_summary(RUN_A, 0.0)
    assert follow.check(1000.0, 0.0, {RUN_A}, False) is None
    follow.stop_file_found()
    assert follow.check(1000.0, 0.0, {RUN_A}, False).reason == "STOP file"


def test_join_timeouts_are_looked_for_after_the_timeout_then_every_tenth_of_it():
    timer = JoinTimeout(timeout=30.0, started=0.0)
    assert not timer.due(29.0)
    assert timer.due(30.0)
    assert not timer.due(32.0)  # next look 3 s later
    assert timer.due(33.0)
    slow = JoinTimeout(timeout=3600.0, started=0.0)
    assert slow.due(3600.0) and not slow.due(3659.0) and slow.due(3660.0)  # at most a minute apart


def test_reads_missing_their_partner_are_skipped_with_the_file_they_have():
    skipped = missing_partner([("r1", True, Path("a.pod5")), ("r2", False, Path("b.fastq"))], "within 30 s")
    assert [(s.read_id, s.reason) for s in skipped] == [("r1", Skip.NO_BASECALL), ("r2", Skip.NO_SIGNAL)]
    assert skipped[0].detail == "signal in a.pod5; no basecalls within 30 s"
    assert skip_counters(skipped) == {"records_in": 2, "skipped.no basecall": 1, "skipped.no signal": 1}


def test_a_read_is_called_when_one_record_came_through_else_its_first_reason():
    # r1: two records, one skipped by the stages; r2: skipped before the stages; r3: the pipeline
    # raised on it alone; r4: both records skipped by the stages
    stage_skipped = [Skipped("r1", Skip.NO_CPG), Skipped("r4", Skip.QC_FAILED), Skipped("r4", Skip.NO_CPG)]
    skipped = [Skipped("r2", Skip.LOW_MAPQ), *stage_skipped]
    outcome = BatchOutcome(records_in=6, records_called=1, bases=900, calls=12, skipped=skipped,
                           failed={"r3": "IndexError: 7"}, records_lost=1)  # fmt: skip
    got = account(["r1", "r2", "r3", "r4"], ["r1", "r1", "r3", "r4", "r4"], stage_skipped, outcome)
    assert got.outcomes == [("r1", CALLED), ("r2", "low mapq"), ("r3", PIPELINE_ERROR), ("r4", "qc failed")]
    assert got.called == {"r1"}
    assert got.counters == {"records_in": 6, "reads_called": 1, "records_called": 1, "bases": 900, "calls": 12,
                            "skipped.low mapq": 1, "skipped.no cpg": 2, "skipped.qc failed": 1,
                            f"skipped.{PIPELINE_ERROR}": 1}  # fmt: skip


def test_skipped_rows_are_one_line_each_and_name_the_late_file():
    assert skip_row("r1", "no signal", "a\tb\nc") == "r1\tno signal\ta b c\n"
    row = recovered_row("r1", "no signal", Path("late.pod5"), Path("calls.fastq"))
    assert row.startswith("r1\trecovered\treported 'no signal' earlier; late.pod5 landed later")
    assert "calls.fastq landed later" in recovered_row("r1", "no basecall", Path("x.pod5"), Path("calls.fastq"))
