"""Replay: a finished run re-enacted as MinKNOW writes one, at a scaled pace."""

from __future__ import annotations

import gzip

import pysam
import pytest

from streamer.io.fast5 import fast5_read_ids, read_fast5
from streamer.daemon.replay import Landing, Replayer, ReplayOptions, load_source, plan
from streamer.daemon.runfolder import Kind, RunLayout

from daemon_support import no_leaks  # noqa: F401


@pytest.fixture(scope="module")
def source(ecoli):
    return load_source(ecoli)


def test_source_has_reads_in_end_time_order(source):
    assert len(source.reads) == 8 and len(source.basecalls) == 8
    ends = [r.end_s for r in source.reads]
    assert ends == sorted(ends)
    assert source.bam_header is not None and sum(map(len, source.bam_records.values())) == 9


def test_plan_paces_batches(source):
    t0 = min(r.start_s for r in source.reads)
    fast = plan(source, ReplayOptions(speed=100, batch_reads=3, bam=False))
    assert [(x.batch, x.kind) for x in fast] == [(0, "signal"), (0, "fastq"), (1, "signal"), (1, "fastq"),
                                                 (2, "signal"), (2, "fastq")]
    assert fast[-1].at == pytest.approx((source.reads[-1].end_s - t0) / 100)
    lagged = plan(source, ReplayOptions(interval=2, batch_reads=4, basecall_lag=-1))
    assert lagged == [Landing(0, 0, "signal"), Landing(0, 0, "fastq"), Landing(0, 0, "bam"),
                      Landing(1, 1, "fastq"), Landing(1, 1, "bam"), Landing(2, 1, "signal")]


def test_replay_writes_a_minknow_run(source, ecoli, tmp_path, no_leaks):
    fake = FakeTime()
    r = Replayer(source, tmp_path, ReplayOptions(speed=1000, batch_reads=3), sleep=fake.sleep, clock=fake.clock)
    run = r.run()
    assert run.parent == tmp_path and run.name.endswith(f"_{source.run_id[:8]}")
    stems = [r.stem(i) for i in range(3)]
    for sub, ext in (("fast5_pass", "fast5"), ("fastq_pass", "fastq.gz"), ("bam_pass", "bam")):
        assert sorted(p.name for p in (run / sub).iterdir()) == [f"{s}.{ext}" for s in stems]
    assert not (run / ".replay").exists()
    assert len(list(run.glob("final_summary_*.txt"))) == 1 and len(list(run.glob("sequencing_summary_*"))) == 1
    assert fake.t == pytest.approx(r_last(source) / 1000)  # the last batch lands when its last read ended
    layout = RunLayout(tmp_path)
    kinds = sorted(layout.classify(p).kind.value for p in run.rglob("*") if p.is_file() and layout.classify(p))
    assert kinds.count(Kind.SIGNAL.value) == 3 and kinds.count(Kind.FINAL_SUMMARY.value) == 1
    # the signal is the source's, sample for sample, read through the FAST5 reader
    f5 = run / "fast5_pass" / f"{stems[0]}.fast5"
    ids = fast5_read_ids(f5)
    assert ids == sorted(r.read_id for r in source.reads[:3])
    src = next(r for r in source.reads if r.read_id == ids[0])
    a, b = read_fast5(f5, ids[0]), read_fast5(src.signal_file, ids[0])
    assert (a.raw == b.raw).all() and (a.offset, a.range, a.digitisation) == (b.offset, b.range, b.digitisation)
    with gzip.open(run / "fastq_pass" / f"{stems[0]}.fastq.gz", "rt") as fh:
        assert fh.readline().startswith(f"@{source.reads[0].read_id} runid=")
    with pysam.AlignmentFile(str(run / "bam_pass" / f"{stems[0]}.bam")) as fh:
        assert {rec.query_name for rec in fh} == set(ids)


class FakeTime:
    def __init__(self):
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += s

    def clock(self) -> float:
        return self.t


def r_last(source):
    return source.reads[-1].end_s - min(r.start_s for r in source.reads)


def test_replay_in_place_without_bam(source, tmp_path, no_leaks):
    opts = ReplayOptions(speed=0, batch_reads=8, mode="inplace", write_seconds=0.01, bam=False, compression="gzip")
    run = Replayer(source, tmp_path, opts).run()
    assert not (run / "bam_pass").exists()
    assert len(fast5_read_ids(next((run / "fast5_pass").iterdir()))) == 8


def test_replay_command(ecoli, tmp_path, capsys):
    from streamer.cli import main

    assert main(["replay", str(ecoli), str(tmp_path), "--speed", "0", "--batch-size", "5", "--no-bam"]) == 0
    run = tmp_path / capsys.readouterr().out.strip()
    assert len(list((run / "fast5_pass").iterdir())) == 2
